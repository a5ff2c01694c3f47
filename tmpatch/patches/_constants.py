"""Device constants made once per device, not on every update (shared by several patches).

A patch whose update needs a fixed tensor (a 0-d fill value, a table of codes, zeros to
count into) takes it from here: made on its first use on a device, then the same tensor,
never written into, for every later update there. The cache is bounded
(:data:`MAX_ENTRIES`, oldest first out) and kept free of simulated tensors by the sync
audit (``tmpatch.audit.oracle.caches``). Knows nothing of torchmetrics; imports torch when first
called.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Tuple

from tmpatch.runtime.compiled import compiling

#: at most this many constants are kept (all devices, all kinds); the oldest go first
MAX_ENTRIES = 256

#: (kind, key..., device) -> the constant
_CACHE: Dict[Tuple[Any, ...], Any] = {}  # keys: tuples of hashables


def cached(key: Tuple[Any, ...], make: Callable[[], Any]) -> Any:
    """The constant of ``key`` (which names its device), made by ``make()`` on first use."""
    found = _CACHE.get(key)
    if found is None:
        found = make()
        if len(_CACHE) >= MAX_ENTRIES:
            del _CACHE[next(iter(_CACHE))]
        _CACHE[key] = found
    return found


def full(value: Any, dtype: Any, device: Any) -> Any:
    """A 0-d tensor of ``value`` in ``dtype`` on ``device`` (a fill, no host copy), made once."""
    key = ("full", type(value), value, dtype, device)
    found = _CACHE.get(key)
    if found is not None:
        return found
    import torch

    return cached(key, lambda: torch.full((), value, dtype=dtype, device=device))


def operand(value: Any, like: Any) -> Any:
    """``value`` (a Python number) as the other operand of ``torch.where(mask, like, value)``:
    eager, where the number keeps ``like``'s dtype (a float beside a float or complex tensor, an
    int beside a signed one), a 0-d constant of that dtype on ``like``'s device (:func:`full`);
    otherwise, and in code torch.compile traces, the number itself. The same result: ``where``
    makes the number's 0-d tensor in that dtype itself, on the device, at every call (a fill
    kernel more)."""
    dtype = like.dtype
    kind = type(value)
    if (dtype.is_floating_point or dtype.is_complex if kind is float else kind is int and dtype.is_signed) \
            and not compiling():
        return full(value, dtype, like.device)
    return value
