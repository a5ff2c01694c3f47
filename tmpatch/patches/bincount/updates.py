"""The release's code-making statements, edited, and the update wrappers of the loops.

In a recorded update (``counting.recorded()``) the statements that turn classes into the
codes ``_bincount`` counts (and, for multilabel functions, remove the negative ones) are
replaced (:mod:`tmpatch.engine.rewrite`) by helpers that make the same codes for every valid
position and, in the same kernels, codes outside the count's bins for every position to
leave out (ignored, or not a valid class): the target is clamped to one value past each
end of its classes, and the codes are made from it with the release's arithmetic folded
into one op or a table lookup (tables made once per device, ``counting.table``). The
count (``counting.build_bincount``) leaves those codes out. The report's evidence is the
clamped target (or the codes) itself, counted at compute (``deferred``), less the
positions the formatter kept out (``ignore_index``). An update launches no more kernels
than the release's (``benchmarks/kernel_counts.py``):

* multiclass codes ``target * n + preds``: ``add(preds, clamp(target, -1, n), alpha=n)``
  for label predictions of scores (argmax: valid classes); user label predictions index
  a table of codes with both clamped classes;
* binary codes ``2 * target + preds`` likewise; multilabel ``2 * target + preds + 4 * label``
  and the binned curves' codes index a table by the clamped target (a threshold's and a
  label's offsets included), plus the thresholded predictions;
* stat scores derive ``tp, fp, fn, tn`` from the confusion matrix in one kernel fewer
  (``tn = total - colsum - fn``), and the micro average counts the valid positions and
  the hits itself (``fp = fn = valid - tp``, ``tn = tp + (n - 2) * valid``).

Integer arithmetic throughout: the states are the release's on the valid positions, bit for
bit. Inputs the lean forms do not take (float classes, narrow integer types, large tables)
take a masked form with the same results. The loops of large curves (above 50,000 scores,
or 10^6 scores x classes) count without ``_bincount``: their wrappers hand the loop
inputs in which the positions to leave out score NaN with target 0 (below every
threshold) and take their count off the result, an exact integer correction. Outside a
recorded update every function is the release's, unchanged.
"""
from __future__ import annotations

import math
from types import ModuleType
from typing import Any, Callable, Dict, Optional, Tuple

from tmpatch.patches.bincount.counting import (
    Update,
    _wide_int,
    current,
    fill_wide,
    not_binary,
    outside,
    recorded,
    table,
)
from tmpatch.runtime import deferred
from tmpatch.spec import Edit, Rewrite, gated

#: a table of codes is used up to this many entries (int64); above, the masked form
TABLE_CAP = 1 << 20

#: label predictions given by the user: a table of both classes' codes up to this many classes
PAIR_CLASSES = 254

_SUM, _FALSE = deferred.SUM, deferred.FALSE


def _torch() -> Any:
    import torch

    return torch


# -- tables (made once per device) --------------------------------------------------------
def _pairs(n: int, device: Any) -> Any:
    """``(n + 2) x (n + 2)``: ``[t, p] -> t * n + p`` for classes ``t, p`` in ``[0, n)``, ``n * n``
    for ``n`` or ``-1`` (the last row and column) in either."""
    torch = _torch()

    def make() -> Any:
        classes = torch.arange(n + 2, dtype=torch.int64, device=device)
        codes = classes.unsqueeze(1) * n + classes
        bad = classes >= n
        return codes.masked_fill(bad.unsqueeze(1) | bad, n * n)

    return table("pairs", (n,), device, make)


def _binary_pairs(device: Any) -> Any:
    """``4 x 4``: ``[t, p] -> 2 * t + p`` for ``t, p`` in ``{0, 1}``, 4 for ``2`` or ``-1``."""
    return _pairs(2, device)


def _threshold_offsets(len_t: int, device: Any) -> Any:
    """``4 x len_t`` (binary curve): ``[t, k] -> 2 * t + 4 * k`` for ``t`` in ``{0, 1}``;
    ``4 * len_t`` for ``t`` of 2 or -1 (the last two rows)."""
    torch = _torch()

    def make() -> Any:
        steps = 4 * torch.arange(len_t, dtype=torch.int64, device=device)
        out = torch.full((4, len_t), 4 * len_t, dtype=torch.int64, device=device)
        out[0] = steps
        out[1] = steps + 2
        return out

    return table("threshold_offsets", (len_t,), device, make)


