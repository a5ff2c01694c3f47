"""The release's code-making statements, edited, and the update wrappers of the loops.

In a recorded update (``counting.recorded()``) the statements that turn classes into the
codes ``_bincount`` counts (and, for multilabel functions, remove the negative ones) are
replaced (:mod:`tmpatch.engine.rewrite`) by helpers that make the release's codes, with its
arithmetic (folded into one op where the types allow), clamped to ``[-1, bins]``, and codes past
the bins for the positions the release removed before them (ignored ones, the formatter's kept
mask; :func:`_counted`). The count (``counting.build_bincount``) counts a code in the bins in its
bin, as the release's does (an invalid class included, in the cell its code lands in), and the
others nowhere; what would make the release raise (a negative code where it does not remove
them, a code past the bins) is noted for a deferred report in its words, but where the release
counts with its mesh (deterministic mode), which drops them silently. The multiclass curves'
target is one-hot encoded by the release, which raises on a class out of range: those rows are
left out and reported in ``one_hot``'s words. Integer arithmetic throughout: the states are the
release's, bit for bit, wherever the release raises nothing. The loops of large curves (above
50,000 scores, or 10^6 scores x classes) count without ``_bincount``: their wrappers hand the
loop inputs in which the removed positions score NaN with target 0 (below every threshold) and
take their count off the result, an exact integer correction. Outside a recorded update every
function is the release's, unchanged.
"""
from __future__ import annotations

import math
from types import ModuleType
from typing import Any, Callable, Dict, Optional, Tuple

from tmpatch.patches.bincount.counting import BINS, Update, current, fill_wide, raises, recorded, table
from tmpatch.runtime import deferred
from tmpatch.spec import Edit, Rewrite, gated

#: a table of codes is used up to this many entries (int64); above, the masked form
TABLE_CAP = 1 << 20

_SUM, _FALSE = deferred.SUM, deferred.FALSE


def _torch() -> Any:
    import torch

    return torch


# -- tables (made once per device) --------------------------------------------------------
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


def _steps(labels: int, len_t: int, device: Any) -> Any:
    """``labels x len_t``: ``[l, k] -> 4 * l + 4 * labels * k``, the release's offsets of a label
    and a threshold (int64)."""
    torch = _torch()

    def make() -> Any:
        label = torch.arange(labels, device=device).view(-1, 1)
        return 4 * label + 4 * labels * torch.arange(len_t, device=device)

    return table("steps", (labels, len_t), device, make)


# -- helpers -------------------------------------------------------------------------------
def _ignore_index(update: Update) -> Any:
    """The metric's ``ignore_index`` (None when it has none). An attribute read: torch.compile
    guards that attribute alone (a read of ``__dict__`` would guard every entry, the update
    count included, and recompile each step)."""
    return getattr(update.metric, "ignore_index", None)


def _out(update: Update, target: Any, ignore_index: Any = None) -> Tuple[Any, Any]:
    """The positions the release removed before its codes: ``(keep, out)``, the formatter's kept
    positions (or None) and the others (the skipped ones, the stat scores' own ``ignore_index``;
    or None)."""
    keep, skip = update.taken()
    out = skip
    if ignore_index is not None:
        ignored = target == ignore_index
        out = ignored if out is None else out | ignored
    if keep is not None and out is not None:
        return None, out | ~keep
    return keep, out


def _counted(update: Update, codes: Any, bins: int, negative: bool, keep: Any = None, out: Any = None) -> Any:
    """The release's ``codes`` (int64), made for every position, for the count: the positions the
    release removed (``keep`` False, ``out`` True: rows of ``codes``) past the bins, unreported;
    every other code counts where the release's ``_bincount`` counts it (a code in ``[0, bins)``
    in its bin, the others nowhere) and, where the release's ``torch.bincount`` would raise
    (:func:`counting.raises`), a negative one (``negative``: the release does not remove them
    first) or one past the bins (its ``reshape`` raises) is reported in the release's words.
    Codes in ``[-1, bins + 1]``: -1 negative, ``bins`` past the bins, ``bins + 1`` removed."""
    clamped = codes.clamp(-1, bins)
    mask = keep if keep is not None else out
    if mask is not None:  # rows of codes: one mask entry per row
        mask = mask.view(mask.shape + (1,) * (clamped.dim() - mask.dim())).expand_as(clamped)
        if keep is not None:
            clamped = _torch().where(mask, clamped, bins + 1)
        else:
            clamped = clamped.masked_fill(mask, bins + 1)
    update.space = bins + 2  # -1 wraps onto bins + 1
    if raises(codes):
        if negative:
            update.note(clamped, deferred.outside(0, bins + 2))
        update.note(clamped, deferred.outside(-1, bins), record=BINS)
        if mask is not None:  # the removed positions' bins + 1, counted above, taken off
            update.note(mask, _FALSE if keep is not None else _SUM, -1, record=BINS)
    return clamped


