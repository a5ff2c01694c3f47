"""Host time per call, patched against unpatched, on the CPU, in one run.

    python benchmarks/overhead.py                  # releases 1.4.0, 1.6.1, 1.9.0 from .matrix/
    python benchmarks/overhead.py --release 1.4.0  # one
    python benchmarks/overhead.py --here           # the torchmetrics on the path

For each release a child process times, in alternating blocks, the release's
own code and tmpatch's (apply/revert between blocks), and reports the median
time per call and the ratio patched/unpatched (goal: <= 1.05). Writes nothing
but stdout; benchmarks/overhead.txt holds the last recorded run (it absorbed the
former aggregation_update.py: the aggregator cases apply the patches named).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from typing import Callable, Dict, List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RELEASES = ("1.4.0", "1.6.1", "1.9.0")


def _per_call(fn: Callable[[], object], number: int) -> float:
    start = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - start) / number


Case = Tuple[str, Optional[List[str]], Callable[[], Callable[[], object]]]


def _cases() -> List[Case]:
    """(name, patches applied for it (None: all), factory of a zero-argument call).

    The factory runs after apply/revert, so metrics get that state's methods.
    """
    import torch
    from torchmetrics import MeanMetric, SumMetric
    from torchmetrics.classification import MulticlassAccuracy
    from torchmetrics.utilities import compute

    num, denom = torch.rand(10), torch.tensor([0.0, 1.0] * 5)
    loss, batch, weights = torch.tensor(0.25), torch.rand(256), torch.rand(256)
    preds, target = torch.randint(0, 10, (64,)), torch.randint(0, 10, (64,))

    def safe_divide():
        fn = compute._safe_divide
        return lambda: fn(num, denom)

    def update(cls: type, *args: object) -> Callable[[], Callable[[], object]]:
        def factory():
            metric = cls()
            return lambda: metric.update(*args)

        return factory

    def accuracy():
        metric = MulticlassAccuracy(num_classes=10, validate_args=False)

        def step():
            metric.update(preds, target)
            return metric.compute()

        return step

    mean = ["mean_default_weight", "nan_check"]
    return [
        ("_safe_divide", ["safe_divide"], safe_divide),
        ("MeanMetric.update(loss 0-d)", mean, update(MeanMetric, loss)),
        ("MeanMetric.update(x[256])", mean, update(MeanMetric, batch)),
        ("MeanMetric.update(x[256], w[256])", mean, update(MeanMetric, batch, weights)),
        ("MeanMetric.update(0.5)", mean, update(MeanMetric, 0.5)),
        ("SumMetric.update(loss 0-d)", ["nan_check"], update(SumMetric, loss)),
        ("SumMetric.update(x[256])", ["nan_check"], update(SumMetric, batch)),
        ("MulticlassAccuracy update+compute", ["safe_divide"], accuracy),
        ("MulticlassAccuracy update+compute", None, accuracy),
    ]


def measure(blocks: int, number: int) -> List[str]:
    import warnings

    import torch
    import torchmetrics

    import tmpatch

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    lines = [f"torchmetrics {torchmetrics.__version__}, torch {torch.__version__}, CPU, 1 thread, "
             f"{blocks} blocks x {number} calls"]
    for name, patches, factory in _cases():
        times: Dict[bool, List[float]] = {False: [], True: []}
        for block in range(blocks * 2):
            patched = block % 2 == 1
            tmpatch.apply(patches) if patched else tmpatch.revert()
            call = factory()
            _per_call(call, max(1, number // 10))  # warm-up
            times[patched].append(_per_call(call, number))
        tmpatch.revert()
        before, after = statistics.median(times[False]), statistics.median(times[True])
        lines.append(f"  {name:36s} unpatched {before * 1e6:8.2f} us  patched {after * 1e6:8.2f} us  "
                     f"ratio {after / before:5.3f}  ({', '.join(patches) if patches else 'all patches'})")
    states = tmpatch.apply().states()
    tmpatch.revert()
    lines.append("  patches: " + ", ".join(f"{k}={v}" for k, v in states.items()))
    return lines


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--release", action="append", help="torchmetrics release(s) in .matrix/")
    parser.add_argument("--here", action="store_true", help="measure the torchmetrics on the path")
    parser.add_argument("--blocks", type=int, default=7)
    parser.add_argument("--number", type=int, default=2000)
    args = parser.parse_args(argv)
    if args.here:
        sys.stdout.write("\n".join(measure(args.blocks, args.number)) + "\n")
        return 0
    for release in args.release or RELEASES:
        folder = os.path.join(ROOT, ".matrix", release)
        if not os.path.isdir(folder):
            subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", folder,
                            f"torchmetrics=={release}"], check=True)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([folder, ROOT]), OMP_NUM_THREADS="1")
        env.pop("TMPATCH", None)
        subprocess.run([sys.executable, os.path.abspath(__file__), "--here", "--blocks", str(args.blocks),
                        "--number", str(args.number)], env=env, check=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