def _class_offsets(n: int, len_t: int, device: Any) -> Any:
    """``(n + 2) x n x len_t`` (multiclass curve): ``[t, c, k] -> 2 * [t == c] + 4 * c + 4 * n * k``
    for a class ``t``; ``4 * n * len_t`` for ``t`` of ``n`` or ``-1`` (the last two rows)."""
    torch = _torch()

    def make() -> Any:
        rows = torch.arange(n + 2, device=device).view(-1, 1, 1)
        cls = torch.arange(n, device=device).view(1, -1, 1)
        step = torch.arange(len_t, device=device).view(1, 1, -1)
        out = 2 * (rows == cls).long() + 4 * cls + 4 * n * step
        return out.masked_fill(rows >= n, 4 * n * len_t)

    return table("class_offsets", (n, len_t), device, make)


def _label_offsets(num_labels: int, len_t: int, device: Any) -> Any:
    """``4 x L x len_t`` (multilabel curve; ``len_t`` 1 for the confusion matrix):
    ``[t, l, k] -> 2 * t + 4 * l + 4 * L * k`` for ``t`` in ``{0, 1}``; ``4 * L * len_t`` for
    ``t`` of 2 or -1 (the last two rows)."""
    torch = _torch()

    def make() -> Any:
        rows = torch.arange(4, device=device).view(-1, 1, 1)
        label = torch.arange(num_labels, device=device).view(1, -1, 1)
        step = torch.arange(len_t, device=device).view(1, 1, -1)
        out = 2 * rows + 4 * label + 4 * num_labels * step
        return out.masked_fill(rows >= 2, 4 * num_labels * len_t)

    return table("label_offsets", (num_labels, len_t), device, make)


def _label_pairs(num_labels: int, device: Any) -> Any:
    """``4 x 4 x L`` (multilabel confusion matrix, label predictions):
    ``[t, p, l] -> 2 * t + p + 4 * l``; ``4 * L`` for a ``t`` or ``p`` of 2 or -1."""
    torch = _torch()

    def make() -> Any:
        values = torch.arange(4, device=device)
        label = torch.arange(num_labels, device=device).view(1, 1, -1)
        out = 2 * values.view(-1, 1, 1) + values.view(1, -1, 1) + 4 * label
        bad = (values >= 2).view(-1, 1, 1) | (values >= 2).view(1, -1, 1)
        return out.masked_fill(bad, 4 * num_labels)

    return table("label_pairs", (num_labels,), device, make)


def _labels_arange(num_labels: int, device: Any) -> Any:
    torch = _torch()
    return table("arange", (num_labels,), device, lambda: torch.arange(num_labels, device=device))


# -- helpers -------------------------------------------------------------------------------
def _labels(update: Update, preds: Any) -> bool:
    """Whether ``preds`` are the formatter's labels of scores (argmax of one score per class, or
    a threshold): valid classes, so no check."""
    return update.labels and not preds.is_floating_point()


def _ignore_index(update: Update) -> Any:
    """The metric's ``ignore_index`` (None when it has none). An attribute read: torch.compile
    guards that attribute alone (a read of ``__dict__`` would guard every entry, the update
    count included, and recompile each step)."""
    return getattr(update.metric, "ignore_index", None)


def _masked(update: Update, invalid: Any) -> Any:
    """Every position to leave out (``invalid``, the formatter's ignored and the skipped
    ones); reports the invalid ones that are not left out otherwise."""
    keep, skip, update.keep, update.skip = update.keep, update.skip, None, None
    out = invalid
    if keep is not None:
        out = out | ~keep
        invalid = invalid & keep
    if skip is not None:
        out = out | skip
        invalid = invalid & ~skip
    update.bad(invalid)
    return out


