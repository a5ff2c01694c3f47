"""coalesced_sync on real gloo process groups of 2 and 3 ranks.

One ``torch.multiprocessing`` spawn per world size runs every case of
:mod:`distributed.coalesce_workers` unpatched, with ``coalesced_sync`` alone, and
with ``gather_autograd`` too; the tests compare what the ranks handed back:

* every value (``compute()`` of a metric with a state of every kind and
  reduction, of the issue's collection, of a collection with compute groups, on
  a ``new_group`` subgroup, and every ``forward()`` with ``dist_sync_on_step``)
  is bit-identical to the release's own;
* the collectives: 2 ``all_gather`` per metric and per collection where the
  release makes 21 (the issue's collection), 31 (the metric) or 45 (compute
  groups); a user-supplied ``dist_sync_fn`` keeps the release's path;
* deferred records ride in the same buffers, summed over the ranks;
* ranks that disagree raise one clear error on every rank (protocol version,
  states, an empty rank's state of another dtype), and the group stays in step;
* a rank without the patch: every rank fails at the process group's timeout,
  none gets a value; ranks on different releases (1.3.2 and 1.9.0) work.

The runs take seconds each; they are made on the releases where the sync code
changes (COALESCE_RELEASES; ``TMPATCH_DDP_RELEASES`` widens it as for the other
DDP tests), the mixed runs on 1.9.0 only.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Any, Dict, List

import pytest
import torch

from tests.conftest import torch_at_least

from . import ddp_launch
from .coalesce_workers import MIXED_TIMEOUT, run_mixed, run_rank, run_releases

ROOT = ddp_launch.ROOT

#: releases of the runs: last of _sync_dist's first implementation (1.3.2), its second
#: (1.4.0), its third with the gather that drops the graph (1.5.2), the first with the
#: gather that keeps it and the second MetricCollection.compute (1.6.0), the latest
COALESCE_RELEASES = ("1.3.2", "1.4.0", "1.5.2", "1.6.0", "1.9.0")
MIXED_RELEASE = "1.9.0"
RUN_TIMEOUT = 240.0


def _release() -> str:
    import torchmetrics

    return torchmetrics.__version__


def _in(spec: str) -> bool:
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    return Version(_release()) in SpecifierSet(spec)


def _releases() -> tuple:
    wanted = os.environ.get("TMPATCH_DDP_RELEASES", "").strip()
    if wanted == "all":
        return (_release(),)
    return tuple(r.strip() for r in wanted.split(",") if r.strip()) or COALESCE_RELEASES


RELEASE = _release()
EMPTY_OK = _in(">=1.4.0")  # before 1.4.0 a rank with an empty list state makes the release's ranks diverge
pytestmark = [
    pytest.mark.skipif(
        RELEASE not in _releases(),
        reason=f"coalesced_sync runs are made on torchmetrics {', '.join(_releases())}; this is {RELEASE} "
        "(TMPATCH_DDP_RELEASES=all runs them here)",
    ),
    pytest.mark.skipif(  # the patch does not apply there: its status says why (test_coalesced_sync)
        not torch_at_least(2, 5),
        reason="coalesced_sync needs torch 2.5 or later",
    ),
]

MODES = ("coalesced", "both")
_cache: Dict[str, Any] = {}


@pytest.fixture(scope="session")
def run(tmp_path_factory):
    """``run(world)`` -> ``{rank: result}`` of the main spawn; made once per session."""

    def get(world: int) -> Dict[int, Dict[str, Any]]:
        key = f"spawn-{world}"
        if key not in _cache:
            workdir = os.path.join(str(tmp_path_factory.mktemp("coalesce")), key)
            start = time.monotonic()
            try:
                _cache[key] = ddp_launch.spawn(run_rank, world, workdir, args=(("unpatched",) + MODES, EMPTY_OK),
                                               timeout=RUN_TIMEOUT)
            except ddp_launch.WorkerError as exc:
                _cache[key] = exc
            sys.stderr.write(f"\n[coalesce] {key}: {time.monotonic() - start:.1f}s\n")
        if isinstance(_cache[key], BaseException):
            raise _cache[key]
        return _cache[key]

    return get


def assert_same(a: Any, b: Any, where: str) -> None:
    """Same structure, dtypes, shapes and bits."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), where
        assert (a.dtype, a.shape) == (b.dtype, b.shape), (where, a.dtype, b.dtype, a.shape, b.shape)
        if a.dtype.is_complex:
            a, b = torch.view_as_real(a), torch.view_as_real(b)
        if a.dtype.is_floating_point:
            bits = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
            a, b = a.view(bits), b.view(bits)
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_same(a[key], b[key], f"{where}/{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


def _value(got: Dict[str, Any], where: str) -> Any:
    assert "error" not in got, f"{where}: {got['error']}"
    return got["value"]


VALUE_CASES = ("states", "states-empty", "issue", "groups", "user-fn", "sub-states", "sub-issue")


def _cases(results: Dict[int, Dict[str, Any]], rank: int, mode: str) -> Dict[str, Any]:
    return results[rank]["cases"][mode]


@pytest.mark.parametrize("world", [2, 3])
def test_status_on_every_rank(run, world):
    for rank, result in run(world).items():
        assert result["release"] == RELEASE
        assert result["state"] == {"unpatched": "off", "coalesced": "applied", "both": "applied"}, rank


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("world", [2, 3])
def test_values_are_the_releases_bit_for_bit(run, world, mode):
    results = run(world)
    for rank in results:
        plain, patched = _cases(results, rank, "unpatched"), _cases(results, rank, mode)
        for case in VALUE_CASES:
            if case not in plain:
                continue
            where = f"rank {rank} {mode} {case}"
            assert_same(_value(patched[case], where), _value(plain[case], where), where)
        for step, (a, b) in enumerate(zip(patched["forward"]["steps"], plain["forward"]["steps"])):
            assert_same(_value(a, f"forward {step}"), _value(b, f"forward {step}"), f"rank {rank} forward {step}")
        assert_same(_value(patched["forward"]["compute"], "forward"), _value(plain["forward"]["compute"], "fw"),
                    f"rank {rank} compute after forward")
    if world == 3:  # the subgroup cases ran on its members only
        assert "sub-states" in _cases(results, 1, mode) and "sub-states" not in _cases(results, 0, mode)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("world", [2, 3])
def test_two_all_gathers_per_metric_and_per_collection(run, world, mode):
    results = run(world)
    for rank in results:
        plain, patched = _cases(results, rank, "unpatched"), _cases(results, rank, mode)
        for case in ("states", "states-empty", "issue", "groups", "sub-states", "sub-issue"):
            if case in patched:
                assert patched[case]["calls"] == ["all_gather", "all_gather"], (rank, case, patched[case]["calls"])
        for step in patched["forward"]["steps"]:
            assert step["calls"] == ["all_gather", "all_gather"], (rank, "forward", step["calls"])
        # what the release makes: a barrier, a shape all_gather (not for 0-d states), a data all_gather per state
        assert len(plain["issue"]["calls"]) == 21 and plain["issue"]["calls"].count("barrier") == 8
        assert len(plain["states"]["calls"]) == 31 and len(plain["groups"]["calls"]) == 45
        assert all(len(step["calls"]) >= 20 for step in plain["forward"]["steps"])  # 31, then 22-25


@pytest.mark.parametrize("world", [2, 3])
def test_compute_groups_formed(run, world):
    for result in run(world).values():
        for mode in ("unpatched",) + MODES:
            groups = result["cases"][mode]["groups"]["groups"]
            assert sorted(map(sorted, groups.values())) == [["acc", "prec", "rec"], ["confmat"], ["mean"], ["sum"]]


@pytest.mark.parametrize("world", [2, 3])
def test_user_supplied_dist_sync_fn_keeps_the_release_path(run, world):
    for rank, result in run(world).items():
        plain = result["cases"]["unpatched"]["user-fn"]
        for mode in MODES:
            assert result["cases"][mode]["user-fn"]["calls"] == plain["calls"], (rank, mode)


@pytest.mark.parametrize("world", [2, 3])
def test_deferred_records_ride_in_the_same_buffers(run, world):
    ranks = range(world)
    nan = sum(r + 1 for r in ranks)
    members = {name: sum(10 * r + len(name) for r in ranks) for name in ("mean", "acc", "confmat")}
    for rank, result in run(world).items():
        for mode in MODES:
            got = result["cases"][mode]["records"]
            assert got["single"]["calls"] == ["all_gather", "all_gather"] and "error" not in got["single"]
            assert got["collection"]["calls"] == ["all_gather", "all_gather"] and "error" not in got["collection"]
            expected = {"single": [{"nan": nan, "range": 5}], "sum": [{}]}
            expected.update({name: [{"nan": total}] for name, total in members.items()})
            assert got["synced"] == expected, (rank, mode)


@pytest.mark.parametrize("world", [2, 3])
def test_disagreeing_ranks_raise_one_clear_error_everywhere(run, world):
    results = run(world)
    for mode in MODES:
        for case in ("version", "structure", "empty-dtype", "lengths", "kind"):
            messages = {results[rank]["cases"][mode]["errors"][case].get("error") for rank in results}
            assert len(messages) == 1, (mode, case, messages)
    for result in results.values():
        for mode in MODES:
            errors = result["cases"][mode]["errors"]
            version = errors["version"]
            assert "CoalescedSyncError" in version["error"] and "rank 1: 99" in version["error"], version
            assert version["calls"] == ["all_gather"] and not version["synced_after"]
            structure = errors["structure"]
            assert "hold different states" in structure["error"] and "Mixed.extra" in structure["error"], structure
            assert structure["calls"] == ["all_gather", "all_gather"] and not structure["synced_after"]
            empty = errors["empty-dtype"]
            assert "hold different states" in empty["error"] and "empty" in empty["error"], empty
            lengths = errors["lengths"]
            assert "hold different states" in lengths["error"] and "Mixed.seq[2]" in lengths["error"], lengths
            kind = errors["kind"]
            assert "sync different things" in kind["error"] and kind["calls"] == ["all_gather"], kind
            assert "error" not in errors["after"], errors["after"]  # the group is still in step


@pytest.mark.skipif(EMPTY_OK, reason="from 1.4.0 the release syncs a rank with an empty list state itself")
@pytest.mark.parametrize("world", [2, 3])
def test_empty_rank_before_1_4_is_a_clear_error(run, world):
    """Up to 1.3.2 a rank with an empty ``cat`` list sends nothing for it, and the
    ranks' collectives diverge (a hang or a gloo abort); patched, every rank raises."""
    for rank, result in run(world).items():
        for mode in MODES:
            got = result["cases"][mode]["states-empty"]
            assert "CoalescedSyncError" in got.get("error", ""), (rank, got)


mixed_only = pytest.mark.skipif(RELEASE != MIXED_RELEASE, reason=f"mixed runs are made on {MIXED_RELEASE} only")


@mixed_only
@pytest.mark.parametrize("world, patched", [(2, (0,)), (3, (0, 1))])
def test_a_rank_without_the_patch_fails_at_the_timeout_never_silently(tmp_path, world, patched):
    """gloo matches collectives by order: the unpatched rank's barrier never pairs
    with the patched ranks' header all_gather; every rank raises at the process
    group's timeout and none returns a value."""
    results = ddp_launch.spawn(run_mixed, world, str(tmp_path / "run"), args=(list(patched),), timeout=120)
    for rank, got in results.items():
        assert got["state"] == ("applied" if rank in patched else "off")
        assert "value" not in got and "RuntimeError" in got["error"], (rank, got)
        assert got["seconds"] < MIXED_TIMEOUT + 30, (rank, got)


@mixed_only
def test_ranks_on_different_releases(tmp_path):
    folders = [os.path.join(ROOT, ".matrix", release) for release in ("1.3.2", "1.9.0")]
    if not all(os.path.isdir(os.path.join(f, "torchmetrics")) for f in folders):
        pytest.skip("torchmetrics 1.3.2 and 1.9.0 are not installed under .matrix")
    results = ddp_launch.spawn(run_releases, 2, str(tmp_path / "run"), args=(folders,), timeout=RUN_TIMEOUT)
    assert [results[r]["release"] for r in (0, 1)] == ["1.3.2", "1.9.0"]
    for rank, got in results.items():
        assert got["state"] == "applied" and got["calls"] == ["all_gather", "all_gather"], (rank, got)
    assert_same(_value(results[0], "rank 0"), _value(results[1], "rank 1"), "the two releases")
    values: List[Any] = list(_value(results[0], "rank 0").values())
    assert all(torch.isfinite(v).all() for v in values)
