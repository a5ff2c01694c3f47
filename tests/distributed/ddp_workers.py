"""What every rank runs in the multi-process ``gather_autograd`` tests.

Started by :mod:`distributed.ddp_launch` (``torch.multiprocessing`` spawn, one
call per rank: ``run_rank(rank, world_size, init_method, out_dir, modes)``) or
as a script under ``torch.distributed.run`` (rank and world from the
environment). Every rank runs the same scenarios in the same order, once per
*mode*:

* ``unpatched``: ``tmpatch.revert()``, the release as it is;
* ``patched``: ``tmpatch.apply("gather_autograd")`` (after torchmetrics was
  imported: the engine's sweep path);
* ``coalesced``: ``gather_autograd`` and ``coalesced_sync`` (the states of a
  ``forward()`` are gathered in one coalesced exchange);
* ``env``: nothing is called; ``TMPATCH=1`` patched the interpreter at start-up.

Each rank writes what it saw (losses, the gradient of its own inputs or the
error, ``compute()`` values, where its own tensor landed in the gathered list)
to ``<out_dir>/rank<global rank>.pt``; the parent test compares them with a
single-process reference built from the same data (:func:`batch`,
:func:`gather_case`). This module imports torch but never torchmetrics at
import time, so the parent can import it for the data.
"""
from __future__ import annotations

import argparse
import faulthandler
import os
import signal
import sys
import threading
import time
import warnings
import zlib
from datetime import timedelta
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

#: columns of every prediction / target batch
D = 2
#: collective timeout of every process group (seconds): a lost peer fails, never hangs
PG_TIMEOUT = 60.0
#: a worker ends itself after this long, whatever happens (seconds)
WORKER_DEADLINE = float(os.environ.get("TMPATCH_DDP_WORKER_DEADLINE", "240"))


class Scenario:
    """One metric-as-loss run: ``kind`` "sum" (states of equal shape: a vector
    and a scalar, the ``_simple_gather_all_tensors`` path) or "cat" (list
    states of uneven length across ranks, the padded path); ``members``: the
    global ranks of the process group (None: the world); ``sizes[step][i]``: the
    batch size of the i-th member at that step (0: an empty state)."""

    def __init__(self, name: str, kind: str, sizes: Sequence[Sequence[int]], members: Optional[Sequence[int]] = None):
        self.name, self.kind, self.sizes = name, kind, [list(s) for s in sizes]
        self.members = None if members is None else list(members)

    def ranks(self, world_size: int) -> List[int]:
        return list(range(world_size)) if self.members is None else list(self.members)

    def __repr__(self) -> str:
        return f"Scenario({self.name})"


#: the scenarios of one run, per world size; every rank of the run executes them all
SCENARIOS: Dict[int, List[Scenario]] = {
    2: [
        Scenario("equal", "sum", [[3, 3], [2, 4]]),
        Scenario("uneven", "cat", [[3, 1], [2, 0]]),  # step 2: rank 1's batch state is empty
    ],
    3: [
        Scenario("equal", "sum", [[2, 2, 2], [0, 3, 1]]),
        Scenario("uneven", "cat", [[0, 2, 3], [1, 3, 0]]),  # rank 0 then rank 2 empty
        # new_group([1, 2]): global rank 1 is group rank 0, global rank 2 is group rank 1
        Scenario("subgroup-equal", "sum", [[2, 3], [1, 1]], members=[1, 2]),
        Scenario("subgroup-uneven", "cat", [[2, 3], [0, 1]], members=[1, 2]),
    ],
}

#: direct ``gather_all_tensors`` calls: the world, and (3 ranks) a subgroup
GATHER_CASES = ("scalar", "equal", "uneven", "empty", "noncontiguous")
SUBGROUP = {3: [1, 2]}


def _generator(*key: Any) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32("/".join(map(str, key)).encode()))