def class_codes(preds: Any, target: Any, num_classes: Any, ignore_index: Any = None) -> Any:
    """``target * num_classes + preds`` (``_multiclass_confusion_matrix_update``,
    ``_multiclass_stat_scores_update``) in a recorded update: codes in
    ``[-(n * n + n), n * n + n)``, those of positions to leave out outside ``[0, n * n)``
    (``ignore_index``: the stat scores' own, whose removal the edit replaces). Outside a
    recorded update, for int64 classes (and no removal to make first), the release's codes
    in one op (``add`` with ``alpha``: the same int64 arithmetic); else None (the release's
    statement runs)."""
    update = recorded()
    if type(num_classes) is not int or not 1 <= num_classes < (1 << 31) or preds.shape != target.shape:
        return None  # another shape: the release's statement (and its error)
    torch = _torch()
    if update is None:
        if ignore_index is None and preds.dtype is torch.int64 and target.dtype is torch.int64:
            return torch.add(preds, target, alpha=num_classes)
        return None
    n = num_classes
    labels = _labels(update, preds)
    if _wide_int(target.dtype) and (ignore_index is None or type(ignore_index) is int) and (
            labels or (_wide_int(preds.dtype) and n <= PAIR_CLASSES)):
        clamped = target.clamp(-1, n)  # one past each end: every invalid class is -1 or n
        if update.skip is not None:
            clamped.masked_fill_(update.skip, -1)
        ignored = None
        if ignore_index is not None:
            ignored = target == ignore_index
            clamped.masked_fill_(ignored, -1)
        if labels:
            codes, evidence, bound = torch.add(preds, clamped, alpha=n), clamped, n
            update.space = n * n + n  # -1 row: [-n, 0), wraps onto the n row: [n * n, n * n + n)
        else:
            codes = _pairs(n, target.device)[clamped, preds.clamp(-1, n)]
            evidence, bound = codes, n * n
            update.space = n * n + 1
        update.note(evidence, deferred.outside(0, bound))
        if ignored is not None:
            update.note(ignored, _SUM, -1)
        update.left_out()
        return codes
    invalid = outside(target, n) if labels else outside(target, n) | outside(preds, n)
    if ignore_index is not None:
        ignored = target == ignore_index
        out = _masked(update, invalid & ~ignored) | ignored
    else:
        out = _masked(update, invalid)
    update.space = n * n + n
    codes = torch.where(out, -1, target.long()) * n
    return codes + (preds.long() if labels else torch.where(out, 0, preds.long()))


def confmat_stats(confmat: Any) -> Optional[Tuple[Any, Any, Any, Any]]:
    """``tp, fp, fn, tn`` of an integer confusion matrix as the release derives them, in one
    kernel fewer (``tn = total - colsum - fn``, equal in integers to ``total - (fp + fn +
    tp)``). None for another dtype (the release's statements run)."""
    if confmat.is_floating_point() or confmat.is_complex() or confmat.dtype is _torch().bool:
        return None
    tp = confmat.diag()
    columns = confmat.sum(0)
    fn = confmat.sum(1) - tp
    return tp, columns - tp, fn, confmat.sum() - columns - fn


def micro_stats(preds: Any, target: Any, num_classes: Any, ignore_index: Any) -> Optional[Tuple[Any, Any, Any, Any]]:
    """The micro-average branch of ``_multiclass_stat_scores_update`` in a recorded update:
    ``tp, fp, tn, fn`` over the valid positions (the release's on them; invalid classes left
    out and reported). For label predictions of scores: the hits and the valid positions
    counted, ``fp = fn = valid - tp``, ``tn = tp + (n - 2) * valid``; so for a metric built with
    ``num_classes=None``, where every class is valid. None outside a recorded update."""
    update = recorded()
    if update is None or type(num_classes) is not int or num_classes < 1 or preds.shape != target.shape:
        return None  # another shape: the release's statements (and their error)
    torch = _torch()
    n = num_classes
    preds, target = preds.flatten(), target.flatten()
    if getattr(update.metric, "num_classes", 0) is None:
        # ``num_classes=None`` (1.9.0, micro only; the class update passes 1): no class is invalid, the
        # release compares the classes as they are; the ignored positions are left out without removal
        hits = preds == target
        if ignore_index is None:
            count: Any = target.numel()
            tp = hits.sum()
        else:
            kept = target != ignore_index
            count, tp = kept.sum(), (hits & kept).sum()
        return tp, count - tp, torch.add(tp, count, alpha=n - 2), count - tp
    if _labels(update, preds) and _wide_int(target.dtype) and (ignore_index is None or type(ignore_index) is int):
        valid = target.clamp(0, n - 1) == target
        if ignore_index is None:
            update.note(valid, _FALSE)
            hits = preds == target
        else:
            kept = target != ignore_index
            valid &= kept
            update.note(kept, _SUM)
            update.note(valid, _SUM, -1)
            hits = (preds == target) & kept
        count, tp = valid.sum(), hits.sum()
        return tp, count - tp, torch.add(tp, count, alpha=n - 2), count - tp
    invalid = outside(target, n) if _labels(update, preds) else outside(target, n) | outside(preds, n)
    if ignore_index is not None:
        ignored = target == ignore_index
        out = _masked(update, invalid & ~ignored) | ignored
    else:
        out = _masked(update, invalid)
    target, preds = torch.where(out, -1, target.long()), torch.where(out, -2, preds.long())
    tp = (preds == target).sum()
    fp = (preds != target).sum()
    fn = (preds != target).sum()
    left = out.sum()
    fp, fn = fp - left, fn - left  # each left-out position added one false positive and one false negative
    return tp, fp, n * (target.numel() - left) - (fp + fn + tp), fn


