"""The counting metrics' ``update``: where a recorded update begins and ends.

The class ``update`` of multiclass stat scores, the three confusion matrices and the
three binned precision-recall curves (and every metric that inherits one of them:
Accuracy, F1, CohenKappa, JaccardIndex, AUROC, AveragePrecision, ROC, ...) opens a
:class:`counting.Update` for the release's code it runs, when the metric has a book
(built while ``deferred_reports`` is applied) and ``TMPATCH_BINCOUNT`` is ``deferred``.
Unbinned curves keep the release's update: their states hold the kept values
themselves, so the removal of ignored positions is inherent there.

On the CPU (:func:`tmpatch.runtime.host.on_host`) an update is the release's update
(:func:`cpu_way`): there is no sync to save, and its counts and errors are then the release's
own, from its own statements. In deterministic mode (and where torch_xla is installed) the
release's ``_bincount`` compares every code with every bin (an N x minlength mesh:
``MulticlassAUROC(thresholds=50)`` of 1,000 scores, 250,000 bins): there an update whose classes
are all valid (read: free on the CPU) is recorded and counted plainly (``put``, deterministic on
the CPU), the same states; one with an invalid class is the release's (its mesh's counts).
"""
from __future__ import annotations

import sys
from types import ModuleType
from typing import Any, Callable

from tmpatch.patches.bincount.counting import RECORD, Update, active, current
from tmpatch.runtime import host
from tmpatch.runtime.compiled import compiling
from tmpatch.spec import Route, inline

#: torch.Tensor, torch.aminmax, the integer dtypes (bool not among them) and torch's
#: deterministic-mode query, bound when a replacement is built (no torch import here)
Tensor: Any = None
_AMINMAX: Any = None
_INTEGRAL: Any = frozenset()
_DETERMINISTIC: Any = None
#: True where the release's _bincount counts with a loop or a mesh on the CPU too (torch_xla
#: installed: ``_XLA_AVAILABLE``)
_MESH = False


def _mesh(data: Any) -> bool:
    """Whether the release's ``_bincount`` (module ``data``) counts with a mesh or a loop on the CPU
    too (torch_xla installed: ``_XLA_AVAILABLE``), as it does everywhere in deterministic mode."""
    return bool(getattr(data, "_XLA_AVAILABLE", False))


#: the ways of a CPU update (:func:`cpu_way`); 0 (falsy): recorded
RECORDED, RELEASE = 0, 1

#: the release's vectorised binned curves: binary up to 50,000 scores, multiclass up to
#: 1,000,000 scores x classes (every release 1.0.0-1.9.0; above, a loop counts without bincount)
BINARY_CURVE_CUT, MULTICLASS_CURVE_CUT = 50_000, 1_000_000


def _classes_valid(values: Any, low: int, high: int, ignore: Any) -> bool:
    """Every value in ``[low, high)``, or equal to ``ignore`` (an int, or None)."""
    if values.dtype not in _INTEGRAL or not values.numel():  # not bool, float or complex
        return False
    least, most = _AMINMAX(values)
    if least.item() >= low and most.item() < high:
        return True
    if ignore is None:
        return False
    least, most = _AMINMAX(values.masked_fill(values == ignore, low))
    return least.item() >= low and most.item() < high


def _valid(metric: Any, preds: Any, target: Any, curve: bool) -> bool:
    """Whether every class of ``update(preds, target)`` is valid (read on the CPU: free), so that
    the recorded update's plain count is the release's mesh's. Plain attribute reads."""
    get = metric.__dict__.get
    if curve and "thresholds" in metric.__dict__ and get("thresholds") is None:
        return False  # unbinned (binned thresholds are a buffer, not in __dict__): never recorded
    ignore = get("ignore_index")
    if ignore is not None and type(ignore) is not int:
        return False
    classes = get("num_classes")
    if "num_classes" in metric.__dict__ and type(classes) is not int:
        return False  # num_classes=None (1.9.0, micro), or not an int: the release's update
    if classes is not None:  # multiclass
        if classes < 1:
            return False
        top_k = get("top_k")  # stat scores only
        if top_k is not None and (top_k != 1 or get("multidim_average") != "global"):
            return False  # the one-hot branches: neither removal nor _bincount
        if preds.is_floating_point():
            dims = preds.ndim
            if dims != target.ndim + 1 or dims < 2 or preds.size(1) != classes:
                return False
        elif curve or preds.shape != target.shape or not _classes_valid(preds, 0, classes, None):
            return False
        return _classes_valid(target, 0, classes, ignore)
    if preds.shape != target.shape or (not preds.is_floating_point() and not _classes_valid(preds, 0, 2, None)):
        return False  # binary and multilabel
    return _classes_valid(target, 0, 2, ignore)