def _long(x: Any) -> Any:
    return x if x.dtype is _torch().int64 else x.to(_torch().long)


def class_codes(preds: Any, target: Any, num_classes: Any, ignore_index: Any = None) -> Any:
    """``target.to(torch.long) * num_classes + preds.to(torch.long)`` (``_multiclass_confusion_matrix_update``,
    ``_multiclass_stat_scores_update``), the release's codes in one op (``add`` with ``alpha``: the
    same int64 arithmetic); in a recorded update counted as the release's ``_bincount`` counts them
    (:func:`_counted`; ``ignore_index``: the stat scores' own, whose removal the edit replaces).
    Outside a recorded update, for int64 classes and no removal to make first, the same op; else
    None (the release's statement runs)."""
    update = recorded()
    if type(num_classes) is not int or not 1 <= num_classes < (1 << 31) or preds.shape != target.shape:
        return None  # another shape: the release's statement (and its error)
    torch = _torch()
    if update is None:
        if ignore_index is None and preds.dtype is torch.int64 and target.dtype is torch.int64:
            return torch.add(preds, target, alpha=num_classes)
        return None
    if preds.dtype.is_complex or target.dtype.is_complex:
        return None
    keep, out = _out(update, target, ignore_index)
    codes = torch.add(_long(preds), _long(target), alpha=num_classes)
    return _counted(update, codes, num_classes * num_classes, True, keep, out)


