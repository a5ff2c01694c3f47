"""nominal_bincount: the nominal-association metrics count their contingency table without a device read.

Defect: CramersV, PearsonsContingencyCoefficient, TheilsU and TschuprowsT fill their
``num_classes x num_classes`` table in ``update()`` with
``_multiclass_confusion_matrix_update``, that is with ``_bincount``: on CUDA,
``torch.bincount`` reads the input's minimum and maximum back to the host to size its
output (two syncs per update), although the size is known. With
``nan_strategy="drop"``, ``_handle_nan_in_data`` also removes the rows holding a NaN
with a boolean index (a data-dependent shape: one more sync). Not fixed upstream
(1.9.0 included).

Repair, on the ``bincount`` patch's counting (which it requires):

* the four classes' ``update`` opens a recorded update of the ``bincount`` patch
  (when the metric has a deferred-report book, ``TMPATCH_BINCOUNT`` is ``deferred``
  and the ``bincount`` patch is in effect): the release's
  ``_multiclass_confusion_matrix_update`` then counts into the table's fixed number
  of bins on the device, as it does for MulticlassConfusionMatrix;
* ``nan_strategy="drop"``: the removal in ``_handle_nan_in_data`` becomes a mark (an
  edit of that one statement, :mod:`tmpatch.engine.rewrite`): the NaN rows stay in place and
  are left out of the counts, as ``ignore_index`` positions are;
* ``nan_strategy="replace"`` (the default): integer categories, which hold no NaN, are
  not copied by ``nan_to_num`` (an edit of that statement; the copies were only read);
* on the CPU the release's update runs (a read costs no sync there): its counts and its
  errors, from its own statements; in deterministic mode, where the release's
  ``_bincount`` compares every code with every bin, an update of integer categories all
  in ``[0, num_classes)`` is recorded (a plain count, the same table), any other the release's.

Results are the release's on valid input (categories in ``[0, num_classes)``; floats
with integer values). On a device a value outside the categories counts where the
release's ``_bincount`` counts it (the ``bincount`` patch's codes), and one that would make
the release raise (a negative code, one past the table) is reported at the next
``compute()`` in the release's words (the ``bincount`` patch's report). Not covered (the release's code
runs): the functional API (``cramers_v`` ...), the ``*_matrix`` functions, metrics built
before ``apply()``. FleissKappa makes no sync.

Releases: 0.11.0-1.9.0 (the nominal metrics came in 0.11.0: nothing to repair in 0.10);
one implementation of each class ``update``, two of ``_handle_nan_in_data``, differing in
an annotation.
"""
from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import Any, Callable, Dict, Tuple

from tmpatch.patches.bincount import counting
from tmpatch.runtime import host, wrappers
from tmpatch.runtime.compiled import compiling
from tmpatch.spec import PATCHED, Decline, Edit, Label, Patch, Rewrite, Route, Target, Variant, inline, since, span

_CONFUSION = "torchmetrics.functional.classification.confusion_matrix"




def _host(preds: Any, target: Any) -> bool:
    """Whether ``preds`` and ``target`` are CPU tensors (the release's update runs there)."""
    return (type(preds) is Tensor and type(target) is Tensor and host.on_host(preds)
            and host.on_host(target))


def _categories(metric: Any, preds: Any, target: Any, integral: Any, aminmax: Any) -> bool:
    """Whether ``preds`` and ``target`` are 1-D integer tensors of one shape whose values are all
    categories in ``[0, num_classes)`` (read on the CPU: free)."""
    num_classes = metric.__dict__.get("num_classes")
    if (preds.dtype not in integral or target.dtype not in integral or type(num_classes) is not int
            or preds.dim() != 1 or preds.shape != target.shape or not preds.numel()):
        return False
    for values in (preds, target):
        low, high = aminmax(values)
        if low.item() < 0 or high.item() >= num_classes:
            return False
    return True


#: torch.Tensor, bound when the update is built (no torch import at module level)
Tensor: Any = None


def build_update(module: ModuleType) -> Callable[..., Any]:
    """A nominal class ``update``: a recorded update of the ``bincount`` patch, when that
    patch is in effect (its ``_multiclass_confusion_matrix_update`` layer is active)."""
    global Tensor

    import torch

    Tensor = torch.Tensor
    confusion = importlib.import_module(_CONFUSION)
    recorded, active, current, Update = counting.RECORD.deferred, counting.active, counting.current, counting.Update
    integral = frozenset({torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64})
    aminmax = getattr(torch, "aminmax", None)
    deterministic = getattr(torch._C, "_get_deterministic_algorithms", torch.are_deterministic_algorithms_enabled)
    # where the release's _bincount counts with a loop or a mesh on the CPU too (torch_xla installed)
    mesh = bool(getattr(sys.modules.get("torchmetrics.utilities.data"), "_XLA_AVAILABLE", False))

    # installed itself (spec.inline: no wrapper's frame), with the release's parameters (every
    # nominal class update is ``update(self, preds, target)``)
    def update(self: Any, preds: Any, target: Any, *, _tmpatch_route: Route) -> Any:
        original = _tmpatch_route.original
        if not _tmpatch_route.on:
            return original(self, preds, target)
        if not compiling() and _host(preds, target):
            # the CPU: the release's update (its counts, its errors), but in deterministic mode (the
            # release's mesh) for categories all valid, which a recorded update counts plainly
            if not (mesh or deterministic()) or aminmax is None \
                    or not _categories(self, preds, target, integral, aminmax):
                return original(self, preds, target)
        if (not recorded(self) or not active()
                or not wrappers.is_patched(confusion._multiclass_confusion_matrix_update)):
            return original(self, preds, target)
        token = current.set(Update(self))
        try:
            return original(self, preds, target)
        finally:
            current.reset(token)

    return inline(update)


