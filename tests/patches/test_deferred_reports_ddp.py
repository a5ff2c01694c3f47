"""deferred_reports on real process groups (issue #11 item 7): no added collective, no hang.

Real gloo jobs of 2 and 3 ranks (``tests.distributed.ddp_launch.spawn``). Every rank counts
the ``torch.distributed`` collectives it makes (calls of ``all_gather``, ``barrier``, ...)
for a MetricCollection of MeanMetric, SumMetric, MulticlassAccuracy and
MulticlassConfusionMatrix, unpatched and then with every patch applied, in ``update()``,
``compute()``, ``sync()``/``unsync()`` and ``forward()`` with ``dist_sync_on_step=True``:
the counts are the same. The ranks take the path a GPU takes (tests/conftest.py
``cpu_shortcuts(False)``): a NaN (and an invalid class) seen on one rank is reported on that
rank, after the release's compute and sync finished on every rank (none waits in a collective),
in the release's words (an error: then tmpatch's note), and the job goes on (the reports wait
for compute() here, as on a GPU before their evidence reaches the host: a report given at an
update comes on its rank, as upstream's); a sync() by hand reports after its collectives (on
every rank with coalesced_sync). On the CPU the release's own checks run: the bad rank's
updates raise and warn as the release's, and the job goes on as the release's. A job where
rank 0 is patched and the others are not runs to the end with the values of an unpatched job.

Multi-process runs cost seconds: they run on DDP_RELEASES (``TMPATCH_DDP_RELEASES=all``
or a comma list widens it) and skip elsewhere.
"""
from __future__ import annotations

import os
import warnings
from datetime import timedelta
from typing import Any, Callable, Dict, List

import pytest
import torch

from tests.conftest import release_in, torch_at_least
from tests.distributed import ddp_launch

#: one release per implementation of forward/reset/_wrap_compute, and the last
DDP_RELEASES = ("1.0.0", "1.4.0", "1.6.2", "1.9.0")
RUN_TIMEOUT = 180.0
COLLECTIVES = ("all_gather", "all_gather_into_tensor", "all_gather_object", "all_reduce", "all_to_all",
               "all_to_all_single", "barrier", "broadcast", "broadcast_object_list", "gather", "reduce",
               "reduce_scatter", "reduce_scatter_tensor", "scatter", "monitored_barrier")
NAN = float("nan")
#: the release's error for a class past the bins of 3 classes, deferred: its words, then the note
BINCOUNT = "shape '[3, 3]' is invalid for input of size larger than 9 (tmpatch bincount: "


def _ddp_here() -> bool:
    chosen = os.environ.get("TMPATCH_DDP_RELEASES", "")
    if chosen == "all":
        return True
    releases = [r.strip() for r in chosen.split(",") if r.strip()] or list(DDP_RELEASES)
    return any(release_in(f"=={r}") for r in releases)


pytestmark = pytest.mark.skipif(not _ddp_here(),
                                reason="multi-process run on DDP_RELEASES (TMPATCH_DDP_RELEASES=all widens)")


# -- what every rank runs -----------------------------------------------------------------------
class _Counter:
    """Counts the calls of ``torch.distributed`` collectives, by name."""

    def __init__(self) -> None:
        import torch.distributed as dist

        self.counts: Dict[str, int] = {}
        for name in COLLECTIVES:
            original = getattr(dist, name, None)
            if original is not None:
                setattr(dist, name, self._counting(name, original))

    def _counting(self, name: str, original: Callable) -> Callable:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.counts[name] = self.counts.get(name, 0) + 1
            return original(*args, **kwargs)

        return call

    def take(self) -> Dict[str, int]:
        counts, self.counts = self.counts, {}
        return counts


def _batch(rank: int, step: int):
    gen = torch.Generator().manual_seed(100 * rank + step)
    return (torch.rand(6, generator=gen), torch.randint(0, 3, (6,), generator=gen),
            torch.randint(0, 3, (6,), generator=gen))


def _collection(**kwargs: Any):
    from torchmetrics import MetricCollection
    from torchmetrics.aggregation import MeanMetric, SumMetric
    from torchmetrics.classification import MulticlassAccuracy, MulticlassConfusionMatrix

    return MetricCollection({
        "mean": MeanMetric(nan_strategy="error", **kwargs), "sum": SumMetric(nan_strategy="warn", **kwargs),
        "acc": MulticlassAccuracy(num_classes=3, validate_args=False, **kwargs),
        "confmat": MulticlassConfusionMatrix(3, validate_args=False, **kwargs),
    })


