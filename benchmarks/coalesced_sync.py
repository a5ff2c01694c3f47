"""Collectives and wall time of a DDP sync, with and without ``coalesced_sync``.

    PYTHONPATH=.matrix/1.9.0:. python benchmarks/coalesced_sync.py              # 2 and 3 ranks
    PYTHONPATH=.matrix/1.9.0:. python benchmarks/coalesced_sync.py --world 2 --rounds 5

What is measured, on gloo process groups of 2 and 3 ranks on localhost (CPU):
``compute()`` of a MetricCollection of 1, 5 and 20 metrics (MeanMetric,
SumMetric, MulticlassAccuracy, MulticlassConfusionMatrix, MaxMetric,
MulticlassF1Score, MinMetric, CatMetric, in turn; ``compute_groups=False``, so
every member holds its own states), and ``forward()`` of the same collections
built with ``dist_sync_on_step=True`` (every member syncs its batch states).

Method. Every rank runs the same rounds. A round has three sides in rotating
order: unpatched (U, ``tmpatch.revert()``), patched (P, ``tmpatch.apply(
"coalesced_sync")``) and unpatched again (N); each side builds its collection,
warms up once, then times ``--number`` calls, each after ``reset()``, one
``update()`` and a barrier (none of them timed), with ``time.perf_counter`` on
rank 0 (the collectives make every rank wait for the slowest, so rank 0's wall
time is the sync's). A side's figure is its median call; per round the ratios
P/U and N/U are taken, and the table gives their median and interquartile range
over the rounds. N/U is the null row: the noise floor of this shared machine.
"collectives" counts every call of a public ``torch.distributed`` collective
made by one ``compute()``/``forward()`` on rank 0.
Writes nothing but stdout; benchmarks/coalesced_sync.txt holds the last recorded run.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from typing import Any, Dict, List, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

SIZES = (1, 5, 20)
SIDES = ("U", "P", "N")


def _members(size: int, **kwargs: Any) -> Any:
    from torchmetrics import CatMetric, MaxMetric, MeanMetric, MetricCollection, MinMetric, SumMetric
    from torchmetrics.classification import MulticlassAccuracy, MulticlassConfusionMatrix, MulticlassF1Score

    kinds = (
        lambda: MeanMetric(**kwargs), lambda: SumMetric(**kwargs),
        lambda: MulticlassAccuracy(num_classes=5, **kwargs), lambda: MulticlassConfusionMatrix(num_classes=5, **kwargs),
        lambda: MaxMetric(**kwargs), lambda: MulticlassF1Score(num_classes=5, **kwargs),
        lambda: MinMetric(**kwargs), lambda: CatMetric(**kwargs),
    )
    return MetricCollection({f"m{i}": kinds[i % len(kinds)]() for i in range(size)}, compute_groups=False)


def _batch(rank: int, step: int) -> Dict[str, Any]:
    import torch

    gen = torch.Generator().manual_seed(rank * 1000 + step)
    rows = 16 + 4 * rank
    return {"value": torch.randn(rows, generator=gen), "preds": torch.randint(0, 5, (rows,), generator=gen),
            "target": torch.randint(0, 5, (rows,), generator=gen)}


def _side(side: str, what: str, size: int, rank: int, number: int, counter: Any) -> Tuple[float, int]:
    import torch.distributed as dist

    import tmpatch

    tmpatch.revert()
    if side == "P":
        tmpatch.apply("coalesced_sync")
    coll = _members(size, dist_sync_on_step=(what == "forward"))
    times: List[float] = []
    calls = 0
    for step in range(number + 1):
        batch = _batch(rank, step)
        coll.reset()
        if what == "compute":
            coll.update(**batch)
        dist.barrier()
        counter.take()
        start = time.perf_counter()
        if what == "compute":
            coll.compute()
        else:
            coll(**batch)
        elapsed = time.perf_counter() - start
        calls = len(counter.take())
        if step:  # the first call warms up
            times.append(elapsed)
    return statistics.median(times), calls


def _worker(rank: int, world: int, init_method: str, out_dir: str, rounds: int, number: int) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world,
                            timeout=timedelta(seconds=300))
    import tmpatch  # noqa: F401
    from tests.distributed.coalesce_workers import Counter

    counter = Counter()
    rows: Dict[str, Any] = {}
    for what in ("compute", "forward"):
        for size in SIZES:
            ratios: Dict[str, List[float]] = {"P": [], "N": []}
            medians: Dict[str, List[float]] = {side: [] for side in SIDES}
            calls: Dict[str, int] = {}
            for index in range(rounds):
                order = SIDES[index % 3:] + SIDES[:index % 3]
                got = {side: _side(side, what, size, rank, number, counter) for side in order}
                for side, (seconds, count) in got.items():
                    medians[side].append(seconds)
                    calls[side] = count
                ratios["P"].append(got["P"][0] / got["U"][0])
                ratios["N"].append(got["N"][0] / got["U"][0])
            rows[f"{what}/{size}"] = {"medians": medians, "ratios": ratios, "calls": calls}
    if rank == 0:
        torch.save(rows, os.path.join(out_dir, "rows.pt"))
    dist.barrier()
    dist.destroy_process_group()


def _quartiles(values: List[float]) -> Tuple[float, float, float]:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return q[0], statistics.median(values), q[2]


def main(argv: List[str]) -> int:
    import torch
    import torch.multiprocessing as mp
    import torchmetrics

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--world", type=int, action="append", help="ranks (repeatable; default 2 and 3)")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--number", type=int, default=5, help="timed calls per side")
    args = parser.parse_args(argv)
    print(f"torchmetrics {torchmetrics.__version__}, torch {torch.__version__}, gloo on localhost, "
          f"{os.cpu_count()} cores, 1 torch thread per rank; {args.rounds} rounds x {args.number} calls per side")
    print("  world  call       metrics  collectives U -> P   unpatched    patched   ratio P/U [IQR]      "
          "null N/U [IQR]")
    for world in args.world or [2, 3]:
        with tempfile.TemporaryDirectory() as tmp:
            start = time.monotonic()
            mp.start_processes(_worker, args=(world, f"file://{tmp}/store", tmp, args.rounds, args.number),
                               nprocs=world, join=True, start_method="spawn")
            rows = torch.load(os.path.join(tmp, "rows.pt"))
        for key, row in rows.items():
            what, size = key.split("/")
            p = _quartiles(row["ratios"]["P"])
            n = _quartiles(row["ratios"]["N"])
            u_ms = statistics.median(row["medians"]["U"]) * 1e3
            p_ms = statistics.median(row["medians"]["P"]) * 1e3
            print(f"  {world:5d}  {what:9s}  {int(size):7d}  {row['calls']['U']:11d} -> {row['calls']['P']:<3d}"
                  f"  {u_ms:8.2f} ms  {p_ms:7.2f} ms   {p[1]:.3f} [{p[0]:.3f}-{p[2]:.3f}]  "
                  f"{n[1]:.3f} [{n[0]:.3f}-{n[2]:.3f}]")
        print(f"  ({world} ranks: {time.monotonic() - start:.0f}s)")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
