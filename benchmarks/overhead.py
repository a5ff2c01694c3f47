"""Host time per call, patched against unpatched, on the CPU, with a noise floor.

    python benchmarks/overhead.py                  # releases 1.4.0, 1.6.1, 1.9.0 from .matrix/
    python benchmarks/overhead.py --release 1.4.0  # one
    python benchmarks/overhead.py --here           # the torchmetrics on the path
    python benchmarks/overhead.py --case MeanMetric --rounds 21   # a subset, quicker
    python benchmarks/overhead.py --device-path    # the patched side on its GPU path (CPU shortcuts off)

Method. For each release a child process (1 torch thread) runs many short
*rounds*. A round has three *sides* in rotating order: unpatched (U), patched
(P) and unpatched again (N). Every side starts with ``tmpatch.revert()``; P
then calls ``tmpatch.apply(patches)``. Each side rebuilds its metrics
(torchmetrics binds ``update`` when a metric is built), warms up, and times
``--repeat`` blocks of ``--number`` calls per case; the side's figure is the
fastest block. Per round the ratios P/U and N/U are taken; the table gives
their median and interquartile range over the rounds. N/U compares the same
code by the same procedure: the *null row*, the noise floor of the machine.
A P/U ratio means something only where its IQR is clear of the null's. The
unpatched/patched columns are medians over rounds of each side alone: under a
drifting load they need not divide to the ratio, which is the figure to read.

Why so: on a shared machine the load drifts over seconds, so a ratio of two
long runs reads +-20% (a former null comparison read 1.215). Sides a fraction
of a second apart see nearly the same load, and their ratio cancels most of it. The clock is
``time.thread_time`` (CPU time of this thread): torch runs its one intra-op
thread on the caller, so it counts all of the call's work, but not the time the
thread waits while another process holds the core: under heavy contention the
wall clock's null IQR reached +-30%, the thread clock's stayed within +-10%
(``--timer perf`` for wall time; overhead.txt compares them). The fastest of a
few blocks drops blocks hit by an interrupt or a cache flush. The garbage
collector is off in a block.
Writes nothing but stdout; benchmarks/overhead.txt holds the last recorded run.
"""
from __future__ import annotations

import argparse
import gc
import os
import statistics
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RELEASES = ("1.4.0", "1.6.1", "1.9.0")
TIMERS: Dict[str, Callable[[], int]] = {"thread": time.thread_time_ns, "perf": time.perf_counter_ns}
AGGREGATION = ("mean_default_weight", "nan_check")

Call = Callable[[], object]
#: (name, patches applied for it (None: all), factory of a zero-argument call)
Case = Tuple[str, Optional[Tuple[str, ...]], Callable[[], Call]]


def _cases() -> List[Case]:
    """The cases; a factory runs after apply/revert, so metrics get that state's methods."""
    import torch
    from torchmetrics import MeanMetric, SumMetric
    from torchmetrics.classification import MulticlassAccuracy
    from torchmetrics.utilities import compute

    num, denom = torch.rand(10), torch.tensor([0.0, 1.0] * 5)
    loss, weight = torch.tensor(0.25), torch.tensor(32.0)
    batch, weights = torch.rand(1000), torch.rand(1000)
    preds, target = torch.randint(0, 10, (64,)), torch.randint(0, 10, (64,))

    def safe_divide() -> Call:
        fn = compute._safe_divide
        return lambda: fn(num, denom)

    def update(cls: type, *args: object) -> Callable[[], Call]:
        def factory() -> Call:
            metric = cls()
            return lambda: metric.update(*args)

        return factory

    def accuracy_metric() -> object:
        return MulticlassAccuracy(num_classes=10, validate_args=False)

    def accuracy() -> Call:
        metric = MulticlassAccuracy(num_classes=10, validate_args=False)

        def step() -> object:
            metric.update(preds, target)
            return metric.compute()

        return step

    return [
        ("MeanMetric.update(loss 0-d)", AGGREGATION, update(MeanMetric, loss)),
        ("MeanMetric.update(x[1000])", AGGREGATION, update(MeanMetric, batch)),
        ("MeanMetric.update(loss 0-d, w 0-d)", AGGREGATION, update(MeanMetric, loss, weight)),
        ("MeanMetric.update(x[1000], w[1000])", AGGREGATION, update(MeanMetric, batch, weights)),
        ("MeanMetric.update(0.5)", AGGREGATION, update(MeanMetric, 0.5)),
        ("SumMetric.update(loss 0-d)", AGGREGATION, update(SumMetric, loss)),
        ("SumMetric.update(x[1000])", AGGREGATION, update(SumMetric, batch)),
        ("_safe_divide", ("safe_divide",), safe_divide),
        ("MulticlassAccuracy.update", ("bincount",), update(accuracy_metric, preds, target)),
        ("MulticlassAccuracy update+compute", ("safe_divide",), accuracy),
        ("MulticlassAccuracy update+compute", None, accuracy),
    ]


def _fastest_block(call: Call, number: int, repeat: int, clock: Callable[[], int]) -> float:
    """Seconds per call in the fastest of ``repeat`` blocks of ``number`` calls."""
    best = float("inf")
    for _ in range(repeat):
        gc.disable()
        try:
            start = clock()
            for _ in range(number):
                call()
            best = min(best, clock() - start)
        finally:
            gc.enable()
    return best / number / 1e9


