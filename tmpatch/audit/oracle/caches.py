"""Module-level caches of device tensors, kept free of simulated tensors.

A simulated audit runs the release's code on fake tensors of device ``cuda:0``. A cache
keyed by the device (``str(device)``, or the device itself) would keep those fake tensors
and hand them to real code of the same process afterwards: on a real GPU, the next update
would compute with tensors that have no values (seen on an H200: PermutationInvariantTraining
after an audit). :func:`kept` notes the caches below before a simulation and puts them back
after it: a dictionary gets its entries back exactly; a ``functools.lru_cache`` that gained
entries is cleared (the release then builds its table again, as on first use).
"""
from __future__ import annotations

import contextlib
import sys
from typing import Any, Dict, Iterator, Tuple

#: (module, attribute): dictionaries and lru_cache'd functions whose values hold device tensors;
#: a module not imported yet is skipped (it has nothing cached)
CACHES: Tuple[Tuple[str, str], ...] = (
    ("torchmetrics.functional.audio.pit", "_ps_dict"),  # speaker permutations per device
    ("torchmetrics.functional.segmentation.utils", "get_neighbour_tables"),
    ("torchmetrics.functional.segmentation.utils", "table_surface_area"),
    ("torchmetrics.functional.audio.srmr", "_calc_erbs"),
    ("torchmetrics.functional.audio.srmr", "_make_erb_filters"),
    ("torchmetrics.functional.audio.srmr", "_compute_modulation_filterbank_and_cutoffs"),
    ("tmpatch.patches.panoptic_matching", "_tables"),  # category tables per device
    ("tmpatch.patches._constants", "_CACHE"),  # fill values, code tables, zeros per device
)


def _cache(module: str, attr: str) -> Any:
    loaded = sys.modules.get(module)
    return None if loaded is None else getattr(loaded, attr, None)


def _state(cache: Any) -> Any:
    if isinstance(cache, dict):
        return dict(cache)
    info = getattr(cache, "cache_info", None)
    return info().misses if callable(info) else None


@contextlib.contextmanager
def kept() -> Iterator[None]:
    """Leave the caches of :data:`CACHES` as they were before the block."""
    before: Dict[Tuple[str, str], Any] = {name: _state(_cache(*name)) for name in CACHES}
    try:
        yield
    finally:
        for name in CACHES:
            cache, old = _cache(*name), before[name]
            if isinstance(cache, dict):
                cache.clear()  # the same entries, the same objects
                cache.update(old or {})
            elif callable(getattr(cache, "cache_clear", None)) and _state(cache) != old:
                cache.cache_clear()