def binary_codes(preds: Any, target: Any) -> Any:
    """``target * 2 + preds`` (``_binary_confusion_matrix_update``) in a recorded update:
    codes in ``[-6, 6)``, those of positions to leave out outside ``[0, 4)``. Outside one, for
    an int64 target and bool or int64 predictions, the release's codes in one op."""
    update = recorded()
    if preds.shape != target.shape:
        return None  # another shape: the release's statement (and its error)
    torch = _torch()
    if update is None:
        if target.dtype is torch.int64 and (preds.dtype is torch.bool or preds.dtype is torch.int64):
            return torch.add(preds, target, alpha=2)
        return None
    labels = preds.dtype is torch.bool or _labels(update, preds)
    if _wide_int(target.dtype) and (labels or _wide_int(preds.dtype)):
        clamped = target.clamp(-1, 2)
        if labels:
            codes = torch.add(preds, clamped, alpha=2)
            codes = codes if codes.dtype is torch.int64 else codes.long()
            update.note(clamped, deferred.outside(0, 2))
            update.space = 6
        else:
            codes = _binary_pairs(target.device)[clamped, preds.clamp(-1, 2)]
            update.note(codes, deferred.outside(0, 4))
            update.space = 5
        update.left_out()
        return codes
    invalid = not_binary(target) if labels else not_binary(target) | not_binary(preds)
    out = _masked(update, invalid)
    update.space = 6
    return torch.where(out, -1, target.long()) * 2 + (preds.long() if labels else torch.where(out, 0, preds.long()))


def _multilabel_ignored(update: Update, preds: Any, target: Any, fill: int) -> Optional[Any]:
    """The entries the formatter marked ignored (``ignore_index``: target and, where it can
    hold the value, the prediction set to ``fill``); None without ``ignore_index``."""
    if _ignore_index(update) is None:
        return None
    ignored = target == fill
    if preds.is_floating_point() or preds.dtype == target.dtype:
        ignored &= preds == fill  # a target of that value not marked by the formatter is invalid
    return ignored


def multilabel_confusion_codes(preds: Any, target: Any, num_labels: Any) -> Any:
    """``(2 * target + preds + 4 * label).flatten()`` without the negative (ignored) codes
    (``_multilabel_confusion_matrix_update``) in a recorded update: every code, those to
    leave out (ignored, invalid) outside ``[0, 4 * L)``."""
    update = recorded()
    if (update is None or type(num_labels) is not int or target.dim() != 2 or preds.shape != target.shape
            or target.shape[1] != num_labels):
        return None  # another shape: the release's statements (and their error)
    torch = _torch()
    L, device = num_labels, target.device
    ignored = _multilabel_ignored(update, preds, target, -4 * L)
    if ignored is not None:
        update.note(ignored, _SUM, -1)
    if _wide_int(target.dtype) and (preds.dtype is torch.bool or _wide_int(preds.dtype)):
        clamped = target.clamp(-1, 2)
        if preds.dtype is torch.bool:
            update.note(clamped, deferred.outside(0, 2))
            update.space = 4 * L + 2
            return (_label_offsets(L, 1, device)[clamped, _labels_arange(L, device)].squeeze(-1) + preds).flatten()
        codes = _label_pairs(L, device)[clamped, preds.clamp(-1, 2), _labels_arange(L, device)]
        update.note(codes, deferred.outside(0, 4 * L))
        update.space = 4 * L + 1
        return codes.flatten()
    invalid = not_binary(target) if preds.dtype is torch.bool else not_binary(target) | not_binary(preds)
    if ignored is not None:
        invalid = invalid | ignored  # noted above, taken off again
    update.bad(invalid)
    update.space = 4 * L + 2
    codes = torch.where(invalid, -1, target.long()) * 2 + torch.where(invalid, 0, preds.long())
    return (codes + 4 * _labels_arange(L, device)).flatten()