def _quartiles(values: Sequence[float]) -> Tuple[float, float, float]:
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, median, q3


def device_path() -> None:
    """Turn the patches' CPU shortcuts off in this process: on the CPU, where a read costs no
    sync, a patch may take the release's path after a read (:mod:`tmpatch.runtime.host`);
    ``--device-path`` makes the patched side run the path it takes on a GPU (its host cost,
    less the device's launch costs)."""
    from tmpatch.runtime import host

    def never(obj: object) -> bool:
        return False

    host.on_host = host.host_device = never


def measure(rounds: int, number: int, repeat: int, timer: str, select: Sequence[str] = (),
            device: bool = False) -> List[str]:
    import warnings

    import torch
    import torchmetrics

    import tmpatch

    if device:
        device_path()
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    clock = TIMERS[timer]
    cases = [c for c in _cases() if not select or any(s in c[0] for s in select)]
    groups: Dict[Optional[Tuple[str, ...]], List[int]] = {}
    for index, (_, patches, _) in enumerate(cases):
        groups.setdefault(patches, []).append(index)
    # times[case][side]: per round, seconds per call; sides U (unpatched), P (patched), N (unpatched again)
    times: List[Dict[str, List[float]]] = [{"U": [], "P": [], "N": []} for _ in cases]
    orders = ("UPN", "PNU", "NUP", "UNP", "NPU", "PUN")  # each side in each position, each pair both ways
    for patches, members in groups.items():
        for index in range(rounds):
            for side in orders[index % len(orders)]:
                tmpatch.revert()
                if side == "P":
                    tmpatch.apply(list(patches) if patches is not None else None)
                calls = [cases[i][2]() for i in members]
                for i, call in zip(members, calls):
                    _fastest_block(call, max(1, number // 5), 1, clock)  # warm-up
                    times[i][side].append(_fastest_block(call, number, repeat, clock))
                del calls
        tmpatch.revert()
    header = (f"torchmetrics {torchmetrics.__version__}, torch {torch.__version__}, CPU, 1 thread, "
              f"clock {timer}, {rounds} rounds x fastest of {repeat} blocks x {number} calls"
              + (", patched side on its device path (CPU shortcuts off)" if device else ""))
    lines = [header,
             f"  {'case':36s} {'unpatched':>10s} {'patched':>10s}   {'ratio P/U  [IQR]':22s}  "
             f"{'null N/U  [IQR]':22s}  patches"]
    for (name, patches, _), got in zip(cases, times):
        ratio = _quartiles([p / u for p, u in zip(got["P"], got["U"])])
        null = _quartiles([n / u for n, u in zip(got["N"], got["U"])])
        lines.append(
            f"  {name:36s} {statistics.median(got['U']) * 1e6:7.2f} us {statistics.median(got['P']) * 1e6:7.2f} us"
            f"   {ratio[1]:5.3f} [{ratio[0]:5.3f}-{ratio[2]:5.3f}]  {null[1]:5.3f} [{null[0]:5.3f}-{null[2]:5.3f}]"
            f"  {', '.join(patches) if patches else 'all'}"
        )
    states = tmpatch.apply().states()
    tmpatch.revert()
    lines.append("  patches: " + ", ".join(f"{k}={v}" for k, v in states.items()))
    return lines


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--release", action="append", help="torchmetrics release(s) in .matrix/")
    parser.add_argument("--here", action="store_true", help="measure the torchmetrics on the path")
    parser.add_argument("--rounds", type=int, default=60, help="rounds (each: unpatched, patched, unpatched)")
    parser.add_argument("--number", type=int, default=50, help="calls per timed block")
    parser.add_argument("--repeat", type=int, default=5, help="blocks per side and round; the fastest counts")
    parser.add_argument("--timer", choices=sorted(TIMERS), default="thread")
    parser.add_argument("--case", action="append", default=[], help="only cases whose name contains this")
    parser.add_argument("--device-path", action="store_true",
                        help="the patched side takes the path it takes on a GPU (the patches' CPU shortcuts off)")
    args = parser.parse_args(argv)
    if args.rounds < 2:
        parser.error("--rounds: at least 2 (quartiles of the per-round ratios)")
    options = ["--rounds", str(args.rounds), "--number", str(args.number), "--repeat", str(args.repeat),
               "--timer", args.timer] + [f"--case={c}" for c in args.case] + \
        (["--device-path"] if args.device_path else [])
    if args.here:
        lines = measure(args.rounds, args.number, args.repeat, args.timer, args.case, args.device_path)
        sys.stdout.write("\n".join(lines) + "\n")
        return 0
    for release in args.release or RELEASES:
        folder = os.path.join(ROOT, ".matrix", release)
        if not os.path.isdir(folder):
            subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", folder,
                            f"torchmetrics=={release}"], check=True)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([folder, ROOT]), OMP_NUM_THREADS="1")
        env.pop("TMPATCH", None)
        sys.stdout.flush()
        subprocess.run([sys.executable, os.path.abspath(__file__), "--here"] + options, env=env, check=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
