"""gather_autograd with a faked process group (no processes, every release).

``torch.distributed.all_gather/get_rank/get_world_size/barrier`` and
``torch.distributed.group.WORLD`` are replaced by :class:`FakeGroup`: a group
of ``len(peers)`` ranks seen from one of them, whose rank *in the group*
differs from its global rank (and whose world is larger than the group), so a
patch that used the global rank or the world size would put the local tensor
in the wrong slot. The real multi-process runs are in tests/distributed.
"""
from __future__ import annotations

import types
from typing import Any, List, Optional

import pytest
import torch
import torch.distributed as dist

import tmpatch


def _release_in(spec: str) -> bool:
    import torchmetrics
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    return Version(torchmetrics.__version__) in SpecifierSet(spec, prereleases=True)


DEFECTIVE = _release_in(">=0.10.0,<1.6.0")


class _Handle:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<fake group {self.name}>"


class FakeGroup:
    """``peers[i]``: what group rank ``i`` passes; this process is group rank
    ``rank``, global rank ``global_rank``, in a world of ``world_size``."""

    def __init__(self, monkeypatch: Any, peers: List[torch.Tensor], rank: int, global_rank: int, world_size: int):
        self.peers, self.rank, self.global_rank, self.world_size = peers, rank, global_rank, world_size
        self.handle, self.world = _Handle("sub"), _Handle("WORLD")
        self.calls: List[str] = []
        monkeypatch.setattr(dist, "all_gather", self.all_gather)
        monkeypatch.setattr(dist, "get_rank", self.get_rank)
        monkeypatch.setattr(dist, "get_world_size", self.get_world_size)
        monkeypatch.setattr(dist, "barrier", self.barrier)
        monkeypatch.setattr(dist, "group", types.SimpleNamespace(WORLD=self.world))

    def _is_group(self, group: Any) -> bool:
        if self.rank == self.global_rank and len(self.peers) == self.world_size:
            return group is None or group is self.world or group is self.handle  # the group is the world
        return group is self.handle

    def get_rank(self, group: Any = None) -> int:
        return self.rank if self._is_group(group) else self.global_rank

    def get_world_size(self, group: Any = None) -> int:
        return len(self.peers) if self._is_group(group) else self.world_size

    def barrier(self, group: Any = None, **kwargs: Any) -> None:
        assert self._is_group(group), f"barrier on {group!r}"
        self.calls.append("barrier")

    def all_gather(self, tensor_list: List[torch.Tensor], tensor: torch.Tensor, group: Any = None,
                   async_op: bool = False):
        assert self._is_group(group), f"all_gather on {group!r}"
        assert len(tensor_list) == len(self.peers)
        local = self.peers[self.rank]
        sizes = (
            tensor.dtype == torch.long and local.ndim > 0 and tuple(tensor.shape) == (local.ndim,)
            and tensor.tolist() == list(local.shape) and not local.dtype == torch.long
        )
        with torch.no_grad():  # like c10d: no autograd through the collective
            for i, peer in enumerate(self.peers):
                if sizes:
                    tensor_list[i].copy_(torch.tensor(peer.shape))
                else:
                    padded = torch.zeros(tensor.shape, dtype=peer.dtype)
                    padded[tuple(slice(n) for n in peer.shape)] = peer.detach()
                    tensor_list[i].copy_(padded)
            assert torch.equal(tensor_list[self.rank], tensor.detach()), "local contribution differs"
        self.calls.append("sizes" if sizes else "data")


def _peers(case: str, size: int, rank: int) -> List[torch.Tensor]:
    gen = torch.Generator().manual_seed(len(case) * 10 + size)
    if case == "scalar":
        shapes = [()] * size
    elif case == "equal":
        shapes = [(3, 2)] * size
    elif case == "uneven":
        shapes = [(i + 1, 2) for i in range(size)]
    elif case == "empty-local":  # this rank's state is empty
        shapes = [(0, 2) if i == rank else (i + 1, 2) for i in range(size)]
    elif case == "empty-peer":  # another rank's state is empty
        shapes = [(0, 2) if i == (rank + 1) % size else (i + 1, 2) for i in range(size)]
    elif case == "noncontiguous":
        shapes = [(i + 2, 2) for i in range(size)]
    else:
        raise ValueError(case)
    peers = [torch.randn(shape, generator=gen) for shape in shapes]
    if case == "noncontiguous":
        peers[rank] = torch.randn(2, shapes[rank][0], generator=gen).t()
    peers[rank].requires_grad_(True)
    return peers


