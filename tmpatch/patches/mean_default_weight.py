"""mean_default_weight: ``MeanMetric.update`` makes scalars on the device, not by copy.

Defect: up to 1.6.1 ``MeanMetric.update(value, weight=1.0)`` turns the default
weight into a tensor with ``torch.as_tensor(1.0, device=self.device)``: a
host-to-device copy on every update of a CUDA metric. Upstream changed the
default to ``None`` (``torch.ones_like(value)``) in 1.6.2 (PR #2943). On every
release a Python scalar ``value`` or ``weight`` (``update(3.5)``) takes the same
copy; that is not fixed upstream.

Releases: every release from 1.0.0 (four implementations of ``update``): Python
``float``/``int``/``bool`` values and weights are made with ``torch.full`` on the
metric's device, in the dtype the release uses, then handed to the release's
own ``update``. Results are identical. The same conversion inside
``BaseAggregator._cast_and_nan_check_input`` (Sum/Max/Min/Cat) belongs to the
``nan_check`` patch.
"""
from __future__ import annotations

from types import ModuleType
from typing import Any, Callable, Optional

from tmpatch.spec import Patch, Target, Variant

_SCALARS = (float, int, bool)


def _builder(default_weight: Optional[float], dtype_of: Callable[[Any], Any]) -> Callable[[ModuleType], Callable]:
    """``dtype_of(metric)``: the dtype the release gives Python scalars."""

    def build(module: ModuleType) -> Callable[..., Any]:
        import torch

        full = torch.full

        def update(original: Callable, self: Any, value: Any, weight: Any = default_weight) -> Any:
            if type(value) in _SCALARS:
                value = full((), value, dtype=dtype_of(self), device=self.device)
            if type(weight) in _SCALARS:
                weight = full((), weight, dtype=dtype_of(self), device=self.device)
            return original(self, value, weight)

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
    known=">=1.0.0",
    upstream="default weight fixed in 1.6.2 by PR #2943; scalar inputs not fixed upstream",
    targets=(
        Target(
            module="torchmetrics.aggregation",
            qualname="MeanMetric.update",
            variants=(
                Variant("1.0.0", "6e3f5c74bfe0fd1f", _builder(1.0, _float32)),
                Variant("1.0.1-1.3.1", "ce34105c60359a1f", _builder(1.0, _float32)),
                Variant("1.3.2-1.6.1", "3d99c072344ed130", _builder(1.0, _metric_dtype)),
                Variant("1.6.2-1.9.0", "d269d0596e64f1e5", _builder(None, _metric_dtype)),
            ),
        ),
    ),
)