def _update(collection, value, preds, target, forward: bool = False) -> None:
    for name, args in (("mean", (value,)), ("sum", (value,)), ("acc", (preds, target)), ("confmat", (preds, target))):
        metric = collection[name]
        metric(*args) if forward else metric.update(*args)


def _values(result: Dict[str, torch.Tensor]) -> Dict[str, List[float]]:
    return {name: result[name].double().flatten().tolist() for name in sorted(result)}


def _counted_run(counter: _Counter, rank: int) -> Dict[str, Any]:
    """Collectives and values of update, compute, sync/unsync and forward (dist_sync_on_step)."""
    out: Dict[str, Any] = {}
    collection = _collection()
    counter.take()
    for step in range(2):
        _update(collection, *_batch(rank, step))
    out["update"] = counter.take()
    out["values"] = _values(collection.compute())
    out["compute"] = counter.take()
    for name in sorted(collection):
        collection[name].sync()
        collection[name].unsync()
    out["sync"] = counter.take()
    stepwise = _collection(dist_sync_on_step=True)
    counter.take()
    _update(stepwise, *_batch(rank, 5), forward=True)
    out["forward"] = counter.take()
    out["forward_values"] = _values(stepwise.compute())
    return out


def _reports(call: Callable[[], Any]) -> Dict[str, Any]:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        try:
            value = _values(call())
            error = None
        except RuntimeError as exc:
            value, error = None, str(exc)
    return {"value": value, "error": error,
            "warnings": [str(w.message) for w in seen if "nan" in str(w.message) or "tmpatch" in str(w.message)]}


def _bad_on_rank_one(rank: int) -> Dict[str, Any]:
    """Rank 1 sees a NaN (Mean: error, Sum: warn) and an invalid class; every rank computes."""
    collection = _collection()
    value, preds, target = _batch(rank, 0)
    if rank == 1:
        value = torch.cat([value, torch.tensor([NAN])])
        preds, target = torch.cat([preds, torch.tensor([0])]), torch.cat([target, torch.tensor([7])])
    _update(collection, value, preds, target)
    out = {"first": _reports(collection.compute), "second": _reports(collection.compute)}
    _update(collection, *_batch(rank, 1))
    out["later"] = _reports(collection.compute)  # the ranks go on in step: no one waits
    return out


def _bad_on_rank_one_each_call(rank: int) -> Dict[str, Any]:
    """As :func:`_bad_on_rank_one`, each update on its own (on the CPU the release's checks raise
    in update()): what each call raised and warned, and the computes on every rank."""
    collection = _collection()
    value, preds, target = _batch(rank, 0)
    if rank == 1:
        value = torch.cat([value, torch.tensor([NAN])])
        preds, target = torch.cat([preds, torch.tensor([0])]), torch.cat([target, torch.tensor([7])])
    out: Dict[str, Any] = {}
    for name, args in (("mean", (value,)), ("sum", (value,)), ("acc", (preds, target)), ("confmat", (preds, target))):
        out[name] = _reports(lambda name=name, args=args: collection[name].update(*args) or {})
    out["first"], out["second"] = _reports(collection.compute), _reports(collection.compute)
    _update(collection, *_batch(rank, 1))
    out["later"] = _reports(collection.compute)
    return out


def _sync_by_hand(rank: int) -> Dict[str, Any]:
    """Rank 1 sees a NaN (error); every rank syncs its metric by hand, twice, then computes.
    The sync is a settle point: the report comes once its collectives are done on every rank."""
    from torchmetrics.aggregation import MeanMetric

    metric = MeanMetric(nan_strategy="error")
    value = _batch(rank, 0)[0]
    if rank == 1:
        value = torch.cat([value, torch.tensor([NAN])])
    metric.update(value)
    out: Dict[str, Any] = {}
    for attempt in ("first", "second"):
        try:
            metric.sync()
            error = None
        except RuntimeError as exc:
            error = str(exc)
        out[attempt] = {"error": error, "synced": metric._is_synced}
        if metric._is_synced:
            metric.unsync()
    out["compute"] = _reports(lambda: {"mean": metric.compute()})
    return out