#: (group kind, group size, group rank, global rank, world size)
GROUPS = {
    "world": (3, 1, 1, 3),
    "subgroup": (3, 1, 2, 4),  # group rank 1 is global rank 2 of a world of 4
    "subgroup-rank0": (2, 0, 3, 4),
}
CASES = ("scalar", "equal", "uneven", "empty-local", "empty-peer", "noncontiguous")


def _gather(monkeypatch: Any, case: str, kind: str, simple: bool = False):
    from torchmetrics.utilities import distributed as tmd

    size, rank, global_rank, world = GROUPS[kind]
    peers = _peers(case, size, rank)
    fake = FakeGroup(monkeypatch, peers, rank, global_rank, world)
    group: Optional[Any] = None if kind == "world" else fake.handle
    x = peers[rank]
    if simple:
        got = tmd._simple_gather_all_tensors(x, fake.handle if group is None else group, size)
    else:
        got = tmd.gather_all_tensors(x, group) if group is not None else tmd.gather_all_tensors(x)
    return x, rank, peers, got, fake


def _check_values(got: List[torch.Tensor], peers: List[torch.Tensor]) -> None:
    assert len(got) == len(peers)
    for i, (value, peer) in enumerate(zip(got, peers)):
        assert value.shape == peer.shape and torch.equal(value.detach(), peer.detach()), f"entry {i}"


@pytest.mark.parametrize("kind", list(GROUPS))
@pytest.mark.parametrize("case", CASES)
def test_gather_all_tensors(monkeypatch, case, kind):
    x, rank, peers, before, _ = _gather(monkeypatch, case, kind)
    _check_values(before, peers)  # the release's own values on this torch

    tmpatch.apply("gather_autograd")
    x2, _, peers2, after, fake = _gather(monkeypatch, case, kind)
    assert fake.calls[0] == "barrier" and fake.calls.count("data") == 1

    # values: the release's own
    for a, b in zip(after, before):
        assert torch.equal(a.detach(), b.detach())
    _check_values(after, peers2)
    # the local entry: the caller's tensor (its contiguous version), at its rank in the group
    if case == "noncontiguous":
        assert after[rank] is not x2 and after[rank].is_contiguous() and after[rank].grad_fn is not None
    else:
        assert after[rank] is x2
    if kind != "world":
        _, _, global_rank, _ = GROUPS[kind]
        assert global_rank != rank and all(t is not x2 for i, t in enumerate(after) if i != rank)
    assert [t.requires_grad for t in after] == [i == rank for i in range(len(after))]
    torch.stack([t.sum() for t in after]).sum().backward()
    assert x2.grad is not None and torch.equal(x2.grad, torch.ones_like(x2))

    # unpatched: 1.0-1.5.2 lose the graph (issue #2745); 1.6.0+ keep it themselves
    if DEFECTIVE:
        assert all(t is not x for t in before) and not any(t.requires_grad for t in before)
    else:
        assert before[rank] is x or case == "noncontiguous"
        assert before[rank].requires_grad


@pytest.mark.parametrize("kind", list(GROUPS))
@pytest.mark.parametrize("case", ("scalar", "equal"))
def test_simple_gather_all_tensors(monkeypatch, case, kind):
    x, rank, peers, before, _ = _gather(monkeypatch, case, kind, simple=True)
    tmpatch.apply("gather_autograd")
    x2, _, peers2, after, _ = _gather(monkeypatch, case, kind, simple=True)
    for a, b in zip(after, before):
        assert torch.equal(a.detach(), b.detach())
    _check_values(after, peers2)
    assert after[rank] is x2
    assert [t.requires_grad for t in after] == [i == rank for i in range(len(after))]
    assert (before[rank] is x) is (not DEFECTIVE)


def test_status_and_bindings():
    from torchmetrics import Metric
    from torchmetrics.utilities import distributed as tmd

    originals = (tmd.gather_all_tensors, tmd._simple_gather_all_tensors)
    report = tmpatch.apply("gather_autograd")
    row = report["gather_autograd"]
    if DEFECTIVE:
        assert row.state == "applied", row
        assert tmpatch.is_patched(tmd.gather_all_tensors) and tmpatch.is_patched(tmd._simple_gather_all_tensors)
        assert Metric._sync_dist.__defaults__[0] is tmd.gather_all_tensors  # the default argument is rebound
        assert tmpatch.get_original(tmd.gather_all_tensors) is originals[0]
    else:
        assert row.state == "not-needed", row
        assert "upstream fix" in row.reason
        assert (tmd.gather_all_tensors, tmd._simple_gather_all_tensors) == originals
    tmpatch.revert()
    assert tmd.gather_all_tensors is originals[0] and tmd._simple_gather_all_tensors is originals[1]
    defaults = Metric._sync_dist.__defaults__
    assert defaults[0] is None or defaults[0] is originals[0]


