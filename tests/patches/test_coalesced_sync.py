"""coalesced_sync in one process, on every release of the matrix.

* the plan lists exactly the tensors the release's own ``_sync_dist`` hands its
  ``dist_sync_fn`` (recorded through a user-supplied function, which keeps the
  release's path), for every kind of state, on every ``_sync_dist``
  implementation;
* on a gloo process group of one rank: the same values, bit for bit, in 2
  all_gathers where the release makes 31 (a metric) or 21 (a collection), and
  the local entry keeps its autograd graph exactly where the release (or
  ``gather_autograd``) keeps it;
* the header cannot be taken for anything an unpatched rank sends;
* status, revert, and code not recognised.

Real multi-rank runs are in tests/distributed/test_coalesced_sync_ddp.py.
"""
from __future__ import annotations

import os
import time
from typing import Any, List

import pytest
import torch
import torch.distributed as dist

import tmpatch
from tests.conftest import release_in, torch_at_least
from tests.distributed.coalesce_workers import COLLECTIVES, Counter, classes, collection
from tests.distributed.test_coalesced_sync_ddp import assert_same

KEEPS_GRAPH = release_in(">=1.6.0")
#: the patch applies from torch 2.5 (below, its status says why not: test_torch_too_old_leaves_the_release)
needs_torch_2_5 = pytest.mark.skipif(not torch_at_least(2, 5), reason="coalesced_sync needs torch 2.5 or later")


@pytest.fixture
def world_of_one(tmp_path):
    """A gloo process group of one rank in this process, and a collective counter."""
    import torch.distributed as dist

    saved = {name: getattr(dist, name) for name in COLLECTIVES if hasattr(dist, name)}
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        yield Counter()
    finally:
        for name, value in saved.items():
            setattr(dist, name, value)
        # torch 2.5's ProcessGroupGloo destructor joins its worker threads holding the GIL; a
        # worker still freeing the last collective's output tensor (a Python object: it needs
        # the GIL) then waits forever (seen in CI, both torch 2.5.1 runs). Let it finish first.
        dist.barrier()
        time.sleep(0.1)
        dist.destroy_process_group()


def _mixed(rows: int = 2, **kwargs: Any) -> Any:
    metric = classes()["Mixed"](**kwargs)
    for step in range(2):
        metric.update("unit", step, 0, rows)
    return metric


def _rules() -> Any:
    """The rules the patch builds from what the gating recognised of the loaded release."""
    from tmpatch.control import api, gating
    from tmpatch.patches import coalesced_sync

    state, reason, found = api._recognise(coalesced_sync.PATCH)
    assert state == "applied", reason
    return coalesced_sync._rules(gating.recognised(coalesced_sync.PATCH, found, api._original))


@pytest.mark.parametrize("rows", [0, 1, 2])
def test_plan_is_what_the_release_hands_its_dist_sync_fn(rows):
    """0 rows: empty ``cat`` lists (1.4.0+: an empty float tensor; before: nothing);
    1 row: a one-element list (not pre-concatenated); 2: pre-concatenated."""
    from tmpatch.patches.coalesced_sync.plan import STATE, plan

    metric = _mixed(rows)
    entries = plan(metric, _rules())
    seen: List[torch.Tensor] = []

    def record(tensor: torch.Tensor, group: Any = None) -> List[torch.Tensor]:
        seen.append(tensor)
        return [tensor]

    metric._sync_dist(record)  # a user-supplied function: the release's own path
    assert len(entries) == len(seen)
    for entry, tensor in zip(entries, seen):
        assert (entry.tensor.shape, entry.tensor.dtype, entry.tensor.device) == (tensor.shape, tensor.dtype,
                                                                                 tensor.device), entry.key
        assert torch.equal(entry.tensor, tensor), entry.key
        assert entry.matches(tensor), entry.key
        assert (entry.kind == STATE) == (tensor is entry.tensor), entry.key
    keys = [entry.key for entry in entries]
    assert ("preds" in keys) == (rows > 0 or release_in(">=1.4.0"))


@needs_torch_2_5
def test_status_bindings_and_revert():
    from torchmetrics import Metric, MetricCollection

    originals = (vars(Metric)["_sync_dist"], vars(MetricCollection)["compute"])
    report = tmpatch.apply("coalesced_sync")
    assert report["coalesced_sync"].state == "applied", report["coalesced_sync"]
    assert tmpatch.is_patched(vars(Metric)["_sync_dist"]) and tmpatch.is_patched(vars(MetricCollection)["compute"])
    assert tmpatch.get_original(vars(Metric)["_sync_dist"]) is originals[0]
    tmpatch.revert()
    assert (vars(Metric)["_sync_dist"], vars(MetricCollection)["compute"]) == originals
    assert vars(Metric)["_sync_dist"] is originals[0]