def binary_curve_codes(preds_t: Any, target: Any, len_t: int) -> Any:
    """``preds_t + 2 * target + 4 * threshold`` (``_binary_precision_recall_curve_update_vectorized``)
    in a recorded update: the offsets of the clamped target's table row."""
    update = recorded()
    if update is None or target.dim() != 1 or preds_t.shape != (target.shape[0], len_t):
        return None
    torch = _torch()
    offsets = _threshold_offsets(len_t, target.device)
    update.space = 4 * len_t + 2
    if _wide_int(target.dtype):
        clamped = target.clamp(-1, 2)
        update.note(clamped, deferred.outside(0, 2))
        update.left_out()
        return preds_t + offsets[clamped]
    if target.dtype is torch.bool:
        update.left_out()
        return preds_t + offsets[target.long()]
    out = _masked(update, not_binary(target))
    return preds_t + offsets[torch.where(out, -1, target.long())]


def multiclass_curve_codes(preds_t: Any, target: Any, num_classes: Any, len_t: int) -> Any:
    """``preds_t + 2 * one_hot(target) + 4 * class + 4 * n * threshold``
    (``_multiclass_precision_recall_curve_update_vectorized``) in a recorded update: the
    clamped target's row of offsets (a table of every class's, up to :data:`TABLE_CAP`
    entries; above, the one-hot of the clamped class), with a row to leave out past the
    count's bins. None outside a recorded update or for a target ``one_hot`` refuses (the
    release's statements run)."""
    update = recorded()
    torch = _torch()
    if (update is None or type(num_classes) is not int or target.dtype is not torch.int64 or target.dim() != 1
            or preds_t.shape != (target.shape[0], num_classes, len_t)):
        return None
    n, device = num_classes, target.device
    clamped = target.clamp(-1, n)
    update.note(clamped, deferred.outside(0, n))
    update.left_out()
    update.space = 4 * n * len_t + 2
    if (n + 2) * n * len_t <= TABLE_CAP:
        return preds_t + _class_offsets(n, len_t, device)[clamped]
    out = clamped.clamp(0, n - 1) != clamped
    hot = torch.nn.functional.one_hot(clamped.clamp(0, n - 1), num_classes=n).unsqueeze(-1)
    steps = 4 * torch.arange(n, device=device).view(1, -1, 1) + 4 * n * torch.arange(len_t, device=device)
    codes = preds_t + 2 * hot + steps
    return codes.masked_fill_(out.view(-1, 1, 1), 4 * n * len_t)


def multilabel_curve_codes(preds_t: Any, preds: Any, target: Any, num_labels: Any, len_t: int) -> Any:
    """``preds_t + 2 * target + 4 * label + 4 * L * threshold``, flattened, without the
    negative (ignored) codes (``_multilabel_precision_recall_curve_update``) in a recorded
    update: every code, those to leave out (ignored, invalid) past the count's bins."""
    update = recorded()
    if (update is None or type(num_labels) is not int or target.dim() != 2
            or preds_t.shape != (target.shape[0], num_labels, len_t)):
        return None  # another shape: the release's statements (and their error)
    torch = _torch()
    L, device = num_labels, target.device
    ignored = _multilabel_ignored(update, preds, target, -4 * L * len_t)
    if ignored is not None:
        update.note(ignored, _SUM, -1)
    update.space = 4 * L * len_t + 2
    if _wide_int(target.dtype):
        clamped = target.clamp(-1, 2)
        update.note(clamped, deferred.outside(0, 2))
    else:
        invalid = not_binary(target)
        if ignored is not None:
            invalid = invalid | ignored  # noted above, taken off again
        update.bad(invalid)
        clamped = torch.where(invalid, -1, target.long())
    return (preds_t + _label_offsets(L, len_t, device)[clamped, _labels_arange(L, device)]).flatten()


