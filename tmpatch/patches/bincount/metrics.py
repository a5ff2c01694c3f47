"""The counting metrics' ``update``: where a recorded update begins and ends.

The class ``update`` of multiclass stat scores, the three confusion matrices and the
three binned precision-recall curves (and every metric that inherits one of them:
Accuracy, F1, CohenKappa, JaccardIndex, AUROC, AveragePrecision, ROC, ...) opens a
:class:`counting.Update` for the release's code it runs, when the metric has a book
(built while ``deferred_reports`` is applied) and ``TMPATCH_BINCOUNT`` is ``deferred``.
Unbinned curves keep the release's update: their states hold the kept values
themselves, so the removal of ignored positions is inherent there. On the CPU, an
update whose classes are all valid takes the release's update (``CPU_FAST``): the
read that tells costs nothing there, the release counts valid classes exactly as the
recorded update does, and neither reports anything; any other update is recorded, as
on a GPU.
"""
from __future__ import annotations

from types import ModuleType
from typing import Any, Callable

from tmpatch.compiled import compiling
from tmpatch.patches.bincount.counting import RECORD, Update, active, current

#: torch.Tensor, torch.aminmax and torch.bool, bound when a replacement is built (no torch import here)
Tensor: Any = None
_AMINMAX: Any = None
_BOOL: Any = None

#: on the CPU, inputs whose classes are all valid take the release's update (reading them
#: costs nothing there; the release counts them exactly as the recorded update does, and
#: neither reports anything); the tests of the recorded update turn it off
CPU_FAST = True


def _classes_valid(values: Any, low: int, high: int, ignore: Any) -> bool:
    """Every value in ``[low, high)``, or equal to ``ignore`` (an int, or None)."""
    if values.is_floating_point() or values.dtype.is_complex or values.dtype is _BOOL or not values.numel():
        return False
    least, most = _AMINMAX(values)
    if least.item() >= low and most.item() < high:
        return True
    if ignore is None:
        return False
    least, most = _AMINMAX(values.masked_fill(values == ignore, low))
    return least.item() >= low and most.item() < high


def _valid_on_cpu(metric: Any, args: tuple, kwargs: dict) -> bool:
    """Whether ``update(preds, target)`` of ``metric`` has CPU tensors whose classes are all
    valid: target a class (multiclass: ``[0, num_classes)``; binary and multilabel: 0 or 1)
    or ``ignore_index``, label ``preds`` a class, score ``preds`` of the expected shape."""
    if len(args) != 2 or kwargs:
        return False
    preds, target = args
    if (type(preds) is not Tensor or type(target) is not Tensor or not preds.is_cpu
            or not target.is_cpu or preds.requires_grad):
        return False
    # read from the instance (torchmetrics sets both there): a missing attribute on an nn.Module
    # costs an exception; one not found here only makes the test stricter (binary's classes, no
    # ignored value), never looser
    attributes = metric.__dict__
    ignore = attributes.get("ignore_index")
    if ignore is not None and type(ignore) is not int:
        return False
    classes = attributes.get("num_classes")
    if classes is not None:  # multiclass
        if type(classes) is not int or classes < 1:
            return False
        if preds.is_floating_point():
            if preds.dim() != target.dim() + 1 or preds.shape[1] != classes:
                return False
        elif preds.shape != target.shape or not _classes_valid(preds, 0, classes, None):
            return False
        return _classes_valid(target, 0, classes, ignore)
    if preds.shape != target.shape:  # binary and multilabel
        return False
    if not preds.is_floating_point() and not _classes_valid(preds, 0, 2, None):
        return False
    return _classes_valid(target, 0, 2, ignore)


def _builder(binned_only: bool) -> Callable[[ModuleType], Callable[..., Any]]:
    def build(module: ModuleType) -> Callable[..., Any]:
        global Tensor, _AMINMAX, _BOOL
        import torch

        Tensor, _AMINMAX, _BOOL = torch.Tensor, torch.aminmax, torch.bool
        recorded = RECORD.deferred

        def update(original: Callable, self: Any, *args: Any, **kwargs: Any) -> Any:
            if CPU_FAST and not compiling() and _valid_on_cpu(self, args, kwargs):
                return original(self, *args, **kwargs)  # first: the common CPU case asks nothing else
            if not active() or not recorded(self) or (binned_only and getattr(self, "thresholds", None) is None):
                return original(self, *args, **kwargs)
            token = current.set(Update(self))
            try:
                return original(self, *args, **kwargs)
            finally:
                current.reset(token)

        return update

    return build


#: stat scores and confusion matrices
build_update = _builder(binned_only=False)
#: precision-recall curves: binned ones only
build_curve_update = _builder(binned_only=True)
