"""mean_default_weight: ``MeanMetric.update`` makes scalars on the device, not by copy.

Defect: up to 1.6.1 ``MeanMetric.update(value, weight=1.0)`` turns the default
weight into a tensor with ``torch.as_tensor(1.0, device=self.device)``: a
host-to-device copy on every update of a CUDA metric. Upstream changed the
default to ``None`` (``torch.ones_like(value)``) in 1.6.2 (PR #2943). On every
release a Python scalar ``value`` or ``weight`` (``update(3.5)``) takes the same
copy; that is not fixed upstream.

Releases: every release from 1.0.0 (four implementations of ``update``): Python
``float``/``int``/``bool`` values and weights are made with ``torch.full`` on the
metric's device, in the dtype the release uses. On 1.0.0 they are then handed to
the release's own ``update``. From 1.0.1 the body of ``update`` is one piece of
code on every release and the replacement runs it itself, with less host work
(``benchmarks/overhead.txt``): a weight that already has the value's shape is
not wrapped in a ``broadcast_to`` view, and the two states are written to the
instance dict, where ``Module.__setattr__`` would put them, without its checks
(a class with a ``__setattr__`` of its own, and any input the release would
convert itself, get the release's ``update``). Results are identical. The same
conversion inside ``BaseAggregator._cast_and_nan_check_input`` (Sum/Max/Min/Cat)
belongs to the ``nan_check`` patch.
"""
from __future__ import annotations

from types import ModuleType
from typing import Any, Callable, Dict, Optional

from tmpatch.spec import Label, PATCHED, Patch, Target, Variant, since, span

_SCALARS = (float, int, bool)


def _builder(
    default_weight: Optional[float], dtype_of: Callable[[Any], Any], body: bool = True
) -> Callable[[ModuleType], Callable]:
    """``dtype_of(metric)``: the dtype the release gives Python scalars. ``body``:
    the release's update is the one of 1.0.1-1.9.0, which the fast path repeats."""

    def build(module: ModuleType) -> Callable[..., Any]:
        import torch

        full, ones_like, broadcast_to, Tensor = torch.full, torch.ones_like, torch.broadcast_to, torch.Tensor
        plain_setattr = module.Metric.__setattr__
        fast: Dict[type, bool] = {}

        def update(original: Callable, self: Any, value: Any, weight: Any = default_weight) -> Any:
            if type(value) in _SCALARS:
                value = full((), value, dtype=dtype_of(self), device=self.device)
            if type(weight) in _SCALARS:
                weight = full((), weight, dtype=dtype_of(self), device=self.device)
            cls = self.__class__
            ok = fast.get(cls)
            if ok is None:
                ok = fast[cls] = body and cls.__setattr__ is plain_setattr
            if not ok or not isinstance(value, Tensor):
                return original(self, value, weight)
            if weight is None:
                if default_weight is not None:  # up to 1.6.1 the release fails on it: let it
                    return original(self, value, weight)
                weight = ones_like(value)
            elif not isinstance(weight, Tensor):
                return original(self, value, weight)
            # the release's body from here; a weight of the value's shape needs no broadcast view
            shape = value.shape
            if weight.shape != shape:
                weight = broadcast_to(weight, shape)
            value, weight = self._cast_and_nan_check_input(value, weight)
            if value.numel() == 0:
                return None
            # the states are plain tensor attributes: Module.__setattr__ would store them in the
            # instance dict, as this does without its checks (the in-place += is the release's)
            states = self.__dict__
            states["mean_value"] += (value * weight).sum()
            states["weight"] += weight.sum()
            return None

        return update

    return build


def _float32(metric: Any) -> Any:
    import torch

    return torch.float32


def _metric_dtype(metric: Any) -> Any:
    return metric.dtype


PATCH = Patch(
    name="mean_default_weight",
    summary="MeanMetric's default weight and Python-scalar inputs made on the device",
    known=since("1.0.0"),
    upstream="default weight fixed in 1.6.2 by PR #2943; scalar inputs not fixed upstream",
    labels=(
        Label(PATCHED, "Python scalar or default weight copied from the host; fixed by the mean_default_weight patch",
              function="update|_cast_and_nan_check_input", file="torchmetrics/aggregation.py", op="aten._to_copy",
              kind="host-to-device copy"),
    ),
    targets=(
        Target(
            module="torchmetrics.aggregation",
            qualname="MeanMetric.update",
            variants=(
                Variant(span("1.0.0"), "6e3f5c74bfe0fd1f", _builder(1.0, _float32, body=False)),
                Variant(span("1.0.1", "1.3.1"), "ce34105c60359a1f", _builder(1.0, _float32)),
                Variant(span("1.3.2", "1.6.1"), "3d99c072344ed130", _builder(1.0, _metric_dtype)),
                Variant(span("1.6.2", "1.9.0"), "d269d0596e64f1e5", _builder(None, _metric_dtype)),
            ),
        ),
    ),
)
