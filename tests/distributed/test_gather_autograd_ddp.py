"""gather_autograd on real process groups: a metric used as a loss across ranks.

Real multi-process runs on gloo (CPU): one ``torch.multiprocessing`` spawn of
2 ranks, one of 3 ranks (each also with ``coalesced_sync`` applied, mode
``coalesced``: the batch states gathered in one coalesced exchange), one ``torch.distributed.run`` of 2 ranks, and (when
the ``TMPATCH=1`` entry point, tmpatch/bootstrap/sitecustomize.py, exists) a
spawn of 3 ranks patched by the environment alone (its scenarios cover every
kind: equal, uneven with empty states, subgroup). Each run executes every scenario of its world size
(:data:`distributed.ddp_workers.SCENARIOS`) unpatched, then patched, and the
ranks hand their results back; the tests below only compare them:

* the loss (a custom Metric, ``dist_sync_on_step=True``: sum states of equal
  shape, the ``_simple_gather_all_tensors`` path; concatenated states of
  uneven length, the padded path, with a rank whose state is empty; both on
  a ``new_group`` subgroup where group rank != global rank) gives every rank
  the gradient of the global loss with respect to its own inputs, equal to the
  gradient of a single process over every rank's data;
* unpatched 1.0-1.5.2 gives no gradient: the loss has no graph and
  ``backward()`` raises; 1.6.0+ gives it without tmpatch (upstream fix);
* forward values and ``compute()`` are bit-identical patched and unpatched;
* ``gather_all_tensors`` puts the caller's own tensor at its index in the group.

Multi-process runs cost seconds; they run on the releases where they tell
something (DDP_RELEASES: 1.5.2 defective, 1.6.0 first fixed, 1.9.0 latest;
``TMPATCH_DDP_RELEASES=all`` or a comma list widens it) and skip elsewhere.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import Any, Dict, List, Tuple

import pytest
import torch

from . import ddp_launch
from .ddp_workers import (
    GATHER_CASES,
    SCENARIOS,
    SUBGROUP,
    D,
    Scenario,
    batch,
    fail_rank,
    gather_case,
    hang_rank,
    run_rank,
    teardown_hang_rank,
)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = ddp_launch.ROOT
WORKER_SCRIPT = os.path.join(HERE, "ddp_workers.py")
BOOTSTRAP = os.path.join(ROOT, "tmpatch", "bootstrap")

#: releases the multi-process runs are made on by default: the last defective
#: one, the first fixed upstream, the latest (the gather code of 1.6.0-1.8.2 is
#: one and the same function)
DDP_RELEASES = ("1.5.2", "1.6.0", "1.9.0")
#: the launcher's own tests (failure, time-out) do not depend on torchmetrics: one release
LAUNCHER_RELEASE = "1.9.0"
RUN_TIMEOUT = 150.0

RTOL, ATOL = 1e-5, 1e-6


def torchmetrics_release():
    import torchmetrics
    from packaging.version import Version

    return Version(torchmetrics.__version__)


def release_in(spec: str) -> bool:
    from packaging.specifiers import SpecifierSet

    return torchmetrics_release() in SpecifierSet(spec, prereleases=True)


def _ddp_releases() -> Tuple[str, ...]:
    wanted = os.environ.get("TMPATCH_DDP_RELEASES", "").strip()
    if wanted == "all":
        return (str(torchmetrics_release()),)
    return tuple(r.strip() for r in wanted.split(",") if r.strip()) or DDP_RELEASES


RELEASE = str(torchmetrics_release())
DEFECTIVE = release_in(">=0.10.0,<1.6.0")
pytestmark = pytest.mark.skipif(
    RELEASE not in _ddp_releases(),
    reason=f"multi-process runs are made on torchmetrics {', '.join(_ddp_releases())} only "
    f"(the defective 1.5.2, fixed 1.6.0, latest 1.9.0); this is {RELEASE}. "
    "Set TMPATCH_DDP_RELEASES=all to run them here.",
)


def _env_mode_skip() -> str:
    if not os.path.isfile(os.path.join(BOOTSTRAP, "sitecustomize.py")):
        return f"TMPATCH=1 entry point not built yet ({os.path.relpath(BOOTSTRAP, ROOT)}/sitecustomize.py missing)"
    return ""


# -- the runs, each made once per session and shared by the tests ------------
RUNS: Dict[str, Dict[str, Any]] = {
    "spawn-2": {"launcher": "spawn", "world_size": 2, "modes": ("unpatched", "patched", "coalesced")},
    "spawn-3": {"launcher": "spawn", "world_size": 3, "modes": ("unpatched", "patched", "coalesced")},
    "torchrun-2": {"launcher": "torchrun", "world_size": 2, "modes": ("unpatched", "patched")},
    "env-3": {"launcher": "spawn", "world_size": 3, "modes": ("env",), "env": True},
}
_cache: Dict[str, Any] = {}


@pytest.fixture(scope="session")
def ddp_run(tmp_path_factory):
    """``ddp_run(run_id)`` -> ``{rank: result}``; made once, a failure re-raised for every test."""

    def get(run_id: str) -> Dict[int, Dict[str, Any]]:
        spec = RUNS[run_id]
        if spec.get("env") and _env_mode_skip():
            pytest.skip(_env_mode_skip())
        if run_id not in _cache:
            workdir = os.path.join(str(tmp_path_factory.mktemp("ddp")), run_id)
            start = time.monotonic()
            try:
                if spec["launcher"] == "torchrun":
                    result: Any = ddp_launch.torchrun(
                        WORKER_SCRIPT, spec["world_size"], workdir, ["--modes", ",".join(spec["modes"])],
                        timeout=RUN_TIMEOUT,
                    )
                else:
                    env = None
                    if spec.get("env"):
                        env = {
                            "TMPATCH": "1",
                            "PYTHONPATH": ddp_launch.child_pythonpath([BOOTSTRAP]),
                            "TMPATCH_PATCHES": None,  # every patch, whatever this shell says
                            "TMPATCH_EXCLUDE": None,
                        }
                    result = ddp_launch.spawn(
                        run_rank, spec["world_size"], workdir, args=(list(spec["modes"]),), timeout=RUN_TIMEOUT,
                        env=env,
                    )
            except ddp_launch.WorkerError as exc:
                result = exc
            sys.stderr.write(f"\n[ddp] {run_id}: {time.monotonic() - start:.1f}s\n")
            _cache[run_id] = result
        result = _cache[run_id]
        if isinstance(result, BaseException):
            raise result
        return result

    return get


def _patch_modes(run_id: str) -> List[str]:
    """The patched modes of a run: ``patched``, ``coalesced`` (with coalesced_sync) or ``env``."""
    return [mode for mode in RUNS[run_id]["modes"] if mode != "unpatched"]


def _scenario_params(run_ids: List[str]) -> List[Any]:
    return [
        pytest.param(run_id, sc, id=f"{run_id}-{sc.name}")
        for run_id in run_ids
        for sc in SCENARIOS[RUNS[run_id]["world_size"]]
    ]


def _mode_params(run_ids: List[str]) -> List[Any]:
    return [
        pytest.param(run_id, sc, mode, id=f"{run_id}-{sc.name}-{mode}")
        for run_id in run_ids
        for sc in SCENARIOS[RUNS[run_id]["world_size"]]
        for mode in _patch_modes(run_id)
    ]


ALL_RUNS = list(RUNS)
UNPATCHED_RUNS = [r for r in RUNS if "unpatched" in RUNS[r]["modes"]]


def _reference(sc: Scenario, world_size: int, step: int) -> Tuple[torch.Tensor, Dict[int, torch.Tensor]]:
    """Loss and gradients in one process over every member's data at ``step``."""
    members = sc.ranks(world_size)
    data = [batch(sc.name, step, r, sc.sizes[step][i]) for i, r in enumerate(members)]
    leaves = [p.clone().requires_grad_(True) for p, _ in data]
    loss = ((torch.cat(leaves) - torch.cat([t for _, t in data])) ** 2).mean()
    loss.backward()
    return loss.detach(), {r: leaf.grad for r, leaf in zip(members, leaves)}