def test_unknown_gather_is_left_alone(monkeypatch):
    """A ``gather_all_tensors`` of unknown code (here another tool's): the gating leaves the patch
    alone, says why, and nothing of it is installed (no builder runs)."""
    import torchmetrics.utilities.distributed as distributed
    from torchmetrics import Metric, MetricCollection

    def gather_all_tensors(result: Any, group: Any = None) -> List[Any]:
        return [result]

    originals = (vars(Metric)["_sync_dist"], vars(MetricCollection)["compute"])
    monkeypatch.setattr(distributed, "gather_all_tensors", gather_all_tensors)
    row = tmpatch.apply("coalesced_sync")["coalesced_sync"]
    assert row.state == "mismatch", row
    assert "relies on torchmetrics.utilities.distributed.gather_all_tensors, whose code is not recognised" \
        in row.reason, row
    assert (vars(Metric)["_sync_dist"], vars(MetricCollection)["compute"]) == originals


def test_gather_is_recognised_underneath_a_tmpatch_layer(monkeypatch):
    """The gating fingerprints the release's ``gather_all_tensors``, not what is in its place:
    under tmpatch's own layer (``gather_autograd``) the release's code is the one recognised."""
    import torchmetrics
    import torchmetrics.utilities.distributed as distributed

    from tmpatch.control import api, gating
    from tmpatch.patches import coalesced_sync

    release, version = distributed.gather_all_tensors, torchmetrics.__version__

    def layer(result: Any, group: Any = None) -> List[Any]:  # code of its own, as a wrapper has
        return release(result, group)

    monkeypatch.setattr(distributed, "gather_all_tensors", layer)
    patch = coalesced_sync.PATCH

    def original(target: Any) -> Any:  # what the engine answers while its layer is in place
        return release if target is coalesced_sync.GATHER_ALL else api._original(target)

    state, reason, found = gating.recognise(patch, version, original)
    assert state == "applied", reason
    told = gating.recognised(patch, found, original)
    assert told[coalesced_sync.GATHER_ALL.path] in coalesced_sync.GATHER
    assert told[coalesced_sync.SYNC_DIST_PATH] in coalesced_sync.SYNC_DIST


def test_rules_cover_every_sync_dist_variant():
    from tmpatch.patches import coalesced_sync

    target = next(t for t in coalesced_sync.PATCH.targets if t.path == coalesced_sync.SYNC_DIST_PATH)
    assert {v.fingerprint for v in target.variants} == set(coalesced_sync.SYNC_DIST)


@pytest.mark.skipif(torch_at_least(2, 5), reason="torch 2.5 or later: the patch applies")
def test_torch_too_old_leaves_the_release():
    from torchmetrics import Metric, MetricCollection

    originals = (vars(Metric)["_sync_dist"], vars(MetricCollection)["compute"])
    row = tmpatch.apply("coalesced_sync")["coalesced_sync"]
    assert row.state == "failed" and "needs torch 2.5 or later" in row.reason, row
    assert (vars(Metric)["_sync_dist"], vars(MetricCollection)["compute"]) == originals


def test_without_a_process_group_nothing_changes():
    metric = _mixed()
    tmpatch.apply("coalesced_sync")
    value = metric.compute()  # not distributed: no sync at all, as the release
    assert not metric._is_synced and torch.equal(value["total"], metric.total)


def _run(counter: Counter, build: Any) -> Any:
    subject = build()
    counter.take()
    value = subject.compute()
    return value, counter.take()


@needs_torch_2_5
@pytest.mark.parametrize("what", ["metric", "collection", "groups"])
def test_world_of_one_values_and_collectives(world_of_one, what):
    def build() -> Any:
        if what == "metric":
            return _mixed()
        coll = collection("issue" if what == "collection" else "groups")
        coll.update(value=torch.arange(3.0), preds=torch.tensor([0, 1, 2]), target=torch.tensor([0, 2, 2]))
        return coll

    expected, release_calls = _run(world_of_one, build)
    tmpatch.apply("coalesced_sync")
    got, calls = _run(world_of_one, build)
    assert_same(got, expected, what)
    assert calls == ["all_gather", "all_gather"]
    assert len(release_calls) == {"metric": 31, "collection": 21, "groups": 45}[what], release_calls


