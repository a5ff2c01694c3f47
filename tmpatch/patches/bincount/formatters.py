"""Edits of the release's formatters: ignored positions stay in place during a recorded update.

The binary and multiclass confusion-matrix and precision-recall-curve formatters drop
``target == ignore_index`` with a boolean index (``preds = preds[idx]``: a
data-dependent shape, one sync each on CUDA). Inside a recorded update the two
statements give way to :func:`unremoved`: the positions stay, their target set to -1 (a
code outside every count: ``updates.py``), the mask of kept positions noted for the
report; everywhere else the release's two statements run, in place (its removal, its line
in tracebacks and audits). Two selections, as many kernels as the two removals. Ignored
float ``preds`` are set to 0, a value in [0, 1], so the formatter's "logits or
probabilities?" decision is taken on the kept values alone, as after the removal.

The multiclass curve formatter with ``average="micro"`` (1.3.0+) one-hot encodes the
target itself: :func:`classes` takes out-of-range targets (ignored ones included) first
(reported unless ignored, left out).
"""
from __future__ import annotations

from types import ModuleType
from typing import Any, Dict, Tuple

from tmpatch.patches._constants import operand
from tmpatch.patches.bincount.counting import recorded

where: Any = None  # torch.where, bound when the edits' names are made
int64: Any = None  # torch.int64, the same
from tmpatch.spec import Edit, Rewrite

_REMOVAL = "preds = preds[idx]\ntarget = target[idx]\n"
_ONE_HOT = "target = torch.nn.functional.one_hot(target, num_classes=num_classes).flatten()\n"


def unremoved(preds: Any, target: Any, keep: Any) -> Tuple[Any, Any]:
    """``preds[keep], target[keep]`` (the release's removal), or, in a recorded update,
    ``preds`` and ``target`` with every position, the ignored ones' target -1 (and float
    ``preds`` 0); ``keep`` noted for the report."""
    update = recorded()
    if update is None:
        return preds[keep], target[keep]
    update.keep = keep
    if preds.is_floating_point():
        rows = keep if preds.dim() == keep.dim() else keep.unsqueeze(-1)  # (N, C) multiclass rows
        preds = where(rows, preds, operand(0, preds))
    return preds, where(keep, target, operand(-1, target))  # the fills: constants, no kernel each


def classes(target: Any, num_classes: int) -> Any:
    """``target`` for ``one_hot``; in a recorded update, classes out of range (which make the
    release's ``one_hot`` raise) are reported in its words (ignored ones, whose target is -1, left
    out unreported) and replaced by class 0, their rows marked to be left out."""
    update = recorded()
    if update is None or type(num_classes) is not int or target.dtype is not int64:
        return target  # the release's one_hot (and its error)
    keep, update.keep = update.keep, None
    clamped = update.classes(target, num_classes, keep)
    invalid = clamped.clamp(0, num_classes - 1) != clamped
    update.drop = invalid
    return target.masked_fill(invalid, 0)


def recording() -> bool:
    """Whether a recorded update is running (the formatter keeps ignored positions)."""
    return recorded() is not None


def _names(module: ModuleType) -> Dict[str, Any]:
    global where, int64
    import torch

    where, int64 = torch.where, torch.int64
    return {"_tmpatch_unremoved": unremoved, "_tmpatch_classes": classes, "_tmpatch_recording": recording}


#: the release's two statements stay, behind the test (they are the release's removal)
_KEEP = "if _tmpatch_recording():\n    preds, target = _tmpatch_unremoved(preds, target, idx)\nelse:\n" + "".join(
    "    " + line + "\n" for line in _REMOVAL.splitlines())

#: the boolean removal of ignored positions, kept in place during recorded updates
KEEP_IGNORED = Rewrite((Edit(_REMOVAL, _KEEP),), _names)

#: the same, and the micro one-hot of the multiclass curve formatter (1.3.0+)
KEEP_IGNORED_AND_CLASSES = Rewrite(
    (
        Edit(_REMOVAL, _KEEP),
        Edit(_ONE_HOT, "target = torch.nn.functional.one_hot(_tmpatch_classes(target, num_classes), "
                       "num_classes=num_classes).flatten()"),
    ),
    _names,
)