# -- the loops of large curves: wrappers -------------------------------------------------
def _left_out(update: Update, invalid: Any) -> Any:
    """Report the invalid positions that are not ignored; return every position to leave out."""
    return _masked(update, invalid)


#: the release's vectorised binned curves: binary up to 50,000 scores, multiclass up to
#: 1,000,000 scores x classes (every release 1.0.0-1.9.0; above, a loop counts without bincount)
BINARY_CURVE_CUT, MULTICLASS_CURVE_CUT = 50_000, 1_000_000


def build_binary_curve_update(module: ModuleType) -> Callable[..., Any]:
    """``_binary_precision_recall_curve_update(preds, target, thresholds)``, binned, above
    the vectorised size (a loop): left-out positions score NaN with target 0 (a true
    negative at every threshold, ``-inf`` included: ``NaN >= t`` is false), then come off
    ``[:, 0, 0]``. Up to it, the release's function (its codes statement is edited)."""
    import torch

    where = torch.where

    @gated(current)
    def _binary_precision_recall_curve_update(original: Callable, preds: Any, target: Any, thresholds: Any) -> Any:
        update = recorded()
        if update is None or thresholds is None or preds.numel() <= BINARY_CURVE_CUT:
            return original(preds, target, thresholds)
        out = _left_out(update, not_binary(target))
        state = original(where(out, math.nan, preds), where(out, 0, target), thresholds)
        state[:, 0, 0] -= out.sum()
        return state

    return _binary_precision_recall_curve_update


def _multiclass_curve(average: bool) -> Callable[[ModuleType], Callable[..., Any]]:
    """``_multiclass_precision_recall_curve_update``, binned; ``average`` (1.3.0+): micro
    flattens (the formatter one-hot encoded the target, the rows come ``num_classes``
    at a time). Above the vectorised size (a loop) and for micro, a left-out row scores
    NaN for every class with target 0: a false negative of class 0 and a true negative of
    the others, at every threshold, taken off the result."""

    def build(module: ModuleType) -> Callable[..., Any]:
        import torch

        where = torch.where

        def run(original: Callable, preds: Any, target: Any, num_classes: int, thresholds: Any,
                extra: Tuple[Any, ...]) -> Any:
            update = recorded()
            if update is None or thresholds is None or type(num_classes) is not int:
                return original(preds, target, num_classes, thresholds, *extra)
            if extra and extra[0] == "micro":
                rows, update.drop, update.keep = update.drop, None, None  # drop: every row left out, reported
                if rows is None:
                    return original(preds, target, num_classes, thresholds, *extra)  # nothing to leave out
                out = rows.unsqueeze(1).expand(-1, num_classes).reshape(-1)
                state = original(where(out, math.nan, preds), where(out, 0, target), num_classes, thresholds, *extra)
                state[:, 0, 0] -= out.sum()
                return state
            if preds.numel() * num_classes <= MULTICLASS_CURVE_CUT:
                return original(preds, target, num_classes, thresholds, *extra)  # its codes statements are edited
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


# -- the edits ----------------------------------------------------------------------------
def recording() -> bool:
    """Whether a recorded update is running."""
    return recorded() is not None


def _names(module: ModuleType) -> Dict[str, Any]:
    fill_wide()  # before any compiled call reads it
    return {
        "_tmpatch_recording": recording,
        "_tmpatch_class_codes": class_codes,
        "_tmpatch_confmat_stats": confmat_stats,
        "_tmpatch_micro_stats": micro_stats,
        "_tmpatch_binary_codes": binary_codes,
        "_tmpatch_multilabel_confusion_codes": multilabel_confusion_codes,
        "_tmpatch_binary_curve_codes": binary_curve_codes,
        "_tmpatch_multiclass_curve_codes": multiclass_curve_codes,
        "_tmpatch_multilabel_curve_codes": multilabel_curve_codes,
    }


def _kept(statements: str, first: str) -> str:
    """``first`` (a statement setting ``unique_mapping``, None outside a recorded update), then
    the release's ``statements`` when it gave None."""
    return first + "\nif unique_mapping is None:\n" + "".join("    " + line + "\n" for line in statements.splitlines())


