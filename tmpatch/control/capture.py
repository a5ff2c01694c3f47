"""A metric's (or a MetricCollection's) ``update`` as one compiled call, captured in a CUDA graph.

For a model that is not compiled itself::

    update = tmpatch.capture(metrics)      # a Metric or a MetricCollection, after tmpatch.apply()
    for preds, target in loader:
        update(preds, target)              # the first call compiles; later ones replay
    metrics.compute()                      # deferred reports (NaN, bad classes) come here

:func:`capture` compiles ``target.update`` with ``torch.compile`` (``fullgraph=True``,
static shapes, ``mode="reduce-overhead"``: inductor records the graph in a CUDA graph
when the tensors are on a GPU and replays it on later calls, one launch). The first call
fixes the arguments' signature (each tensor's shape, dtype and device, every other
argument's value); a call with another signature (the last, shorter batch) runs the
release's eager ``update`` instead of compiling again, as does every call while the
target cannot be captured (a metric with list states, whose length grows each step).

What a CUDA graph needs of the update, and what makes it so:

* no sync and no host value in the update: the patches' device-side code; the update
  count is added on the device (``compiled_update``, policy ``device``);
* the same addresses at every replay: in compiled code a state the update replaces by a
  new tensor of the same shape, dtype and device (``self.tp = self.tp + tp``,
  ``MaxMetric``'s ``torch.max``) is written into the tensor it replaced
  (``compiled_update``), so the metric never holds a tensor of the graph's own memory
  (the next replay would overwrite it); dynamo takes a module's tensors for static
  inputs, which a CUDA graph may update in place;
* no autograd: tensor arguments are detached (an update runs without grad unless a
  metric asks for it, ``_enable_grad``, when they are passed as given).

Needs ``compiled_update`` applied (the other patches remove the syncs); on the CPU the
same call compiles with inductor, without a graph. Not run on a GPU here.
"""
from __future__ import annotations

import itertools
import logging
import types
from typing import Any, Dict, Hashable, List, Optional

import torch

from tmpatch.patches import compiled_update

log = logging.getLogger("tmpatch")

#: numbers the compiled functions of captures apart
_numbers = itertools.count(1)


def _signature(value: Any) -> Hashable:
    """What a compiled call's guards would check of one argument: a tensor's shape, dtype,
    device and grad flag; a container's items; any other value itself (or its identity)."""
    if isinstance(value, torch.Tensor):
        return ("tensor", tuple(value.shape), value.dtype, value.device, value.requires_grad)
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_signature(item) for item in value))
    if isinstance(value, dict):
        return ("dict", tuple((key, _signature(item)) for key, item in value.items()))
    try:
        hash(value)
    except TypeError:
        return ("object", id(value))
    return ("value", type(value), value)


def _detached(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach()
    if isinstance(value, (list, tuple)):
        return type(value)(_detached(item) for item in value)
    if isinstance(value, dict):
        return {key: _detached(item) for key, item in value.items()}
    return value


def _metrics_of(target: Any) -> List[Any]:
    from torchmetrics import Metric

    return [module for module in target.modules() if isinstance(module, Metric)]


class Captured:
    """The callable :func:`capture` returns: ``captured(*args, **kwargs)`` updates the target.

    ``signature``: the arguments' signature the compiled call was made for (None before the
    first call); ``replays`` / ``fallbacks``: calls run compiled / eagerly; ``reason``: why
    every call runs eagerly ('' when the target can be captured); ``options``: what
    ``torch.compile`` was given."""

    def __init__(self, target: Any, options: Dict[str, Any]) -> None:
        self.target = target
        self.options = dict(options)
        self.metrics = _metrics_of(target)
        self.signature: Optional[Hashable] = None
        self.replays = 0
        self.fallbacks = 0
        self.reason = ""
        lists = [f"{type(m).__name__}.{name}" for m in self.metrics for name, default in m._defaults.items()
                 if isinstance(default, list)]
        if lists:
            self.reason = f"list states grow at every update ({', '.join(lists)}): run eagerly"
            log.info("tmpatch.capture: %s", self.reason)
        update = target.update

        def captured_update(*args: Any, **kwargs: Any) -> None:
            update(*args, **kwargs)

        # a code object of its own: torch.compile keeps its compiled graphs per code object, and
        # the graphs of every capture would otherwise count against one recompile limit
        code = captured_update.__code__.replace(co_name=f"captured_update_{next(_numbers)}")
        own = types.FunctionType(code, captured_update.__globals__, code.co_name, None, captured_update.__closure__)
        self._compiled = torch.compile(own, **options)

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        if not any(getattr(m, "_enable_grad", False) for m in self.metrics):
            args, kwargs = _detached(args), _detached(kwargs)
        if self.reason:
            self.fallbacks += 1
            return self.target.update(*args, **kwargs)
        signature = (_signature(args), _signature(kwargs))
        if self.signature is None:
            self.signature = signature
        elif signature != self.signature:
            self.fallbacks += 1
            return self.target.update(*args, **kwargs)
        self.replays += 1
        return self._compiled(*args, **kwargs)

    def __repr__(self) -> str:
        return (f"Captured({type(self.target).__name__}, replays={self.replays}, fallbacks={self.fallbacks}"
                + (f", eager: {self.reason}" if self.reason else "") + ")")


def capture(target: Any, **options: Any) -> Captured:
    """``target.update`` (a Metric or a MetricCollection) compiled and, on a GPU, captured in a
    CUDA graph (module docstring). ``options`` go to ``torch.compile`` over the defaults
    ``fullgraph=True, dynamic=False`` and, with the inductor backend, ``mode="reduce-overhead"``."""
    if not compiled_update.live():
        raise RuntimeError("tmpatch.capture needs the compiled_update patch applied (tmpatch.apply())")
    chosen: Dict[str, Any] = {"fullgraph": True, "dynamic": False}
    chosen.update(options)
    if chosen.get("backend", "inductor") == "inductor" and "options" not in chosen:
        chosen.setdefault("mode", "reduce-overhead")
    return Captured(target, chosen)