@needs_torch_2_5
def test_world_of_one_conjugate_and_negative_views(world_of_one):
    """States that are lazy negative or conjugate views are sent as their values. The
    release gathers a negative view; it cannot gather a conjugate one (torch's
    ``all_gather`` refuses it), where tmpatch sends the resolved values."""
    def run(conj: bool) -> Any:
        torch.manual_seed(0)
        metric = _mixed()
        metric.avg = torch.randn(2, dtype=torch.complex128).conj().imag  # a negative view of real numbers
        if conj:
            metric.total = torch.randn(3, dtype=torch.complex64).conj()
        world_of_one.take()
        try:
            return metric.compute(), world_of_one.take()
        except RuntimeError as exc:
            return exc, world_of_one.take()

    expected, _ = run(False)
    refused, _ = run(True)
    assert "conj" in str(refused)
    tmpatch.apply("coalesced_sync")
    got, calls = run(False)
    assert_same(got, expected, "negative view")
    assert calls == ["all_gather", "all_gather"]
    got, calls = run(True)
    torch.manual_seed(0)
    _mixed()
    torch.randn(2, dtype=torch.complex128)
    assert torch.equal(got["total"], torch.randn(3, dtype=torch.complex64).conj().resolve_conj())


@needs_torch_2_5
def test_world_of_one_direct_sync_dist_and_subclass_without_args(world_of_one):
    """``_sync_dist()`` with its defaults, as a subclass calling ``super()`` would."""
    metric = _mixed()
    expected = metric.total.clone()
    tmpatch.apply("coalesced_sync")
    world_of_one.take()
    metric._sync_dist()
    assert world_of_one.take() == ["all_gather", "all_gather"]
    assert_same(metric.total, expected, "total")


@needs_torch_2_5
def test_world_of_one_subclass_overriding_sync_dist_coalesces_through_super(world_of_one):
    """As MeanAveragePrecision does: its own ``_sync_dist`` calls ``super()._sync_dist``."""
    base = classes()["Mixed"]

    class Own(base):
        def _sync_dist(self, dist_sync_fn: Any = None, process_group: Any = None) -> None:
            super()._sync_dist(dist_sync_fn=dist_sync_fn, process_group=process_group)
            self.extra_seen = True

    def run() -> Any:
        metric = Own()
        metric.update("own", 0, 0, 2)
        world_of_one.take()
        return metric.compute(), world_of_one.take(), getattr(metric, "extra_seen", False)

    expected, release_calls, seen = run()
    tmpatch.apply("coalesced_sync")
    got, calls, seen_patched = run()
    assert_same(got, expected, "Own")
    assert calls == ["all_gather", "all_gather"] and len(release_calls) > 2 and seen and seen_patched


@needs_torch_2_5
@pytest.mark.parametrize("patches", [["coalesced_sync"], ["gather_autograd", "coalesced_sync"]])
def test_world_of_one_local_graph_as_the_release(world_of_one, patches):
    """The synced state carries the local graph where the release (1.6.0+) or
    gather_autograd keeps it, and does not where the release drops it."""
    from tmpatch.patches.coalesced_sync import flow

    def synced() -> torch.Tensor:
        x = torch.tensor([1.0, 2.0, 3.0], requires_grad=True)
        metric = _mixed()
        metric.total = x * 2
        metric._sync_dist()
        return metric.total

    if "gather_autograd" in patches:
        tmpatch.apply("gather_autograd")
    release = synced().requires_grad
    tmpatch.apply(patches)
    assert tmpatch.status()["coalesced_sync"].state == "applied"
    calls: List[Any] = []
    real = flow.wire.exchange
    flow.wire.exchange = lambda *a, **k: calls.append(1) or real(*a, **k)
    try:
        patched = synced()
    finally:
        flow.wire.exchange = real
    assert calls == [1]
    assert patched.requires_grad == release == (KEEPS_GRAPH or "gather_autograd" in patches)
    if patched.requires_grad:
        patched.sum().backward()


@needs_torch_2_5
def test_world_of_one_records_ride_along(world_of_one, monkeypatch):
    """With ``tmpatch.runtime.deferred``'s ``local_records``/``set_synced`` (a stand-in here), each
    metric's records travel in the exchange and come back summed, with no collective of
    their own; one set_synced per metric synced."""
    from tmpatch.runtime import deferred

    synced: List[Any] = []
    monkeypatch.setattr(deferred, "local_records", lambda m: dict(getattr(m, "_records", {})), raising=False)
    monkeypatch.setattr(deferred, "set_synced", lambda m, totals: synced.append(
        (type(m).__name__, {k: (int(v), v.dtype, v.shape) for k, v in totals.items()})), raising=False)
    tmpatch.apply("coalesced_sync")
    metric = _mixed()
    metric._records = {"nan": torch.tensor(3), "range": torch.tensor(7, dtype=torch.int32)}
    world_of_one.take()
    metric.compute()
    coll = collection("issue")
    coll.update(value=torch.arange(3.0), preds=torch.tensor([0, 1, 2]), target=torch.tensor([0, 2, 2]))
    coll["acc"]._records = {"nan": torch.tensor(2)}
    coll.compute()
    assert world_of_one.take() == ["all_gather"] * 4
    scalar = (torch.int64, torch.Size([]))
    assert len(synced) == 5 and dict(synced) == {
        "Mixed": {"nan": (3,) + scalar, "range": (7,) + scalar},
        "MeanMetric": {}, "SumMetric": {}, "MulticlassAccuracy": {"nan": (2,) + scalar},
        "MulticlassConfusionMatrix": {},
    }