_CLASS_CODES = "unique_mapping = target.to(torch.long) * num_classes + preds.to(torch.long)\n"
_IGNORE = ("if ignore_index is not None:\n    idx = target != ignore_index\n    preds = preds[idx]\n"
           "    target = target[idx]\n")
_FLAT = "preds = preds.flatten()\ntarget = target.flatten()\n"
_MICRO = ("tp = (preds == target).sum()\nfp = (preds != target).sum()\nfn = (preds != target).sum()\n"
          "tn = num_classes * preds.numel() - (fp + fn + tp)\n")
_STATS = ("tp = confmat.diag()\nfp = confmat.sum(0) - tp\nfn = confmat.sum(1) - tp\n"
          "tn = confmat.sum() - (fp + fn + tp)\n")


def _block(text: str, indent: str = "    ") -> str:
    return "".join(indent + line + "\n" for line in text.splitlines())


#: ``_multiclass_stat_scores_update`` (every release): the micro branch, the codes (and the
#: removal of ignored positions before them) and the statistics of the confusion matrix
STAT_SCORES = Rewrite(
    (
        Edit(_FLAT + _IGNORE + _MICRO,
             "stats = _tmpatch_micro_stats(preds, target, num_classes, ignore_index)\nif stats is not None:\n"
             "    tp, fp, tn, fn = stats\nelse:\n" + _block(_FLAT + _IGNORE + _MICRO)),
        Edit(_FLAT + _IGNORE + _CLASS_CODES,
             _FLAT + "unique_mapping = _tmpatch_class_codes(preds, target, num_classes, ignore_index)\n"
             "if unique_mapping is None:\n" + _block(_IGNORE + _CLASS_CODES)),
        Edit(_STATS, "stats = _tmpatch_confmat_stats(confmat)\nif stats is not None:\n    tp, fp, fn, tn = stats\n"
                     "else:\n" + _block(_STATS)),
    ),
    _names,
)

#: ``_multiclass_confusion_matrix_update`` (every release)
MULTICLASS_CONFUSION = Rewrite(
    (Edit(_CLASS_CODES, _kept(_CLASS_CODES, "unique_mapping = _tmpatch_class_codes(preds, target, num_classes)")),),
    _names,
)

# -- 0.10.0-0.11.4: the same statements, spelled as the release spelled them -------------------
#: up to 0.11.2 the multiclass codes are cast after the arithmetic (a narrow target overflows there;
#: the helper's codes are exact: fixed upstream in 0.11.3)
_CLASS_CODES_0 = "unique_mapping = (target * num_classes + preds).to(torch.long)\n"

#: ``_multiclass_stat_scores_update`` of 0.10.2-0.11.2
STAT_SCORES_0 = Rewrite(
    (
        STAT_SCORES.edits[0],
        Edit(_FLAT + _IGNORE + _CLASS_CODES_0,
             _FLAT + "unique_mapping = _tmpatch_class_codes(preds, target, num_classes, ignore_index)\n"
             "if unique_mapping is None:\n" + _block(_IGNORE + _CLASS_CODES_0)),
        STAT_SCORES.edits[2],
    ),
    _names,
)
#: ``_multiclass_stat_scores_update`` of 0.10.0-0.10.1: no ``average`` argument, no micro branch
STAT_SCORES_0_10 = Rewrite(STAT_SCORES_0.edits[1:], _names)

#: ``_multiclass_confusion_matrix_update`` of 0.10.0-0.11.2
MULTICLASS_CONFUSION_0 = Rewrite(
    (Edit(_CLASS_CODES_0, _kept(_CLASS_CODES_0, "unique_mapping = _tmpatch_class_codes(preds, target, num_classes)")),),
    _names,
)

_BINARY_CODES = "unique_mapping = (target * 2 + preds).to(torch.long)\n"

#: ``_binary_confusion_matrix_update`` (every release)
BINARY_CONFUSION = Rewrite(
    (Edit(_BINARY_CODES, _kept(_BINARY_CODES, "unique_mapping = _tmpatch_binary_codes(preds, target)")),),
    _names,
)