_OWN_SYNC = "coalesced_sync"


def run_rank(rank: int, world_size: int, init_method: str, out_dir: str) -> None:
    import torch.distributed as dist

    import tmpatch
    from tests.conftest import cpu_shortcuts, hold_reports

    cpu_shortcuts(False)  # the path a GPU takes (tmpatch.runtime.host: "not the host's")
    hold_reports()  # the reports wait for compute() or sync(), as on a GPU before the copy lands
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=60))
    try:
        counter = _Counter()
        result: Dict[str, Any] = {}
        tmpatch.revert()
        result["unpatched"] = _counted_run(counter, rank)
        dist.barrier()
        # coalesced_sync changes the collectives themselves (its own DDP tests); here the
        # release's collectives are the reference, so it stays out
        result["states"] = tmpatch.apply(exclude=_OWN_SYNC).states()
        result["patched"] = _counted_run(counter, rank)
        dist.barrier()
        result["bad"] = _bad_on_rank_one(rank)
        dist.barrier()
        cpu_shortcuts(True)  # on the CPU: the release's checks, unpatched and patched
        tmpatch.revert()
        result["bad_cpu_release"] = _bad_on_rank_one_each_call(rank)
        dist.barrier()
        tmpatch.apply(exclude=_OWN_SYNC)
        result["bad_cpu"] = _bad_on_rank_one_each_call(rank)
        cpu_shortcuts(False)
        dist.barrier()
        result["sync_by_hand"] = _sync_by_hand(rank)
        dist.barrier()
        result["coalesced"] = tmpatch.apply().states()[_OWN_SYNC]  # the records ride with the states
        result["sync_by_hand_coalesced"] = _sync_by_hand(rank)
        tmpatch.revert()
        dist.barrier()
        if rank == 0:
            tmpatch.apply(exclude=_OWN_SYNC)
        else:
            tmpatch.revert()
        result["mixed"] = _counted_run(counter, rank)
        dist.barrier()
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


# -- the tests ------------------------------------------------------------------------------------
_RESULTS: Dict[int, Any] = {}


def _job(world_size: int, tmp_path_factory) -> Dict[int, Dict[str, Any]]:
    if world_size not in _RESULTS:
        workdir = str(tmp_path_factory.mktemp(f"deferred_ddp{world_size}") / "run")
        try:
            _RESULTS[world_size] = ddp_launch.spawn(run_rank, world_size, workdir, timeout=RUN_TIMEOUT,
                                                    env={"TMPATCH": None, "OMP_NUM_THREADS": "1"})
        except Exception as exc:  # noqa: BLE001 - one failed job fails every test of it, once
            _RESULTS[world_size] = exc
    result = _RESULTS[world_size]
    if isinstance(result, Exception):
        raise result
    return result


@pytest.mark.parametrize("world_size", [2, 3])
def test_patched_ranks_make_exactly_the_releases_collectives(world_size, tmp_path_factory):
    results = _job(world_size, tmp_path_factory)
    for rank, result in results.items():
        assert result["states"]["deferred_reports"] == result["states"]["nan_check"] == "applied"
        plain, patched = result["unpatched"], result["patched"]
        for phase in ("update", "compute", "sync", "forward"):
            assert patched[phase] == plain[phase], (rank, phase, patched[phase], plain[phase])
        assert plain["update"] == {} and sum(plain["compute"].values()) > 0 and sum(plain["forward"].values()) > 0
        assert patched["values"] == plain["values"] and patched["forward_values"] == plain["forward_values"]
    assert len({str(r["patched"]["values"]) for r in results.values()}) == 1  # synced: the same everywhere


