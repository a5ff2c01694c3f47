"""A simulated audit leaves no fake tensor in the module-level caches of device tensors
(tmpatch/audit/oracle/caches.py): seen on a GPU, where PermutationInvariantTraining's cached
permutations, made during a simulated audit, were used by the next real update."""
from __future__ import annotations

import sys

import torch
from torch._subclasses.fake_tensor import FakeTensor

from tmpatch.audit.oracle import caches
from tmpatch.audit.sweep.run import run_sweep


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _tensors(item)


def _dict_caches():
    return {name: cache for name in caches.CACHES
            if isinstance(cache := caches._cache(*name), dict)}


def test_sweep_of_cached_tables_leaves_no_fake_tensor_and_keeps_the_users_entries():
    import torchmetrics.functional.audio.pit as pit  # noqa: F401 - the cache's module, imported

    import tmpatch.patches.panoptic_matching  # noqa: F401

    users = torch.arange(2)
    pit._ps_dict["2user"] = users  # an entry of the user's: kept, the same object
    try:
        run_sweep(["PermutationInvariantTraining", "PanopticQuality", "ModifiedPanopticQuality"])
        found = _dict_caches()
        assert ("torchmetrics.functional.audio.pit", "_ps_dict") in found
        fakes = [name for name, cache in found.items()
                 if any(isinstance(t, FakeTensor) for v in cache.values() for t in _tensors(v))]
        assert fakes == []
        assert pit._ps_dict["2user"] is users
    finally:
        pit._ps_dict.pop("2user", None)
        tmpatch.revert()


def test_lru_caches_that_gained_entries_are_cleared(monkeypatch):
    import functools
    import types

    module = types.ModuleType("tmpatch_test_cached")

    @functools.lru_cache
    def table(device):
        return torch.zeros(2, device=device)

    module.table = table
    monkeypatch.setitem(sys.modules, module.__name__, module)
    monkeypatch.setattr(caches, "CACHES", caches.CACHES + ((module.__name__, "table"),))
    table("cpu")
    with caches.kept():
        table("cpu")  # a hit: nothing new
    assert table.cache_info().currsize == 1
    with caches.kept():
        table("meta")
    assert table.cache_info().currsize == 0