def test_metric_sync_keeps_the_local_graph(monkeypatch):
    """Metric._sync_dist with its default dist_sync_fn: the synced state of a
    metric keeps the graph of the local state (the path of dist_sync_on_step)."""
    from torchmetrics import Metric

    class Total(Metric):
        full_state_update = False

        def __init__(self) -> None:
            super().__init__()
            self.add_state("total", default=torch.tensor(0.0), dist_reduce_fx="sum")

        def update(self, x: torch.Tensor) -> None:
            self.total = self.total + x

        def compute(self) -> torch.Tensor:
            return self.total

    def synced() -> Any:
        x = torch.tensor(2.0, requires_grad=True)
        local = x * 3  # this rank's state, a function of its inputs
        fake = FakeGroup(monkeypatch, [torch.tensor(1.0), local, torch.tensor(4.0)], 1, 2, 4)
        metric = Total()
        metric.total = local
        metric._sync_dist(process_group=fake.handle)
        return x, metric.total

    x, before = synced()
    tmpatch.apply("gather_autograd")
    x2, after = synced()
    assert torch.equal(before.detach(), after.detach()) and after.item() == 1.0 + 6.0 + 4.0
    after.backward()
    assert x2.grad is not None and x2.grad.item() == 3.0
    assert before.requires_grad is (not DEFECTIVE)


def _torch_warns_on_a_list_of_slices() -> bool:
    """Whether this torch warns when indexing with a list of slices (recent torch: deprecated)."""
    import warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        torch.zeros(2, 2)[[slice(None), slice(0, 1)]]
    return any("non-tuple sequence" in str(w.message) for w in seen)


@pytest.mark.skipif(not _release_in("<1.9.0"), reason="1.9.0 indexes with a tuple of slices")
def test_release_padded_path_on_this_torch(monkeypatch):
    """Up to 1.8.2 the padded path trims with ``gathered[idx][slice_param]``, a
    *list* of slices. torch reads a list of slices as a tuple; recent torch (2.13)
    warns that this is deprecated (it says the meaning changes in "2.9"), older torch
    (2.1, 2.5) says nothing. Values are right; the warning, where this torch gives it,
    is the release's own behaviour, and tmpatch leaves it as it is."""
    if _torch_warns_on_a_list_of_slices():
        with pytest.warns(UserWarning, match="non-tuple sequence for multidimensional indexing"):
            x, rank, peers, got, _ = _gather(monkeypatch, "uneven", "subgroup")
    else:
        x, rank, peers, got, _ = _gather(monkeypatch, "uneven", "subgroup")
    _check_values(got, peers)


class _Outsider:
    """A rank that is not a member of the group: c10d answers -1 for its rank and
    world size and skips the collectives."""

    def __init__(self, monkeypatch: Any) -> None:
        self.handle = _Handle("sub")
        monkeypatch.setattr(dist, "get_rank", lambda group=None: -1 if group is self.handle else 0)
        monkeypatch.setattr(dist, "get_world_size", lambda group=None: -1 if group is self.handle else 4)
        monkeypatch.setattr(dist, "barrier", lambda group=None, **kw: None)
        monkeypatch.setattr(dist, "all_gather", lambda tensor_list, tensor, group=None, async_op=False: None)
        monkeypatch.setattr(dist, "group", types.SimpleNamespace(WORLD=_Handle("WORLD")))


def _outcome(fn: Any) -> str:
    try:
        return f"list of {len(fn())}"
    except Exception as exc:  # noqa: BLE001
        return type(exc).__name__


def test_rank_outside_the_group(monkeypatch):
    from torchmetrics.utilities import distributed as tmd

    outsider = _Outsider(monkeypatch)
    before = _outcome(lambda: tmd.gather_all_tensors(torch.tensor(1.0), group=outsider.handle))
    tmpatch.apply("gather_autograd")
    after = _outcome(lambda: tmd.gather_all_tensors(torch.tensor(1.0), group=outsider.handle))
    assert after == before
