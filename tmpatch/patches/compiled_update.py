"""compiled_update: metric updates inside ``torch.compile`` without a crash, a recompile per
step, or a graph break in the update's own code.

Defects (every release, not fixed upstream; torchmetrics issue #1780):

* ``Metric._wrap_update``: ``self._update_count += 1`` on every ``update()``. torch.compile
  treats an integer attribute of an ``nn.Module`` as a constant: a traced update guards on
  its value and recompiles at every step, until the recompile limit sends the whole step
  back to eager. While the update itself broke the graph this stayed hidden; once it
  traces cleanly it is the first thing a compiled step meets. Repair: when compiling,
  the increment runs outside the graph (one graph break, no value guard); eager code
  runs the release's statement.
* ``torchmetrics.utilities.compute.normalize_logits_if_needed`` (1.6.1+): on the CPU it
  decides with ``if not torch.all((tensor >= 0) * (tensor <= 1))`` (a graph break).
  Repair: when compiling, the same test selects on the device (``torch.where`` of the
  whole tensor, as the release's CUDA branch does, with the CPU branch's condition, so
  a tensor holding NaN is normalised as on the CPU). Eager code is the release's.
* ``_bincount`` reads ``_XLA_AVAILABLE``, a lazy ``RequirementCache``: traced for the
  first time inside torch.compile, its package lookup fails (torch 2.6+:
  ``InternalTorchDynamoError: PackageNotFoundError ... torch_xla``). Repair: the cache
  is filled when the patch is applied (what the release's first ``_bincount`` does), and
  its answer, a bool, stands in for it in ``torchmetrics.utilities.data`` until
  ``revert()`` (its ``__bool__`` also cost two Python calls per ``_bincount``).

Releases: 1.0.0-1.9.0 (``_wrap_update`` unchanged throughout); ``normalize_logits_if_needed``
1.6.1+ (two implementations). Results are the release's, bit for bit, in eager code.
"""
from __future__ import annotations

import sys
from types import ModuleType
from typing import Any, Callable, Dict

from tmpatch import compiled, settings
from tmpatch.spec import Edit, Patch, Rewrite, Target, Variant, since, span


def _increment(metric: Any) -> None:
    metric._update_count += 1


#: the increment, run eagerly from compiled code (a graph break: nothing to guard on)
_OUTSIDE = compiled.Outside(_increment)


def _count(metric: Any) -> None:
    """The release's ``self._update_count += 1``, in compiled code (policy ``update_count``)."""
    if settings.policy.get("update_count", "outside") == "traced":
        with compiled.dynamic_ints():
            metric._update_count += 1
    else:
        _OUTSIDE(metric)


def _update_names(module: ModuleType) -> Dict[str, Any]:
    return {"_tmpatch_compiling": compiled.compiling, "_tmpatch_count": _count}


UPDATE_COUNT = Rewrite(
    (Edit("self._update_count += 1\n",
          "if _tmpatch_compiling():\n    _tmpatch_count(self)\nelse:\n    self._update_count += 1\n"),),
    _update_names,
)

_CPU_CHECK = (
    "if not torch.all((tensor >= 0) * (tensor <= 1)):\n"
    "    tensor = tensor.sigmoid() if normalization == \"sigmoid\" else torch.softmax(tensor, dim=1)\n"
)


def _normalize_names(module: ModuleType) -> Dict[str, Any]:
    import torch

    where, softmax = torch.where, torch.softmax

    def normalized(tensor: Any, normalization: Any) -> Any:
        """The CPU branch's choice, made on the device: all in [0, 1] (NaN is not) keeps the tensor."""
        inside = ((tensor >= 0) & (tensor <= 1)).all()
        return where(inside, tensor, tensor.sigmoid() if normalization == "sigmoid" else softmax(tensor, dim=1))

    return {"_tmpatch_compiling": compiled.compiling, "_tmpatch_normalized": normalized}


NORMALIZE = Rewrite(
    (Edit(_CPU_CHECK,
          "if _tmpatch_compiling() and tensor.is_floating_point():\n"
          "    tensor = _tmpatch_normalized(tensor, normalization)\n"
          "el" + _CPU_CHECK),),
    _normalize_names,
)


#: ``(module, the release's RequirementCache, the bool put in its place)`` while applied
_XLA: list = []


def _after_apply() -> None:
    """Fill ``_XLA_AVAILABLE``'s lazy cache (one package lookup, as the first ``_bincount`` does)
    and put its answer, a bool, in ``torchmetrics.utilities.data`` in its place: the cache's
    ``__bool__`` is two Python calls on every ``_bincount`` (every counting update), and a bool
    is what dynamo reads best. ``revert()`` puts the release's object back."""
    data = sys.modules.get("torchmetrics.utilities.data")
    flag = getattr(data, "_XLA_AVAILABLE", None)
    if flag is None or isinstance(flag, bool) or _XLA:
        return
    try:
        answer = bool(flag)
    except Exception:  # noqa: BLE001 - the release's own lookup; it will run (and fail) as before
        return
    data._XLA_AVAILABLE = answer  # type: ignore[union-attr]
    _XLA.append((data, flag, answer))


def _after_revert() -> None:
    while _XLA:
        data, flag, answer = _XLA.pop()
        if getattr(data, "_XLA_AVAILABLE", None) is answer:
            data._XLA_AVAILABLE = flag


PATCH = Patch(
    name="compiled_update",
    summary="inside torch.compile, Metric's update count recompiles every step, the CPU logits check breaks "
            "the graph and _bincount's lazy XLA check crashes (torch 2.6+)",
    known=since("1.0.0"),
    upstream="torchmetrics #1780 (update count guards); not fixed upstream",
    changes="a compiled update has one graph break, where the update count is incremented",
    after_apply=_after_apply,
    after_revert=_after_revert,
    targets=(
        Target(
            module="torchmetrics.metric",
            qualname="Metric._wrap_update",
            variants=(Variant(span("1.0.0", "1.9.0"), "204d7412e16fe670", UPDATE_COUNT),),
        ),
        Target(
            module="torchmetrics.utilities.compute",
            qualname="normalize_logits_if_needed",
            variants=(
                Variant(span("1.6.1", "1.8.0"), "c17f98a03d640c3a", NORMALIZE),
                Variant(span("1.8.1", "1.9.0"), "9d1392c3b6f01613", NORMALIZE),
            ),
            present=since("1.6.1"),
        ),
    ),
)
