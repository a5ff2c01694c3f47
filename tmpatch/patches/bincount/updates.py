"""Wrappers (and two edits) of the release's update functions: counts without the positions
that are ignored or not valid classes, with no boolean removal and no device read.

In a recorded update (``counting.recorded()``) each wrapper finds the positions to leave
out (ignored, marked by the formatter edit; invalid: a target or label prediction
outside the valid classes, reported at compute) and hands the release's own function
inputs in which those positions cannot count:

* where the release counts with ``_bincount`` (confusion matrices, multiclass stat
  scores), their target becomes -1 and their prediction 0, so their codes are
  negative, and ``_bincount`` (which the wrapper vouches to) leaves them out;
* the micro stat scores and the binned curves count without ``_bincount`` as well (a
  loop over thresholds for large batches): there the positions get a fixed value
  (curves: score NaN and target 0, below every threshold, -inf included) and the wrapper
  subtracts what they added from the release's result, an exact integer correction;
* the multilabel update functions remove negative codes themselves (``codes[codes >=
  0]``): that statement is edited into :func:`multilabel_codes`, which marks the
  positions to leave out with code -1 and leaves every other code as it was.

Outside a recorded update every function is the release's, unchanged.
"""
from __future__ import annotations

import math
from types import ModuleType
from typing import Any, Callable, Dict, Optional, Tuple

from tmpatch.patches.bincount.counting import Update, current, not_binary, outside, recorded
from tmpatch.spec import Edit, Rewrite, gated


def _labels(update: Update, preds: Any) -> bool:
    """Whether ``preds`` are the formatter's labels of scores (argmax of one score per class, or
    a threshold): in range, so no check, and no change for a left-out position, whose target
    becomes -1."""
    return update.labels and not preds.is_floating_point()


def _left_out(update: Update, invalid: Any) -> Any:
    """Report the invalid positions that are not ignored; return every position to leave out."""
    ignored, update.ignored = update.ignored, None
    if ignored is None:
        update.bad(invalid)
        return invalid
    update.bad(invalid & ~ignored)
    return ignored | invalid


def build_stat_scores_update(module: ModuleType) -> Callable[..., Any]:
    """``_multiclass_stat_scores_update``, ``top_k=1`` and ``"global"`` (the one-hot
    branches, which neither remove nor count with ``_bincount``, stay the release's)."""
    import torch

    where = torch.where

    @gated(current)
    def _multiclass_stat_scores_update(
        original: Callable, preds: Any, target: Any, num_classes: int, top_k: int = 1,
        average: Optional[str] = "macro", multidim_average: str = "global", ignore_index: Optional[int] = None,
    ) -> Tuple[Any, Any, Any, Any]:
        update = recorded()
        if update is None or multidim_average == "samplewise" or top_k != 1 or type(num_classes) is not int:
            return original(preds, target, num_classes, top_k, average, multidim_average, ignore_index)
        labels = _labels(update, preds)
        invalid = outside(target, num_classes)
        if ignore_index is not None:
            update.ignored = target == ignore_index
        out = _left_out(update, invalid if labels else invalid | outside(preds, num_classes))
        target, preds = where(out, -1, target.long()), preds.long() if labels else where(out, 0, preds.long())
        if average == "micro":  # each left-out position added one false positive and one false negative
            tp, fp, tn, fn = original(preds, target, num_classes, top_k, average, multidim_average, None)
            n = out.sum()
            return tp, fp - n, tn - (num_classes - 2) * n, fn - n
        update.vouch = True
        return original(preds, target, num_classes, top_k, average, multidim_average, None)

    return _multiclass_stat_scores_update


def build_binary_confusion_update(module: ModuleType) -> Callable[..., Any]:
    """``_binary_confusion_matrix_update(preds, target)``: codes ``2 * target + preds``."""
    import torch

    where = torch.where

    @gated(current)
    def _binary_confusion_matrix_update(original: Callable, preds: Any, target: Any) -> Any:
        update = recorded()
        if update is None:
            return original(preds, target)
        labels = _labels(update, preds)  # thresholded scores: a left-out code 2 * target + preds is negative as it is
        invalid = not_binary(target)
        out = _left_out(update, invalid if labels else invalid | not_binary(preds))
        update.vouch = True
        return original(preds if labels else where(out, 0, preds.long()), where(out, -1, target.long()))

    return _binary_confusion_matrix_update


def build_multiclass_confusion_update(module: ModuleType) -> Callable[..., Any]:
    """``_multiclass_confusion_matrix_update(preds, target, num_classes)``: codes
    ``target * num_classes + preds``."""
    import torch

    where = torch.where

    @gated(current)
    def _multiclass_confusion_matrix_update(original: Callable, preds: Any, target: Any, num_classes: int) -> Any:
        update = recorded()
        if update is None or type(num_classes) is not int or preds.shape != target.shape:
            return original(preds, target, num_classes)
        labels = _labels(update, preds)  # argmax labels: a left-out code target * n + preds is negative as it is
        invalid = outside(target, num_classes)
        out = _left_out(update, invalid if labels else invalid | outside(preds, num_classes))
        update.vouch = True
        return original(preds.long() if labels else where(out, 0, preds.long()), where(out, -1, target.long()),
                        num_classes)

    return _multiclass_confusion_matrix_update