def test_header_is_never_an_unpatched_message():
    from tmpatch.patches.coalesced_sync import wire

    assert wire.HEADER_BYTES % 8 != 0 and wire.HEADER_BYTES > 16
    request = wire.Request(wire.METRIC)
    good = wire._header(request, 0, 2, 10, 32)
    assert len(good) == wire.HEADER_BYTES and wire._read_header(good, 0)[0] == wire.MAGIC
    shapes = torch.tensor([3, 2], dtype=torch.int64).numpy().tobytes()  # what gather_all_tensors sends first
    for raw in (shapes, b"\x01", good[:-1]):
        padded = raw + bytes(wire.HEADER_BYTES - len(raw))  # gloo copies a shorter message into a zeroed slot
        with pytest.raises(wire.CoalescedSyncError, match="did not send a coalesced-sync header"):
            wire._read_header(padded, 1)


def test_a_foreign_wrapper_of_the_gather_is_the_users_function():
    import functools

    from torchmetrics.utilities import distributed

    rules = _rules()
    gather = distributed.gather_all_tensors
    assert rules.is_default(gather)

    @functools.wraps(gather)
    def profiled(*args: Any, **kwargs: Any) -> Any:
        return gather(*args, **kwargs)

    assert not rules.is_default(profiled) and not rules.is_default(lambda t, group=None: [t])


@pytest.mark.skipif(not release_in("<1.6.0"), reason="gather_autograd is applied only before 1.6.0")
def test_gather_autograd_layer_counts_as_the_default():
    from torchmetrics.utilities import distributed

    tmpatch.apply(["gather_autograd"])
    rules = _rules()
    assert tmpatch.is_patched(distributed.gather_all_tensors)
    assert rules.is_default(distributed.gather_all_tensors) and rules.local_graph(distributed.gather_all_tensors)
    assert not rules.local_graph(tmpatch.get_original(distributed.gather_all_tensors))


def test_environment_of_the_suite_has_no_process_group():
    assert not (dist.is_available() and dist.is_initialized()), os.environ.get("RANK")


def _meta(metric: Any) -> Any:
    """What a rank sends as the metadata of ``metric``'s sync (as ``wire.exchange`` builds it)."""
    from tmpatch.patches.coalesced_sync import flow, wire
    from tmpatch.patches.coalesced_sync.plan import plan

    request = flow._request(wire.METRIC, [("Mixed", metric, plan(metric, _rules()))])
    return {"o": list(request.owners), "t": request.release,
            "b": [[wire._dtype_name(t.dtype), list(t.shape)] for t in request.blocks],
            "e": [list(entry) for entry in request.entries], "r": []}


def _longer(metric: Any) -> Any:
    metric.seq.append(torch.zeros(2))  # a None-reduced list one element longer than rank 0's
    return metric


#: rank 1's metric against rank 0's ``_mixed(2, label_dtype=torch.int64)``; the advice its error
#: must give, and the one it must not
DISAGREEING = {
    "empty list": (lambda: _mixed(0, label_dtype=torch.int64), "list state is empty", "different lengths"),
    "list lengths": (lambda: _longer(_mixed(2, label_dtype=torch.int64)), "different lengths", "empty"),
    "dtypes": (lambda: _mixed(2, label_dtype=torch.float64), "same dtype", "empty"),
    "other states": (lambda: _mixed(2, label_dtype=torch.int64, extra=True), "different metric code", "lengths"),
}


@pytest.mark.parametrize("case", sorted(DISAGREEING))
def test_a_structure_error_gives_the_advice_of_its_cause(case):
    """The empty-list-state advice only where a rank's list state is empty (an empty tensor, or
    nothing, where other ranks send data): not for lists of different lengths or other dtypes."""
    from tmpatch.patches.coalesced_sync import wire

    build, advice, not_advice = DISAGREEING[case]
    metas = [_meta(_mixed(2, label_dtype=torch.int64)), _meta(build())]
    with pytest.raises(wire.CoalescedSyncError, match="hold different states") as raised:
        wire._check_structure(metas)
    assert advice in str(raised.value) and not_advice not in str(raised.value), str(raised.value)
