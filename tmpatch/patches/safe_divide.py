"""safe_divide: ``torchmetrics.utilities.compute._safe_divide`` without a host copy.

Defect: every release before 1.9.0 makes the zero-division value on the host
and copies it to the device on each call (upstream issue #2638, "Accuracy
incurs a GPU/CPU sync point"; 1.4.1-1.8.2 use a non-blocking copy from
pageable memory, which read uninitialised values on MPS, issue #3095). On
1.0.0-1.3.2 it writes ``1`` into the caller's denominator instead.
Fixed upstream in 1.9.0 (PR #3284: ``torch.full((), zd, dtype, device)``).

Releases: 0.10.0-1.8.2 patched, one replacement per upstream implementation,
each with that release's results; 1.9.0 not needed. The deliberate correction:
on 0.10.0-1.3.2 the caller's denominator is no longer written into. There the
write is a ``masked_fill_`` (no sync), but it reaches metric states: ExactMatch's
``compute()`` hands its ``total`` state over as the denominator, so a compute
before any update (total 0) set the state to 1 and every later result was off.
The ``zero_division="warn"`` check (1.6.2+) still reads the device, as upstream.
"""
from __future__ import annotations

from types import ModuleType
from typing import Any, Callable

from tmpatch.spec import PATCHED, Label, Patch, Target, Variant, since, span


def _build_1_0(module: ModuleType) -> Callable[..., Any]:
    """0.10.0-1.3.2: a zero denominator counts as 1 (the result is ``num``)."""

    def _safe_divide(original: Callable, num: Any, denom: Any) -> Any:
        denom = denom.masked_fill(denom == 0.0, 1)  # upstream writes this into the caller's tensor
        num = num if num.is_floating_point() else num.float()
        denom = denom if denom.is_floating_point() else denom.float()
        return num / denom

    return _safe_divide


def _where_builder(float32_value: bool) -> Callable[[ModuleType], Callable[..., Any]]:
    """1.4.0 (``float32_value``: the zero-division value is float32 whatever
    ``num``'s dtype) and 1.4.1-1.6.1 (it takes ``num``'s dtype)."""

    def build(module: ModuleType) -> Callable[..., Any]:
        import torch

        full, where = torch.full, torch.where
        float32 = torch.float32

        def _safe_divide(original: Callable, num: Any, denom: Any, zero_division: float = 0.0) -> Any:
            if type(zero_division) not in (float, int, bool):
                return original(num, denom, zero_division)
            num = num if num.is_floating_point() else num.float()
            denom = denom if denom.is_floating_point() else denom.float()
            dtype = float32 if float32_value else num.dtype
            return where(denom != 0, num / denom, full((), zero_division, dtype=dtype, device=num.device))

        return _safe_divide

    return build


_build_1_4_0 = _where_builder(float32_value=True)
_build_1_4_1 = _where_builder(float32_value=False)


def _build_1_6_2(module: ModuleType) -> Callable[..., Any]:
    """1.6.2-1.8.2: adds ``zero_division="warn"`` and ``"nan"`` (true division)."""
    import torch

    full, where, any_ = torch.full, torch.where, torch.any
    rank_zero_warn = module.rank_zero_warn

    def _safe_divide(original: Callable, num: Any, denom: Any, zero_division: Any = 0.0) -> Any:
        kind = type(zero_division)
        if kind is str:
            if zero_division != "warn":
                return original(num, denom, zero_division)
        elif kind not in (float, int, bool):
            return original(num, denom, zero_division)
        num = num if num.is_floating_point() else num.float()
        denom = denom if denom.is_floating_point() else denom.float()
        if zero_division == "warn":
            if any_(denom == 0):  # a device read, only on this argument, as upstream
                rank_zero_warn("Detected zero division in _safe_divide. Setting 0/0 to 0.0")
            zero_division = 0.0
        return where(denom != 0, num / denom, full((), zero_division, dtype=num.dtype, device=num.device))

    return _safe_divide


PATCH = Patch(
    name="safe_divide",
    summary="zero-division value made on the device; the caller's denominator left untouched",
    known=since("0.10.0"),
    upstream="#2638, #3095; fixed in 1.9.0 by PR #3284",
    changes=("results are the release's; on 0.10.0-1.3.2 the caller's denominator is no longer overwritten with 1 "
             "(a deliberate correction)"),
    labels=(
        Label(PATCHED, "zero-division value copied from the host; fixed by the safe_divide patch",
              function="_safe_divide", file="torchmetrics/utilities/compute.py"),
    ),
    targets=(
        Target(
            module="torchmetrics.utilities.compute",
            qualname="_safe_divide",
            variants=(
                Variant(span("0.10.0", "1.3.2"), "0e62cc1d6fb198c4", _build_1_0),
                Variant(span("1.4.0", "1.4.0.post0"), "ae4b3c92c1cf40cb", _build_1_4_0),
                Variant(span("1.4.1", "1.6.1"), "954abe7992a46ba4", _build_1_4_1),
                Variant(span("1.6.2", "1.7.1"), "181ef5e1e741cc4d", _build_1_6_2),
                # 1.7.2 only adds MPS's blocking copy: the same replacement serves
                Variant(span("1.7.2", "1.8.2"), "7d926d5bf5873125", _build_1_6_2),
                Variant(span("1.9.0"), "7c522f23c2047f74"),
            ),
        ),
    ),
)