def build_binary_curve_update(module: ModuleType) -> Callable[..., Any]:
    """``_binary_precision_recall_curve_update(preds, target, thresholds)``, binned: left-out
    positions score NaN with target 0 (a true negative at every threshold, ``-inf``
    included: ``NaN >= t`` is false), then come off ``[:, 0, 0]``."""
    import torch

    where = torch.where

    @gated(current)
    def _binary_precision_recall_curve_update(original: Callable, preds: Any, target: Any, thresholds: Any) -> Any:
        update = recorded()
        if update is None or thresholds is None:
            return original(preds, target, thresholds)
        out = _left_out(update, not_binary(target))
        state = original(where(out, math.nan, preds), where(out, 0, target), thresholds)
        state[:, 0, 0] -= out.sum()
        return state

    return _binary_precision_recall_curve_update


def _multiclass_curve(average: bool) -> Callable[[ModuleType], Callable[..., Any]]:
    """``_multiclass_precision_recall_curve_update``, binned; ``average`` (1.3.0+): micro
    flattens (the formatter one-hot encoded the target, the rows come ``num_classes``
    at a time). A left-out row scores NaN for every class with target 0: a false
    negative of class 0 and a true negative of the others, at every threshold."""

    def build(module: ModuleType) -> Callable[..., Any]:
        import torch

        where = torch.where

        def run(original: Callable, preds: Any, target: Any, num_classes: int, thresholds: Any,
                extra: Tuple[Any, ...]) -> Any:
            update = recorded()
            if update is None or thresholds is None or type(num_classes) is not int:
                return original(preds, target, num_classes, thresholds, *extra)
            if extra and extra[0] == "micro":
                if update.ignored is None and update.drop is None:
                    return original(preds, target, num_classes, thresholds, *extra)  # nothing to leave out
                rows = update.ignored if update.ignored is not None else torch.zeros_like(target[::num_classes],
                                                                                         dtype=torch.bool)
                if update.drop is not None:
                    rows = rows | update.drop
                update.ignored = update.drop = None
                out = rows.unsqueeze(1).expand(-1, num_classes).reshape(-1)
                state = original(where(out, math.nan, preds), where(out, 0, target), num_classes, thresholds, *extra)
                state[:, 0, 0] -= out.sum()
                return state
            out = _left_out(update, outside(target, num_classes))
            state = original(where(out.unsqueeze(1), math.nan, preds), where(out, 0, target), num_classes,
                             thresholds, *extra)
            n = out.sum()
            state[:, 0, 1, 0] -= n
            state[:, 1:, 0, 0] -= n
            return state

        if average:
            @gated(current)
            def _multiclass_precision_recall_curve_update(original: Callable, preds: Any, target: Any,
                                                          num_classes: int, thresholds: Any,
                                                          average: Optional[str] = None) -> Any:
                return run(original, preds, target, num_classes, thresholds, (average,))
        else:
            @gated(current)
            def _multiclass_precision_recall_curve_update(original: Callable, preds: Any, target: Any,
                                                          num_classes: int, thresholds: Any) -> Any:
                return run(original, preds, target, num_classes, thresholds, ())

        return _multiclass_precision_recall_curve_update

    return build


build_multiclass_curve_update = _multiclass_curve(average=False)
build_multiclass_curve_update_average = _multiclass_curve(average=True)


# -- the multilabel update functions: their removal of negative codes, edited -------------
def multilabel_codes(codes: Any, preds: Any, target: Any, fill: int, scores: Any = None) -> Any:
    """``codes[codes >= 0]`` (the release), or in a recorded update every code, with -1 for
    the entries to leave out: ignored ones (the formatter set preds, or the curve's
    ``scores``, and target to ``fill``) and invalid ones (target, or label ``preds`` when
    given, not 0 or 1; reported). A target equal to ``fill`` counts as ignored where the
    preds cannot tell (thresholded preds are bool: the fill became True there)."""
    update = recorded()
    if update is None:
        return codes[codes >= 0]
    invalid = not_binary(target) if preds is None else not_binary(target) | not_binary(preds)
    ignored = target == fill
    marks = scores if scores is not None else preds
    if marks is not None and (marks.is_floating_point() or marks.dtype == target.dtype):
        ignored &= marks == fill  # a target of that value not marked by the formatter is invalid
    update.bad(invalid & ~ignored)
    if codes.dim() == invalid.dim() + 1:  # the curve's codes: one per threshold
        invalid = invalid.unsqueeze(-1).expand_as(codes)
    else:  # the confusion matrix's codes, flattened
        invalid = invalid.reshape(codes.shape)
    update.vouch = True
    return codes.masked_fill(invalid, -1).flatten()


def _names(module: ModuleType) -> Dict[str, Any]:
    return {"_tmpatch_multilabel_codes": multilabel_codes}


_NEGATIVES = "unique_mapping = unique_mapping[unique_mapping >= 0]\n"

MULTILABEL_CONFUSION = Rewrite(
    (Edit(_NEGATIVES, "unique_mapping = _tmpatch_multilabel_codes(unique_mapping, preds, target, -4 * num_labels)"),),
    _names,
)
MULTILABEL_CURVE = Rewrite(
    (Edit(_NEGATIVES, "unique_mapping = _tmpatch_multilabel_codes(unique_mapping, None, target, "
                      "-4 * num_labels * len_t, preds)"),),
    _names,
)
