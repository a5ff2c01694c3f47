"""mean_default_weight: ``MeanMetric.update`` makes scalars on the device, not by copy.

Defect: up to 1.6.1 (0.10 and 0.11 too) ``MeanMetric.update(value, weight=1.0)`` turns the default
weight into a tensor with ``torch.as_tensor(1.0, device=self.device)``: a
host-to-device copy on every update of a CUDA metric. Upstream changed the
default to ``None`` (``torch.ones_like(value)``) in 1.6.2 (PR #2943). On every
release a Python scalar ``value`` or ``weight`` (``update(3.5)``) takes the same
copy; that is not fixed upstream.

Releases: every release from 0.10.0 (five implementations of ``update``). The
wrapper makes Python ``float``/``int``/``bool`` values and weights with
``torch.full`` on the metric's device, in the dtype the release would give them,
and hands them to the release's own ``update``. An integer outside int64 keeps the
release's conversion. A weight of 1 with a tensor value (the default up to 1.6.1) is
made in the value's shape, as the release's ``broadcast_to`` gives it (float32/64, up to
2**24 elements, where a sum of ones is exact in any order; in eager code: dynamo 2.1
traced 1.0.0's paired value/weight checks wrongly with it; up to 1.0.0 not where the release's
check removes a NaN of the value, ``warn`` and ``ignore``). The same conversion inside
``BaseAggregator._cast_and_nan_check_input`` (Sum/Max/Min/Cat) is ``nan_check``'s.
"""
from __future__ import annotations

from types import ModuleType
from typing import Any, Callable, Optional

from tmpatch.runtime.compiled import compiling
from tmpatch.spec import PATCHED, Label, Patch, Target, Variant, since, span

_SCALARS = (float, int, bool)
#: the strategies whose check removes the NaN elements (of the value alone, up to 1.0.0)
_REMOVING = ("warn", "ignore")
_INT64 = (-(2**63), 2**63)
#: a weight of ones up to this many elements sums exactly in float32 (and float64), in any order
EXACT_ONES = 2 ** 24


def _builder(default_weight: Optional[float], metric_dtype: bool,
             paired: bool = True) -> Callable[[ModuleType], Callable]:
    """``default_weight``: the release's default (1.0 up to 1.6.1, None after);
    ``metric_dtype``: the release makes scalars in ``self.dtype`` (1.3.2+), else float32;
    ``paired``: the release checks the value and the weight in one call (1.0.1+). Up to 1.0.0 it
    checks each on its own, so its check removes a NaN of the value alone (``warn``, ``ignore``):
    a weight in the value's shape would no longer broadcast to it, and stays 0-d there."""

    def build(module: ModuleType) -> Callable[..., Any]:
        import torch

        full, float32, tensor = torch.full, torch.float32, torch.Tensor
        exact = frozenset({torch.float32, torch.float64})

        def scalar(value: Any) -> bool:
            return type(value) in _SCALARS and (type(value) is float or _INT64[0] <= value < _INT64[1])

        def update(original: Callable, self: Any, value: Any, weight: Any = default_weight) -> Any:
            value_scalar, weight_scalar = scalar(value), scalar(weight)
            if value_scalar or weight_scalar:
                dtype = self.dtype if metric_dtype else float32
                device = self.device
                if value_scalar:  # an int through a Python float, as ``as_tensor`` takes it
                    value = full((), float(value) if dtype.is_floating_point else value, dtype=dtype, device=device)
                if weight_scalar and not compiling() and weight == 1 and type(value) is tensor \
                        and dtype in exact and value.numel() <= EXACT_ONES \
                        and (paired or self.nan_strategy not in _REMOVING):
                    # the release's broadcast of the weight, made whole: ones sum exactly in any order, and
                    # the check after it (nan_check) takes a weight of the value's shape as it is
                    weight = full(value.shape, 1.0, dtype=dtype, device=device)
                elif weight_scalar:
                    weight = full((), float(weight) if dtype.is_floating_point else weight, dtype=dtype,
                                  device=device)
            return original(self, value, weight)

        return update

    return build


PATCH = Patch(
    name="mean_default_weight",
    summary="MeanMetric.update copies its default weight (up to 1.6.1) and Python-scalar inputs from the host",
    known=since("0.10.0"),
    upstream="default weight fixed in 1.6.2 by PR #2943; scalar inputs not fixed upstream",
    changes="nothing but the copy: states and results are the release's",
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
                # 0.10.0-0.11.0: a fall-back for torch without ``broadcast_to`` (< 1.8), never taken here
                Variant(span("0.10.0", "0.11.0"), "f41e9f37f0d97773", _builder(1.0, metric_dtype=False, paired=False)),
                Variant(span("0.11.1", "1.0.0"), "6e3f5c74bfe0fd1f", _builder(1.0, metric_dtype=False, paired=False)),
                Variant(span("1.0.1", "1.3.1"), "ce34105c60359a1f", _builder(1.0, metric_dtype=False)),
                Variant(span("1.3.2", "1.6.1"), "3d99c072344ed130", _builder(1.0, metric_dtype=True)),
                Variant(span("1.6.2", "1.9.0"), "d269d0596e64f1e5", _builder(None, metric_dtype=True)),
            ),
        ),
    ),
)