def cpu_way(metric: Any, preds: Any, target: Any, curve: bool) -> int:
    """How ``update(preds, target)`` of ``metric`` runs on the CPU (module docstring): the release's
    update, but in deterministic mode (or where the release counts with a mesh everywhere) for an
    update whose classes are all valid. ``curve``: a precision-recall curve's update. Always
    ``RECORDED`` while torch.compile traces, and off the CPU."""
    if compiling():
        return RECORDED
    if (type(preds) is not Tensor or type(target) is not Tensor or not host.on_host(preds)
            or not host.on_host(target)):
        return RECORDED
    if not (_MESH or _DETERMINISTIC()):
        return RELEASE  # torch.bincount: the release's own counts, errors and tracebacks
    return RECORDED if not preds.requires_grad and _valid(metric, preds, target, curve) else RELEASE


def _unsized(metric: Any) -> bool:
    """A multiclass metric built with ``num_classes=None`` other than the micro average of
    top-1 global stat scores, the one use the release takes it for (1.9.0; its update counts
    as if of 1 class, and fails or not as the release's does). Compiled: attribute reads (torch.compile
    guards each attribute alone, where a read of ``__dict__`` guards every entry); eager: ``__dict__``
    (a missing attribute of an nn.Module costs an exception)."""
    classes = getattr(metric, "num_classes", 0) if compiling() else metric.__dict__.get("num_classes", 0)
    if classes is not None:
        return False
    return not (getattr(metric, "average", None) == "micro" and getattr(metric, "top_k", None) == 1
                and getattr(metric, "multidim_average", None) == "global")


def _scores(metric: Any, preds: Any, target: Any) -> bool:
    """Whether ``update(preds, target)`` has scores that the formatter makes valid labels: one
    column per class for a multiclass metric (``(N, C, ...)``, ``C == num_classes``: argmax in
    ``[0, C)``), the target's shape for a binary one (a threshold: 0 or 1)."""
    if not (isinstance(preds, Tensor) and isinstance(target, Tensor) and preds.is_floating_point()):
        return False
    attributes = metric.__dict__
    classes = attributes.get("num_classes")
    if classes is None:  # binary (a multiclass metric with num_classes=None has its scores' argmax: any class)
        return "num_classes" not in attributes and "num_labels" not in attributes and preds.shape == target.shape
    return (type(classes) is int and preds.dim() >= 2 and preds.dim() == target.dim() + 1
            and preds.shape[1] == classes)


def _builder(curve: bool) -> Callable[[ModuleType], Callable[..., Any]]:
    def build(module: ModuleType) -> Callable[..., Any]:
        global Tensor, _AMINMAX, _INTEGRAL, _DETERMINISTIC, _MESH
        import torch

        Tensor, _AMINMAX = torch.Tensor, torch.aminmax
        _INTEGRAL = frozenset({torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64})
        _DETERMINISTIC = getattr(torch._C, "_get_deterministic_algorithms", torch.are_deterministic_algorithms_enabled)
        _MESH = _mesh(sys.modules.get("torchmetrics.utilities.data"))
        recorded = RECORD.deferred

        # installed itself (spec.inline: no wrapper's frame on every counting update), with the
        # release's parameters (every class update here is ``update(self, preds, target)``): calls
        # with a fixed argument list, no ``*args`` tuple to build and unpack
        def update(self: Any, preds: Any, target: Any, *, _tmpatch_route: Route) -> Any:
            original = _tmpatch_route.original
            if not _tmpatch_route.on:
                return original(self, preds, target)
            if cpu_way(self, preds, target, curve):
                return original(self, preds, target)
            if not active() or not recorded(self) or (curve and getattr(self, "thresholds", None) is None) \
                    or _unsized(self):
                return original(self, preds, target)
            # the labels shortcut reads the instance's __dict__: not while compiling (a guard on every
            # entry, the update count included, would recompile each step; a compiled step fuses anyway)
            token = current.set(Update(self, not curve and not compiling() and _scores(self, preds, target)))
            try:
                return original(self, preds, target)
            finally:
                current.reset(token)

        return inline(update)

    return build


#: stat scores and confusion matrices
build_update = _builder(curve=False)
#: precision-recall curves: binned ones only
build_curve_update = _builder(curve=True)