@pytest.mark.parametrize("world_size", [2, 3])
def test_a_nan_and_an_invalid_class_on_one_rank_are_reported_there_without_a_hang(world_size, tmp_path_factory):
    results = _job(world_size, tmp_path_factory)
    spelling = "Encounted" if release_in("<1.2.1") else "Encountered"
    for rank, result in results.items():
        first, second, later = result["bad"]["first"], result["bad"]["second"], result["bad"]["later"]
        if rank == 1:
            # one raise for the collection, after every metric's compute: Mean's NaN error and the
            # invalid class seen by Accuracy and ConfusionMatrix (one each), in either order
            error = first["error"]
            assert error is not None and len(error.split("\nAlso: ")) == 2, error
            nan_error = f"{spelling} `nan` values in tensor (tmpatch nan_check: "  # the release's words first
            assert sorted((part.startswith(nan_error), part.startswith(BINCOUNT))
                          for part in error.split("\nAlso: ")) == [(False, True), (True, False)], error
            assert f"{BINCOUNT}2 value(s)" in error and "MetricCollection" in error
            # the warning in the release's words alone (its note: the tmpatch logger)
            assert first["warnings"] == [f"{spelling} `nan` values in tensor. Will be removed."], first
            assert second["error"] is None and second["value"] is not None  # reported once
        else:
            assert first["error"] is None and first["warnings"] == [], (rank, first)
            assert first["value"] == second["value"]
        assert later["error"] is None and later["warnings"] == []
    assert len({str(r["bad"]["later"]["value"]) for r in results.values()}) == 1


@pytest.mark.parametrize("world_size", [2, 3])
def test_on_the_cpu_the_bad_ranks_updates_raise_and_warn_as_the_releases(world_size, tmp_path_factory):
    results = _job(world_size, tmp_path_factory)
    spelling = "Encounted" if release_in("<1.2.1") else "Encountered"
    for rank, result in results.items():
        release, patched = result["bad_cpu_release"], result["bad_cpu"]
        assert patched == release, (rank, patched, release)
        if rank == 1:  # the release's error from the update itself, its warning there too
            assert release["mean"]["error"] == f"{spelling} `nan` values in tensor", release
            assert release["sum"]["warnings"] == [f"{spelling} `nan` values in tensor. Will be removed."], release
            assert release["acc"]["error"] and release["confmat"]["error"], release
        for call in ("first", "second", "later"):
            assert patched[call]["error"] is None and patched[call]["warnings"] == [], (rank, call, patched)
    assert len({str(r["bad_cpu"]["later"]["value"]) for r in results.values()}) == 1


@pytest.mark.parametrize("world_size", [2, 3])
def test_a_sync_by_hand_gives_the_report_after_its_collectives(world_size, tmp_path_factory):
    """A user's sync() sends the batch to every rank: the report comes there, once, after the
    release's collectives (no rank waits), and the raising rank gets its local states back. On
    the rank that saw the NaN; with coalesced_sync, whose exchange sums the records, on every rank."""
    results = _job(world_size, tmp_path_factory)
    spelling = "Encounted" if release_in("<1.2.1") else "Encountered"
    # coalesced_sync needs torch 2.5 (below, its status row says so and the release's sync runs)
    coalesced = torch_at_least(2, 5)
    phases = ("sync_by_hand", "sync_by_hand_coalesced") if coalesced else ("sync_by_hand",)
    for rank, result in results.items():
        assert result["coalesced"] == ("applied" if coalesced else "failed")
        for phase in phases:
            got = result[phase]
            raises = rank == 1 or phase == "sync_by_hand_coalesced"
            if raises:
                error = got["first"]["error"]
                assert error is not None and error.startswith(f"{spelling} `nan` values") and "sync()" in error, error
                assert ("on some rank" in error) == (phase == "sync_by_hand_coalesced"), error
                assert not got["first"]["synced"]  # unsynced: the local states are back
            else:
                assert got["first"] == {"error": None, "synced": True}, (rank, phase, got)
            assert got["second"] == {"error": None, "synced": True}, (rank, phase, got)
            assert got["compute"]["error"] is None and got["compute"]["warnings"] == [], (rank, phase, got)
    for phase in phases:
        assert len({str(r[phase]["compute"]["value"]) for r in results.values()}) == 1, phase


@pytest.mark.parametrize("world_size", [2, 3])
def test_a_patched_rank_and_unpatched_ranks_run_one_job(world_size, tmp_path_factory):
    results = _job(world_size, tmp_path_factory)
    for rank, result in results.items():
        assert result["mixed"]["values"] == result["unpatched"]["values"], rank
        assert result["mixed"]["forward_values"] == result["unpatched"]["forward_values"], rank
        for phase in ("compute", "sync", "forward"):
            assert result["mixed"][phase] == result["unpatched"][phase], (rank, phase)
