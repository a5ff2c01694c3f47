"""cumsum_device: ``torchmetrics.utilities.data._cumsum`` returns to the input's GPU.

Defect: in deterministic mode, for a floating CUDA tensor, ``_cumsum`` computes
on the CPU and comes back with ``.cuda()``: the *current* GPU, not
``x.device``. A metric on ``cuda:1`` gets its curve on ``cuda:0`` (upstream
issue #2608). Fixed upstream in 1.4.1 (PR #2636: ``.to(x.device)``).

Releases: 1.0.0-1.4.0.post0 patched (two implementations, differing only in
the warning text, which is kept); 1.4.1 onwards not needed. The CPU round trip
itself (a device read, inherent to that fallback) is kept, as are the results.
"""
from __future__ import annotations

import sys
from types import ModuleType
from typing import Any, Callable, Optional

from tmpatch.spec import INHERENT, PATCHED, Decline, Label, Patch, Target, Variant, since, span

_MESSAGE_1_0_0 = (
    "You are trying to use a metric in deterministic mode on GPU that uses `torch.cumsum` which is currently"
    "not supported. Instead the tensor will be casted to CPU, compute the `cumsum` and then casted back to GPU"
    "Expect some slowdowns."
)
_MESSAGE_1_0_2 = (
    "You are trying to use a metric in deterministic mode on GPU that uses `torch.cumsum`, which is currently "
    "not supported. The tensor will be copied to the CPU memory to compute it and then copied back to GPU. "
    "Expect some slowdowns."
)


def _builder(message: str) -> Callable[[ModuleType], Callable[..., Any]]:
    def build(module: ModuleType) -> Callable[..., Any]:
        import torch

        rank_zero_warn = module.rank_zero_warn
        warning_class = module.TorchMetricsUserWarning
        deterministic = torch.are_deterministic_algorithms_enabled
        cumsum = torch.cumsum

        def _cumsum(original: Callable, x: Any, dim: Optional[int] = 0, dtype: Any = None) -> Any:
            if deterministic() and x.is_cuda and x.is_floating_point() and sys.platform != "win32":
                rank_zero_warn(message, warning_class)
                return x.cpu().cumsum(dim=dim, dtype=dtype).to(x.device)
            return cumsum(x, dim=dim, dtype=dtype)  # type: ignore[arg-type]  # None: torch's own error, as unpatched

        return _cumsum

    return build


PATCH = Patch(
    name="cumsum_device",
    summary="deterministic-mode cumsum comes back to the input's GPU, not the current one",
    known=since("0.10.0"),
    declines=(Decline(span("0.10.0", "0.11.4"),
                      "nothing to repair: 0.10-0.11 have no _cumsum (their curves call torch.cumsum, no round trip)",
                      needed=False),),
    upstream="#2608; fixed in 1.4.1 by PR #2636",
    changes=("in deterministic mode a curve computed on cuda:N stays on cuda:N (was: the current GPU); values are "
             "the release's"),
    labels=(
        Label(PATCHED, "deterministic _cumsum returns to the current GPU (#2608); fixed by the cumsum_device patch",
              function="_cumsum", file="torchmetrics/utilities/data.py", kind="device mismatch"),
        Label(INHERENT, "deterministic _cumsum falls back to the CPU (torch has no deterministic CUDA cumsum)",
              function="_cumsum", kind=".* copy"),
    ),
    targets=(
        Target(
            module="torchmetrics.utilities.data",
            qualname="_cumsum",
            variants=(
                Variant(span("1.0.0", "1.0.1"), "0ac548a8ec839c7d", _builder(_MESSAGE_1_0_0)),
                Variant(span("1.0.2", "1.4.0.post0"), "30360914fff754a6", _builder(_MESSAGE_1_0_2)),
                Variant(span("1.4.1", "1.6.0"), "a31ceaadf0d3041d"),
                Variant(span("1.6.1", "1.9.0"), "ae94888b645386a7"),
            ),
        ),
    ),
)