_MULTILABEL_CODES = ("unique_mapping = ((2 * target + preds) + 4 * torch.arange(num_labels, device=preds.device))"
                     ".flatten()\nunique_mapping = unique_mapping[unique_mapping >= 0]\n")

#: ``_multilabel_confusion_matrix_update`` (every release): its codes and its removal of the
#: negative (ignored) ones
MULTILABEL_CONFUSION = Rewrite(
    (Edit(_MULTILABEL_CODES,
          _kept(_MULTILABEL_CODES,
                "unique_mapping = _tmpatch_multilabel_confusion_codes(preds, target, num_labels)")),),
    _names,
)

_BINARY_CURVE = ("unique_mapping = preds_t + 2 * target.long().unsqueeze(-1) + 4 * torch.arange(len_t, "
                 "device=target.device)\n")

#: ``_binary_precision_recall_curve_update_vectorized`` (every release)
BINARY_CURVE = Rewrite(
    (Edit(_BINARY_CURVE,
          _kept(_BINARY_CURVE, "unique_mapping = _tmpatch_binary_curve_codes(preds_t, target, len_t)")),),
    _names,
)

_MULTICLASS_CURVE = (
    "target_t = torch.nn.functional.one_hot(target, num_classes=num_classes)\n"
    "unique_mapping = preds_t + 2 * target_t.long().unsqueeze(-1)\n"
    "unique_mapping += 4 * torch.arange(num_classes, device=preds.device).unsqueeze(0).unsqueeze(-1)\n"
    "unique_mapping += 4 * num_classes * torch.arange(len_t, device=preds.device)\n"
)

#: ``_multiclass_precision_recall_curve_update_vectorized`` (every release)
MULTICLASS_CURVE = Rewrite(
    (Edit(_MULTICLASS_CURVE,
          _kept(_MULTICLASS_CURVE,
                "unique_mapping = _tmpatch_multiclass_curve_codes(preds_t, target, num_classes, len_t)")),),
    _names,
)

_MULTILABEL_CURVE = (
    "unique_mapping = preds_t + 2 * target.long().unsqueeze(-1)\n"
    "unique_mapping += 4 * torch.arange(num_labels, device=preds.device).unsqueeze(0).unsqueeze(-1)\n"
    "unique_mapping += 4 * num_labels * torch.arange(len_t, device=preds.device)\n"
    "unique_mapping = unique_mapping[unique_mapping >= 0]\n"
)

#: ``_multilabel_precision_recall_curve_update`` (every release): its codes and its removal of
#: the negative (ignored) ones
MULTILABEL_CURVE = Rewrite(
    (Edit(_MULTILABEL_CURVE,
          _kept(_MULTILABEL_CURVE,
                "unique_mapping = _tmpatch_multilabel_curve_codes(preds_t, preds, target, num_labels, len_t)")),),
    _names,
)

# -- 0.10.0-0.11.4: the curves' codes inside the update functions (no ``_vectorized`` helper, no
# loop), the target not cast to int64 (one_hot gives int64; the other targets are 0 or 1 there)
_BINARY_CURVE_0 = ("unique_mapping = preds_t + 2 * target.unsqueeze(-1) + 4 * torch.arange(len_t, "
                   "device=target.device)\n")
BINARY_CURVE_0 = Rewrite(
    (Edit(_BINARY_CURVE_0,
          _kept(_BINARY_CURVE_0, "unique_mapping = _tmpatch_binary_curve_codes(preds_t, target, len_t)")),),
    _names,
)
_MULTICLASS_CURVE_0 = _MULTICLASS_CURVE.replace("target_t.long()", "target_t")
MULTICLASS_CURVE_0 = Rewrite(
    (Edit(_MULTICLASS_CURVE_0,
          _kept(_MULTICLASS_CURVE_0,
                "unique_mapping = _tmpatch_multiclass_curve_codes(preds_t, target, num_classes, len_t)")),),
    _names,
)
_MULTILABEL_CURVE_0 = _MULTILABEL_CURVE.replace("target.long()", "target")
MULTILABEL_CURVE_0 = Rewrite(
    (Edit(_MULTILABEL_CURVE_0,
          _kept(_MULTILABEL_CURVE_0,
                "unique_mapping = _tmpatch_multilabel_curve_codes(preds_t, preds, target, num_labels, len_t)")),),
    _names,
)