def class_codes_0(preds: Any, target: Any, num_classes: Any, ignore_index: Any = None) -> Any:
    """:func:`class_codes` of 0.10.0-0.11.2, whose codes are ``(target * num_classes + preds).to(torch.long)``
    (cast after the arithmetic): the same codes for int64 classes; for others, the release's
    arithmetic."""
    update = recorded()
    torch = _torch()
    if (update is None or (preds.dtype is torch.int64 and target.dtype is torch.int64)
            or type(num_classes) is not int or preds.shape != target.shape):
        return class_codes(preds, target, num_classes, ignore_index)
    if preds.dtype.is_complex or target.dtype.is_complex:
        return None
    keep, out = _out(update, target, ignore_index)
    codes = (target * num_classes + preds).to(torch.long)
    return _counted(update, codes, num_classes * num_classes, True, keep, out)


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
    the release's comparisons without its removal of ignored (and skipped) positions: the hits and
    the kept positions counted, ``fp = fn = kept - tp``, ``tn = tp + (n - 2) * kept`` (equal in
    integers to the release's ``n * kept - (fp + fn + tp)``). The release raises nothing there
    (no count): every class compares as it is. None outside a recorded update."""
    update = recorded()
    if update is None or type(num_classes) is not int or preds.shape != target.shape:
        return None  # another shape: the release's statements (and their error)
    torch = _torch()
    preds, target = preds.flatten(), target.flatten()
    keep, out = _out(update, target, ignore_index)
    hits = preds == target
    if keep is None and out is None:
        count: Any = target.numel()
        tp = hits.sum()
    else:
        kept = keep if keep is not None else ~out
        count, tp = kept.sum(), (hits & kept).sum()
    return tp, count - tp, torch.add(tp, count, alpha=num_classes - 2), count - tp


def binary_codes(preds: Any, target: Any) -> Any:
    """``(target * 2 + preds).to(torch.long)`` (``_binary_confusion_matrix_update``); in a recorded
    update counted as the release's ``_bincount`` counts them (:func:`_counted`). Outside one, for
    an int64 target and bool or int64 predictions, the release's codes in one op."""
    update = recorded()
    if preds.shape != target.shape:
        return None  # another shape: the release's statement (and its error)
    torch = _torch()
    lean = target.dtype is torch.int64 and (preds.dtype is torch.bool or preds.dtype is torch.int64)
    if update is None:
        return torch.add(preds, target, alpha=2) if lean else None
    if preds.dtype.is_complex or target.dtype.is_complex:
        return None
    keep, out = _out(update, target)
    codes = torch.add(preds, target, alpha=2) if lean else (target * 2 + preds).to(torch.long)
    return _counted(update, codes, 4, True, keep, out)


def multilabel_confusion_codes(preds: Any, target: Any, num_labels: Any) -> Any:
    """``((2 * target + preds) + 4 * label).flatten()`` without the negative codes
    (``_multilabel_confusion_matrix_update``; the formatter made the ignored ones negative) in a
    recorded update: the negative codes past the bins (the release removes them: nothing to
    report), the others counted as the release's ``_bincount`` counts them."""
    update = recorded()
    if (update is None or type(num_labels) is not int or target.dim() != 2 or preds.shape != target.shape
            or target.shape[1] != num_labels or preds.dtype.is_complex or target.dtype.is_complex):
        return None  # another shape: the release's statements (and their error)
    torch = _torch()
    L = num_labels
    codes = (2 * target + preds) + _steps(L, 1, target.device).view(-1)
    if codes.dtype is not torch.int64:
        return None  # float codes: the release's statements (and its bincount's error)
    return _counted(update, codes, 4 * L, False).flatten()


def binary_curve_codes(preds_t: Any, target: Any, len_t: int) -> Any:
    """``preds_t + 2 * target + 4 * threshold`` (``_binary_precision_recall_curve_update_vectorized``)
    in a recorded update: counted as the release's ``_bincount`` counts them (:func:`_counted`),
    the formatter's removed positions past the bins."""
    update = recorded()
    if update is None or target.dim() != 1 or preds_t.shape != (target.shape[0], len_t):
        return None
    if target.dtype.is_complex:
        return None
    torch = _torch()
    keep, out = _out(update, target)
    codes = torch.add(preds_t + _steps(1, len_t, target.device).view(-1), target.long().unsqueeze(-1), alpha=2)
    return _counted(update, codes, 4 * len_t, True, keep, out)


def multiclass_curve_codes(preds_t: Any, target: Any, num_classes: Any, len_t: int) -> Any:
    """``preds_t + 2 * one_hot(target) + 4 * class + 4 * n * threshold``
    (``_multiclass_precision_recall_curve_update_vectorized``) in a recorded update: the
    clamped target's row of offsets (a table of every class's, up to :data:`TABLE_CAP`
    entries; above, the one-hot of the clamped class), with a row to leave out past the
    count's bins. A class out of range, which makes the release's ``one_hot`` raise, is left out
    and reported in its words (in deterministic mode too: ``one_hot`` comes before the count).
    None outside a recorded update or for a target ``one_hot`` refuses (the release's statements
    run)."""
    update = recorded()
    torch = _torch()
    if (update is None or type(num_classes) is not int or target.dtype is not torch.int64 or target.dim() != 1
            or preds_t.shape != (target.shape[0], num_classes, len_t)):
        return None
    n, device = num_classes, target.device
    keep, _ = update.taken()
    clamped = update.classes(target, n, keep)
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
    negative codes (``_multilabel_precision_recall_curve_update``; the formatter made the ignored
    ones negative) in a recorded update: the negative codes past the bins (removed by the
    release: nothing to report), the others counted as the release's ``_bincount`` counts them."""
    update = recorded()
    if (update is None or type(num_labels) is not int or target.dim() != 2
            or preds_t.shape != (target.shape[0], num_labels, len_t) or target.dtype.is_complex):
        return None  # another shape: the release's statements (and their error)
    torch = _torch()
    L = num_labels
    codes = torch.add(preds_t + _steps(L, len_t, target.device), target.long().unsqueeze(-1), alpha=2)
    return _counted(update, codes, 4 * L * len_t, False).flatten()


# -- the loops of large curves: wrappers -------------------------------------------------

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
        keep, _ = update.taken()
        if keep is None:
            return original(preds, target, thresholds)  # nothing removed: the release's loop as it is
        out = ~keep
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
            keep, _ = update.taken()
            if target.dtype is not torch.int64:
                return original(preds, target, num_classes, thresholds, *extra)  # its one_hot's error
            clamped = update.classes(target, num_classes, keep)
            out = clamped.clamp(0, num_classes - 1) != clamped  # the release's one_hot raises on them
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
        "_tmpatch_class_codes_0": class_codes_0,
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
             _FLAT + "unique_mapping = _tmpatch_class_codes_0(preds, target, num_classes, ignore_index)\n"
             "if unique_mapping is None:\n" + _block(_IGNORE + _CLASS_CODES_0)),
        STAT_SCORES.edits[2],
    ),
    _names,
)
#: ``_multiclass_stat_scores_update`` of 0.10.0-0.10.1: no ``average`` argument, no micro branch
STAT_SCORES_0_10 = Rewrite(STAT_SCORES_0.edits[1:], _names)

#: ``_multiclass_confusion_matrix_update`` of 0.10.0-0.11.2
MULTICLASS_CONFUSION_0 = Rewrite(
    (Edit(_CLASS_CODES_0,
           _kept(_CLASS_CODES_0, "unique_mapping = _tmpatch_class_codes_0(preds, target, num_classes)")),),
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
