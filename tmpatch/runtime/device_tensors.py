"""Host values made into device tensors without a host-to-device copy (shared by several patches).

``torch.tensor(3, device="cuda")`` builds the value in host memory and copies it to the
device: a blocking copy on every call. ``torch.full((), 3, dtype=torch.int64,
device="cuda")`` passes the value to a fill kernel as an argument: nothing is copied.
:func:`device_tensor` is ``torch.tensor(data, dtype=dtype, device=device)`` made that way
for Python numbers and flat sequences of them, with ``torch.tensor``'s dtype rules (bool,
int64, the default float dtype; ints given a floating dtype pass through a Python float,
as ``torch.tensor`` converts them), so the result is the same tensor, bit for bit. Other
data (tensors, numpy values, nested lists), CPU devices and values a fill cannot take
(``torch.tensor`` raises, or rounds where ``torch.full`` raises) take ``torch.tensor`` itself.
:func:`to_device` does the same for ``t.to(dtype=..., device=...)`` of a small CPU tensor
(its values converted on the host, then filled). Knows nothing of torchmetrics; imports
torch when first called.
"""
from __future__ import annotations

import re
from typing import Any, Callable, Optional, Tuple

from tmpatch.runtime import host

#: the most elements filled one by one (each element is one fill kernel)
MAX_FILLS = 16

_NUMBERS = (bool, int, float)
_built: Optional[Tuple[Callable[..., Any], Callable[..., Any]]] = None


def _build() -> Tuple[Callable[..., Any], Callable[..., Any]]:
    import torch

    tensor, full, empty, default_dtype = torch.tensor, torch.full, torch.empty, torch.get_default_dtype
    device_type = torch.device
    bool_, int64 = torch.bool, torch.int64
    floating = frozenset({torch.float16, torch.bfloat16, torch.float32, torch.float64})
    integral = frozenset({torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64})

    def inferred(kinds: frozenset) -> Any:
        if kinds <= {bool}:
            return bool_
        if kinds <= {bool, int}:
            return int64
        return default_dtype()

    def value(item: Any, dtype: Any) -> Any:
        return float(item) if dtype in floating else item

    def device_tensor(data: Any, dtype: Any = None, device: Any = None) -> Any:
        kind = type(data)
        if device is None:
            return tensor(data, dtype=dtype, device=device)
        where = device if type(device) is device_type else device_type(device)
        if host.host_device(where):
            return tensor(data, dtype=dtype, device=device)
        shape: Tuple[int, ...]
        if kind in _NUMBERS:
            items, shape = (data,), ()
        elif kind in (list, tuple, torch.Size) and 0 < len(data) <= MAX_FILLS \
                and all(type(item) in _NUMBERS for item in data):
            items, shape = tuple(data), (len(data),)
        else:
            return tensor(data, dtype=dtype, device=device)
        if dtype is None:
            dtype = inferred(frozenset(type(item) for item in items))
        elif dtype not in floating and (dtype not in integral or any(type(item) is float for item in items)):
            return tensor(data, dtype=dtype, device=device)  # conversions a fill may not share
        try:
            if not shape:
                return full((), value(data, dtype), dtype=dtype, device=where)
            out = empty(shape, dtype=dtype, device=where)
            for index, item in enumerate(items):
                out.select(0, index).fill_(value(item, dtype))
            return out
        except (RuntimeError, OverflowError, TypeError):  # e.g. a finite value too large for float32
            return tensor(data, dtype=dtype, device=device)

    def to_device(t: Any, dtype: Any, device: Any) -> Any:
        where = device if type(device) is device_type else device_type(device)
        if (host.host_device(where) or not t.is_cpu or t.numel() > MAX_FILLS or t.requires_grad
                or dtype not in floating | integral or t.dtype not in floating | integral):
            return t.to(dtype=dtype, device=device)
        converted = t.to(dtype=dtype)  # the release's conversion, on the host
        if dtype in floating and not bool(torch.isfinite(converted).all()):  # NaN payloads: keep the copy
            return t.to(dtype=dtype, device=device)
        out = empty(converted.shape, dtype=dtype, device=where)
        flat = out.view(-1)
        for index, item in enumerate(converted.reshape(-1).tolist()):
            flat.select(0, index).fill_(item)
        return out

    return device_tensor, to_device


def built() -> Tuple[Callable[..., Any], Callable[..., Any]]:
    """``(device_tensor, to_device)`` themselves (built once, when first asked): what a patch
    binds into its edited functions, one call layer less than the functions below."""
    global _built
    if _built is None:
        _built = _build()
    return _built


def device_tensor(data: Any, dtype: Any = None, device: Any = None) -> Any:
    """``torch.tensor(data, dtype=dtype, device=device)``, made on the device without a copy
    where ``data`` is a Python number or a flat list/tuple of up to :data:`MAX_FILLS` of them."""
    return built()[0](data, dtype=dtype, device=device)


def to_device(t: Any, dtype: Any, device: Any) -> Any:
    """``t.to(dtype=dtype, device=device)``, made on the device without a copy where ``t`` is a
    small CPU tensor (up to :data:`MAX_FILLS` finite values): converted on the host, then filled."""
    return built()[1](t, dtype, device)


def swap(statement: str) -> str:
    """``statement`` (release source) with its ``torch.tensor(`` / ``tensor(`` calls made
    ``_tmpatch_tensor(`` (bound to :func:`device_tensor` by the patch's names)."""
    return re.sub(r"(?<![\w.])(?:torch\.)?tensor\(", "_tmpatch_tensor(", statement)
