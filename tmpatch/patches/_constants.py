"""Device constants made once per device, not on every update (shared by several patches).

A patch whose update needs a fixed tensor (a 0-d fill value, a table of codes, zeros to
count into) takes it from here: made on its first use on a device, then the same tensor,
never written into, for every later update there. The cache is bounded
(:data:`MAX_ENTRIES`, oldest first out) and kept free of simulated tensors by the sync
audit (``tmpatch.audit.oracle.caches``). Knows nothing of torchmetrics; imports torch when first
called.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Hashable, Tuple

#: at most this many constants are kept (all devices, all kinds); the oldest go first
MAX_ENTRIES = 256

#: (kind, key..., device) -> the constant
_CACHE: Dict[Tuple[Hashable, ...], Any] = {}


def cached(key: Tuple[Hashable, ...], make: Callable[[], Any]) -> Any:
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