def batch(scenario: str, step: int, rank: int, n: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """The (preds, target) a global rank feeds at a step: float32, (n, D)."""
    gen = _generator(scenario, step, rank)
    return torch.randn(n, D, generator=gen), torch.randn(n, D, generator=gen)


def gather_case(case: str, rank: int, index: int) -> torch.Tensor:
    """What global ``rank`` (``index`` in its group) passes to ``gather_all_tensors``."""
    gen = _generator("gather", case, rank)
    if case == "scalar":
        return torch.randn((), generator=gen)
    if case == "equal":
        return torch.randn(3, D, generator=gen)
    if case == "uneven":
        return torch.randn(index + 1, D, generator=gen)
    if case == "empty":  # group rank 0 holds nothing
        return torch.randn(index, D, generator=gen)
    if case == "noncontiguous":
        return torch.randn(D, index + 2, generator=gen).t()
    raise ValueError(case)


def _metric_classes() -> Dict[str, type]:
    from torchmetrics import Metric
    from torchmetrics.utilities.data import dim_zero_cat

    class SumMSE(Metric):
        """Mean squared error from sum states: ``sq`` (shape (D,)) and ``n`` (0-d)."""

        full_state_update = False

        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.add_state("sq", default=torch.zeros(D), dist_reduce_fx="sum")
            self.add_state("n", default=torch.tensor(0.0), dist_reduce_fx="sum")

        def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:
            self.sq = self.sq + ((preds - target) ** 2).sum(dim=0)
            self.n = self.n + preds.shape[0]

        def compute(self) -> torch.Tensor:
            return self.sq.sum() / (self.n * D)

    class CatMSE(Metric):
        """Mean squared error from concatenated states (uneven across ranks)."""

        full_state_update = False

        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.add_state("preds", default=[], dist_reduce_fx="cat")
            self.add_state("target", default=[], dist_reduce_fx="cat")

        def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:
            self.preds.append(preds)
            self.target.append(target)

        def compute(self) -> torch.Tensor:
            return ((dim_zero_cat(self.preds) - dim_zero_cat(self.target)) ** 2).mean()

    return {"sum": SumMSE, "cat": CatMSE}


def _set_mode(mode: str) -> str:
    import tmpatch

    if mode == "unpatched":
        tmpatch.revert()
    elif mode == "patched":
        tmpatch.apply("gather_autograd")
    elif mode == "coalesced":  # with coalesced_sync: the batch states are gathered in one exchange
        tmpatch.apply(["gather_autograd", "coalesced_sync"])
    elif mode != "env":
        raise ValueError(mode)
    return tmpatch.status()["gather_autograd"].state


def _run_scenario(sc: Scenario, rank: int, world_size: int, group: Any, classes: Dict[str, type]) -> Dict[str, Any]:
    members = sc.ranks(world_size)
    me = members.index(rank)
    metric = classes[sc.kind](dist_sync_on_step=True, process_group=group)
    steps = []
    for step, sizes in enumerate(sc.sizes):
        preds, target = batch(sc.name, step, rank, sizes[me])
        preds.requires_grad_(True)
        loss = metric(preds, target)  # forward: syncs the batch states across the group
        record: Dict[str, Any] = {
            "loss": loss.detach().clone(),
            "requires_grad": bool(loss.requires_grad),
            "error": None,
        }
        if loss.requires_grad:
            loss.backward()  # an error here is a failure of the run
        else:
            try:
                loss.backward()
                record["error"] = "no error"
            except RuntimeError as exc:  # the graph is gone: what unpatched 1.0-1.5.2 does
                record["error"] = f"{type(exc).__name__}: {exc}"
        record["grad"] = None if preds.grad is None else preds.grad.detach().clone()
        steps.append(record)
    value = metric.compute()  # epoch value over every step, synced (sync_on_compute)
    return {"steps": steps, "compute": value.detach().clone(), "group_rank": me}


def _gather_checks(rank: int, group: Any, members: List[int]) -> Dict[str, Any]:
    from torchmetrics.utilities import distributed as tmd

    me = members.index(rank)
    out: Dict[str, Any] = {}
    for case in GATHER_CASES:
        x = gather_case(case, rank, me).requires_grad_(True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = tmd.gather_all_tensors(x, group=group)
        local = got[me]
        if local.requires_grad:
            local.sum().backward()
        out[case] = {
            "identity": [i for i, t in enumerate(got) if t is x],
            "values": [t.detach().clone() for t in got],
            "local_requires_grad": bool(local.requires_grad),
            "grad": None if x.grad is None else x.grad.clone(),
            "warnings": sorted({str(w.message).split("(Triggered")[0].strip() for w in caught}),
            "group_rank": me,
            "global_rank": rank,
        }
    return out


def _nonmember_check(group: Any) -> str:
    """What a rank outside ``group`` gets from ``gather_all_tensors`` of a scalar."""
    from torchmetrics.utilities import distributed as tmd

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            got = tmd.gather_all_tensors(torch.tensor(1.0), group=group)
        except Exception as exc:  # noqa: BLE001 - reported to the parent as data
            return f"{type(exc).__name__}: {exc}"
    return f"list of {len(got)}"


def run_all(rank: int, world_size: int, modes: Sequence[str]) -> Dict[str, Any]:
    import torch.distributed as dist
    import torchmetrics

    import tmpatch  # noqa: F401 - before torchmetrics, as a user would

    classes = _metric_classes()
    groups: Dict[Tuple[int, ...], Any] = {}
    wanted = [tuple(sc.members) for sc in SCENARIOS[world_size] if sc.members] + [tuple(SUBGROUP.get(world_size, ()))]
    for members in wanted:  # every rank creates every group, in the same order
        if members and members not in groups:
            groups[members] = dist.new_group(list(members))
    result: Dict[str, Any] = {
        "release": torchmetrics.__version__,
        "rank": rank,
        "world_size": world_size,
        "state": {},
        "scenarios": {},
        "gather": {},
        "nonmember": {},
    }
    for mode in modes:
        result["state"][mode] = _set_mode(mode)
        for sc in SCENARIOS[world_size]:
            members = sc.ranks(world_size)
            if rank in members:
                group = groups[tuple(members)] if sc.members else None
                result["scenarios"].setdefault(sc.name, {})[mode] = _run_scenario(sc, rank, world_size, group, classes)
        checks = {"world": _gather_checks(rank, None, list(range(world_size)))}
        sub = SUBGROUP.get(world_size)
        if sub:
            if rank in sub:
                checks["subgroup"] = _gather_checks(rank, groups[tuple(sub)], sub)
            else:
                result["nonmember"][mode] = _nonmember_check(groups[tuple(sub)])
        result["gather"][mode] = checks
        dist.barrier()
    return result


def save(out_dir: str, rank: int, result: Any) -> None:
    """Write this rank's result whole or not at all (the launcher may read it while a
    rank is still tearing its process group down)."""
    path = os.path.join(out_dir, f"rank{rank}.pt")
    torch.save(result, path + ".part")
    os.replace(path + ".part", path)


def _watchdog() -> None:
    """End this process if it outlives WORKER_DEADLINE (no orphan ever hangs); a SIGTERM
    from the launcher (its timeout) first prints every thread's stack, to say where it hung."""
    faulthandler.register(signal.SIGTERM, all_threads=True, chain=True)
    def expire() -> None:
        sys.stderr.write(f"ddp_workers: pid {os.getpid()} passed its {WORKER_DEADLINE:.0f}s deadline; exiting\n")
        sys.stderr.flush()
        os._exit(124)

    timer = threading.Timer(WORKER_DEADLINE, expire)
    timer.daemon = True
    timer.start()


def _init(rank: int, world_size: int, init_method: str) -> None:
    import torch.distributed as dist

    _watchdog()
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=init_method, rank=rank, world_size=world_size, timeout=timedelta(seconds=PG_TIMEOUT)
    )


def _finish() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def run_rank(rank: int, world_size: int, init_method: str, out_dir: str, modes: Sequence[str]) -> None:
    """Entry point for ``torch.multiprocessing`` spawn."""
    _init(rank, world_size, init_method)
    try:
        result = run_all(rank, world_size, modes)
        save(out_dir, rank, result)
    finally:
        _finish()


# -- workers for the launcher's own tests ------------------------------------
def fail_rank(rank: int, world_size: int, init_method: str, out_dir: str) -> None:
    """Rank 1 raises; the others wait in a barrier that never completes."""
    _init(rank, world_size, init_method)
    try:
        import torch.distributed as dist

        if rank == 1:
            raise ValueError("deliberate failure on rank 1")
        dist.barrier()
    finally:
        _finish()


def hang_rank(rank: int, world_size: int, init_method: str, out_dir: str) -> None:
    """Every rank sleeps far past any test timeout."""
    with open(os.path.join(out_dir, f"pid{rank}"), "w") as handle:
        handle.write(str(os.getpid()))
    time.sleep(600)


def teardown_hang_rank(rank: int, world_size: int, init_method: str, out_dir: str,
                       deaf: bool = False) -> None:
    """Every rank writes its result; then rank 1 sleeps far past any test timeout (a rank
    stuck tearing its process group down); ``deaf``: it ignores SIGTERM too (stuck where
    only SIGKILL reaches it)."""
    _watchdog()
    with open(os.path.join(out_dir, f"pid{rank}"), "w") as handle:
        handle.write(str(os.getpid()))
    save(out_dir, rank, {"rank": rank})
    if rank == 1:
        if deaf:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(600)


def main(argv: Optional[Sequence[str]] = None) -> None:
    """Entry point under ``torch.distributed.run`` (RANK, WORLD_SIZE from the environment)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--modes", default="unpatched,patched")
    parser.add_argument("--deaf-teardown-hang", action="store_true", help="run teardown_hang_rank(deaf=True)")
    args = parser.parse_args(argv)
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if args.deaf_teardown_hang:
        teardown_hang_rank(rank, world_size, "env://", args.out, deaf=True)
        return
    run_rank(rank, world_size, "env://", args.out, args.modes.split(","))


if __name__ == "__main__":
    main()