def drop_nan_rows(preds: Any, target: Any, rows: Any) -> Tuple[Any, Any]:
    """``preds[~rows], target[~rows]`` (the release's removal), or, in a recorded update,
    every row, those holding a NaN marked to be left out of the counts (set to 0)."""
    update = counting.current.get()
    if update is None or preds.shape != target.shape or rows.shape != preds.shape or update.skip is not None:
        return preds[~rows], target[~rows]
    update.skip = rows
    return preds.masked_fill(rows, 0), target.masked_fill(rows, 0)


def replace_nan(preds: Any, target: Any, value: Any) -> Tuple[Any, Any]:
    """``preds.nan_to_num(value), target.nan_to_num(value)`` (the release's replacement), or
    ``preds`` and ``target`` themselves where both are integer tensors: they hold no NaN,
    and the release's copies are only read afterwards (by the confusion-matrix update)."""
    if preds.is_floating_point() or target.is_floating_point() or preds.is_complex() or target.is_complex():
        return preds.nan_to_num(value), target.nan_to_num(value)
    return preds, target


def _names(module: ModuleType) -> Dict[str, Any]:
    return {"_tmpatch_drop_nan_rows": drop_nan_rows, "_tmpatch_replace_nan": replace_nan}


#: ``nan_strategy="drop"``: the boolean removal, kept in place during recorded updates;
#: ``"replace"``: integer categories not copied (nothing to replace in them)
DROP = Rewrite(
    (Edit("return preds[~rows_contain_nan], target[~rows_contain_nan]",
          "return _tmpatch_drop_nan_rows(preds, target, rows_contain_nan)"),
     Edit("if nan_strategy == 'replace':\n    return preds.nan_to_num(nan_replace_value), "
          "target.nan_to_num(nan_replace_value)",
          "if nan_strategy == 'replace':\n    return _tmpatch_replace_nan(preds, target, nan_replace_value)")),
    _names,
)


#: the nominal metrics, from 0.11.0
_NOMINAL = since("0.11.0")


def _update(module: str, qualname: str, fingerprint: str) -> Target:
    return Target(module=module, qualname=qualname, variants=(Variant(span("0.11.0", "1.9.0"), fingerprint,
                                                                      build_update),), present=_NOMINAL)


PATCH = Patch(
    name="nominal_bincount",
    summary="CramersV, PearsonsContingencyCoefficient, TheilsU and TschuprowsT count their table with "
            "torch.bincount (CUDA reads min and max) and drop NaN rows with a boolean index; counted in fixed bins",
    known=since("0.10.0"),
    declines=(Decline(span("0.10.0", "0.10.3"), "nothing to repair: the nominal metrics came in 0.11.0",
                      needed=False),),
    upstream="not fixed upstream (the nominal updates call the confusion-matrix update and _bincount)",
    changes="a category outside [0, num_classes) is left out of the table and reported once at the next "
            "compute() (upstream counts it in another cell or raises in update())",
    requires=("deferred_reports", "bincount"),
    labels=(
        Label(PATCHED, "nan_strategy='drop': rows holding a NaN removed with a boolean index before counting; the "
              "nominal_bincount patch leaves them out of the counts instead",
              function="_handle_nan_in_data", op="aten.index"),
    ),
    targets=(
        _update("torchmetrics.nominal.cramers", "CramersV.update", "525a7845dddcfd95"),
        _update("torchmetrics.nominal.pearson", "PearsonsContingencyCoefficient.update", "cadae512a5d7fa91"),
        _update("torchmetrics.nominal.theils_u", "TheilsU.update", "ef4ae5c48150829f"),
        _update("torchmetrics.nominal.tschuprows", "TschuprowsT.update", "57218027dfcef521"),
        Target(
            module="torchmetrics.functional.nominal.utils",
            qualname="_handle_nan_in_data",
            variants=(
                Variant(span("0.11.0", "1.5.2"), "10107520fa192509", DROP),
                Variant(span("1.6.0", "1.9.0"), "50e996c6b5e64d73", DROP),  # annotation only
            ),
            present=_NOMINAL,
        ),
    ),
)