def _epoch_reference(sc: Scenario, world_size: int) -> torch.Tensor:
    members = sc.ranks(world_size)
    data = [batch(sc.name, s, r, sc.sizes[s][i]) for s in range(len(sc.sizes)) for i, r in enumerate(members)]
    return ((torch.cat([p for p, _ in data]) - torch.cat([t for _, t in data])) ** 2).mean()


def _members(results: Dict[int, Dict[str, Any]], sc: Scenario, world_size: int) -> List[int]:
    members = sc.ranks(world_size)
    for rank, result in results.items():
        assert (sc.name in result["scenarios"]) == (rank in members), f"rank {rank} / {sc.name}"
    return members


# -- metric as a loss ----------------------------------------------------------
@pytest.mark.parametrize("run_id, sc, mode", _mode_params(ALL_RUNS))
def test_patched_loss_gives_each_rank_the_global_gradient(ddp_run, run_id, sc, mode):
    results, world_size = ddp_run(run_id), RUNS[run_id]["world_size"]
    for rank in _members(results, sc, world_size):
        got = results[rank]["scenarios"][sc.name][mode]
        assert got["group_rank"] == sc.ranks(world_size).index(rank)
        for step, record in enumerate(got["steps"]):
            ref_loss, ref_grads = _reference(sc, world_size, step)
            where = f"{run_id} {sc.name} rank {rank} step {step}"
            assert record["requires_grad"] and record["error"] is None, where
            assert torch.allclose(record["loss"], ref_loss, rtol=RTOL, atol=ATOL), where
            assert record["grad"] is not None, f"{where}: no gradient"
            assert record["grad"].shape == (sc.sizes[step][sc.ranks(world_size).index(rank)], D), where
            assert torch.allclose(record["grad"], ref_grads[rank], rtol=RTOL, atol=ATOL), where
        assert torch.allclose(got["compute"], _epoch_reference(sc, world_size), rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("run_id, sc", _scenario_params(UNPATCHED_RUNS))
def test_unpatched_release(ddp_run, run_id, sc):
    """1.0-1.5.2: the loss value is right but its graph is gone: no gradient, and
    backward() raises. 1.6.0+: the upstream fix gives the gradient."""
    results, world_size = ddp_run(run_id), RUNS[run_id]["world_size"]
    for rank in _members(results, sc, world_size):
        got = results[rank]["scenarios"][sc.name]["unpatched"]
        for step, record in enumerate(got["steps"]):
            ref_loss, ref_grads = _reference(sc, world_size, step)
            where = f"{run_id} {sc.name} rank {rank} step {step}"
            assert torch.allclose(record["loss"], ref_loss, rtol=RTOL, atol=ATOL), where
            if DEFECTIVE:
                assert not record["requires_grad"], where
                assert record["grad"] is None, where
                assert "does not require grad" in record["error"], f"{where}: {record['error']}"
            else:
                assert record["requires_grad"] and record["error"] is None, where
                assert torch.allclose(record["grad"], ref_grads[rank], rtol=RTOL, atol=ATOL), where


@pytest.mark.parametrize("run_id, sc, mode", _mode_params(ALL_RUNS))
def test_values_identical_to_unpatched(ddp_run, run_id, sc, mode):
    """Forward values and compute() of the patched run are bit-identical to the
    release's own (env runs are compared with the spawn run of the same size)."""
    results, world_size = ddp_run(run_id), RUNS[run_id]["world_size"]
    plain = results if "unpatched" in RUNS[run_id]["modes"] else ddp_run(f"spawn-{world_size}")
    for rank in _members(results, sc, world_size):
        patched = results[rank]["scenarios"][sc.name][mode]
        unpatched = plain[rank]["scenarios"][sc.name]["unpatched"]
        for step, (a, b) in enumerate(zip(patched["steps"], unpatched["steps"])):
            assert torch.equal(a["loss"], b["loss"]), f"{sc.name} rank {rank} step {step}"
        assert torch.equal(patched["compute"], unpatched["compute"]), f"{sc.name} rank {rank}"


@pytest.mark.parametrize("run_id", ALL_RUNS)
def test_status_in_every_rank(ddp_run, run_id):
    expected = "applied" if DEFECTIVE else "not-needed"
    for rank, result in ddp_run(run_id).items():
        assert result["release"] == RELEASE
        for mode in _patch_modes(run_id):
            assert result["state"][mode] == expected, f"rank {rank} {mode}"
        if "unpatched" in result["state"]:
            assert result["state"]["unpatched"] in ("off", "reverted"), f"rank {rank}"


# -- gather_all_tensors itself -------------------------------------------------
def _gather_params() -> List[Any]:
    params = []
    for run_id in ALL_RUNS:
        world_size = RUNS[run_id]["world_size"]
        groups = ["world"] + (["subgroup"] if world_size in SUBGROUP else [])
        for group in groups:
            for case in GATHER_CASES:
                params.append(pytest.param(run_id, group, case, id=f"{run_id}-{group}-{case}"))
    return params


@pytest.mark.parametrize("run_id, group, case", _gather_params())
def test_local_tensor_lands_at_its_group_index(ddp_run, run_id, group, case):
    results, world_size = ddp_run(run_id), RUNS[run_id]["world_size"]
    members = list(range(world_size)) if group == "world" else SUBGROUP[world_size]
    expected_values = [gather_case(case, r, i) for i, r in enumerate(members)]
    if group == "subgroup":  # the set-up means something only if the two ranks differ
        assert all(results[r]["gather"][RUNS[run_id]["modes"][0]][group][case]["group_rank"] != r for r in members)
    for mode in RUNS[run_id]["modes"]:
        for index, rank in enumerate(members):
            got = results[rank]["gather"][mode][group][case]
            where = f"{mode} rank {rank} (group rank {index})"
            assert got["group_rank"] == index and got["global_rank"] == rank
            assert len(got["values"]) == len(members), where
            for value, expected in zip(got["values"], expected_values):
                assert torch.equal(value, expected), f"{where}: gathered values differ from what the ranks sent"
            keeps_graph = mode != "unpatched" or not DEFECTIVE
            if keeps_graph:
                # the caller's own tensor (a contiguous copy of it when it was not contiguous)
                assert got["identity"] == ([] if case == "noncontiguous" else [index]), where
                assert got["local_requires_grad"], where
                assert got["grad"] is not None and torch.equal(got["grad"], torch.ones_like(got["grad"])), where
            else:
                assert got["identity"] == [] and not got["local_requires_grad"] and got["grad"] is None, where


@pytest.mark.parametrize("run_id", UNPATCHED_RUNS)
def test_patch_adds_no_warning(ddp_run, run_id):
    """Up to 1.8.2 the padded path indexes with a list of slices; torch 2.13 still
    reads it as a tuple but warns (deprecated). That is the release's own
    behaviour: tmpatch neither adds nor removes a warning."""
    for rank, result in ddp_run(run_id).items():
        for group, cases in result["gather"]["unpatched"].items():
            for case, got in cases.items():
                assert result["gather"]["patched"][group][case]["warnings"] == got["warnings"], (rank, group, case)


@pytest.mark.parametrize("mode", ["patched"])
def test_rank_outside_the_group_gets_what_the_release_gives(ddp_run, mode):
    results = ddp_run("spawn-3")
    outsider = [r for r in range(3) if r not in SUBGROUP[3]]
    for rank in outsider:
        assert results[rank]["nonmember"][mode] == results[rank]["nonmember"]["unpatched"]


# -- the launcher: failures and hangs reach the parent, bounded ----------------
launcher_only = pytest.mark.skipif(
    RELEASE != LAUNCHER_RELEASE, reason=f"launcher self-tests run once, on torchmetrics {LAUNCHER_RELEASE}"
)


@launcher_only
def test_worker_failure_reaches_the_parent_with_its_traceback(tmp_path):
    start = time.monotonic()
    with pytest.raises(ddp_launch.WorkerError) as info:
        ddp_launch.spawn(fail_rank, 2, str(tmp_path / "run"), timeout=RUN_TIMEOUT)
    message = str(info.value)
    assert "Traceback" in message and "deliberate failure on rank 1" in message and "fail_rank" in message
    assert time.monotonic() - start < 60  # rank 0, stuck in a barrier, was terminated


@launcher_only
def test_hanging_run_is_killed_at_its_timeout(tmp_path):
    workdir = tmp_path / "run"
    start = time.monotonic()
    with pytest.raises(ddp_launch.WorkerTimeout):
        ddp_launch.spawn(hang_rank, 2, str(workdir), timeout=6)
    assert time.monotonic() - start < 30
    for pid_file in (workdir / "out").glob("pid*"):
        pid = int(pid_file.read_text())
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # reaped: no such process


@launcher_only
def test_a_rank_stuck_after_writing_its_result_is_killed_and_the_run_kept(tmp_path, capfd):
    start = time.monotonic()
    # the time-out must leave the ranks time to start and write (over 6 s on a loaded 2-core CI machine)
    results = ddp_launch.spawn(teardown_hang_rank, 2, str(tmp_path / "run"), timeout=25)
    assert results == {0: {"rank": 0}, 1: {"rank": 1}} and time.monotonic() - start < 75
    err = capfd.readouterr().err
    assert "every rank wrote its result" in err and "teardown_hang_rank" in err  # the rank's stack


@launcher_only
def test_a_torchrun_worker_deaf_to_sigterm_is_killed_and_the_run_kept(tmp_path):
    """torchrun starts each worker in a session of its own: a worker that survives its agent
    must not keep the parent waiting (it held the parent's pipe open before)."""
    workdir = tmp_path / "run"
    start = time.monotonic()
    results = ddp_launch.torchrun(WORKER_SCRIPT, 2, str(workdir), ["--deaf-teardown-hang"], timeout=20)
    assert results == {0: {"rank": 0}, 1: {"rank": 1}} and time.monotonic() - start < 60
    pids = [int(p.read_text()) for p in (workdir / "out").glob("pid*")]
    assert len(pids) == 2 and not any(ddp_launch._alive(pid) for pid in pids)  # killed (a zombie counts as dead)


# -- the command line ----------------------------------------------------------
@pytest.mark.skipif(release_in("<1.6.0"), reason="not-needed only from 1.6.0")
def test_cli_status_shows_not_needed():
    if not os.path.isfile(os.path.join(ROOT, "tmpatch", "__main__.py")):
        pytest.skip("no `tmpatch` command yet (tmpatch/__main__.py missing)")
    env = dict(os.environ, PYTHONPATH=ddp_launch.child_pythonpath())
    proc = subprocess.run(
        [sys.executable, "-m", "tmpatch", "status"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stdout
    lines = [line for line in proc.stdout.splitlines() if "gather_autograd" in line]
    assert lines and "not-needed" in lines[0], proc.stdout
