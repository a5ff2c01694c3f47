"""Host time per ``MeanMetric.update`` and ``SumMetric.update``: nan_check patched against unpatched.

    python benchmarks/aggregation_update.py                       # 1.4.0, 1.6.1, 1.9.0
    python benchmarks/aggregation_update.py --release 1.9.0       # one
    python benchmarks/aggregation_update.py --folder /tmp/tm      # releases installed elsewhere

Releases are read from ``<folder>/<release>`` (``pip install --no-deps --target``;
default ``.matrix/``, as ``tools/matrix.py`` installs them). For each release a
child process (one torch thread, CPU) times, in alternating blocks, the
release's own code and the ``nan_check`` patch (``tmpatch.apply``/``revert``
between blocks), with the default ``nan_strategy`` ("warn") and no NaN in the
data: the hot path of a training loop. It prints, per case, the median over
blocks of the time per call and the ratio patched/unpatched (goal: <= 1.0).
``benchmarks/aggregation_update.txt`` holds the last recorded run.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from typing import Callable, Dict, List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RELEASES = ("1.4.0", "1.6.1", "1.9.0")


def _per_call(fn: Callable[[], object], number: int) -> float:
    start = time.perf_counter()
    for _ in range(number):
        fn()
    return (time.perf_counter() - start) / number


def _cases() -> Dict[str, Callable[[], Callable[[], object]]]:
    """name -> factory of a zero-argument call (the metric is built after apply/revert)."""
    import torch
    from torchmetrics.aggregation import MeanMetric, SumMetric

    loss = torch.tensor(0.25)
    batch = torch.rand(256)
    weights = torch.rand(256)

    def call(cls: type, *args: object) -> Callable[[], object]:
        metric = cls()
        return lambda: metric.update(*args)

    return {
        "MeanMetric.update(loss 0-d)": lambda: call(MeanMetric, loss),
        "MeanMetric.update(x[256])": lambda: call(MeanMetric, batch),
        "MeanMetric.update(x[256], w[256])": lambda: call(MeanMetric, batch, weights),
        "SumMetric.update(loss 0-d)": lambda: call(SumMetric, loss),
        "SumMetric.update(x[256])": lambda: call(SumMetric, batch),
    }


def child(blocks: int, number: int) -> int:
    """Runs in the release's interpreter: time every case, both ways, interleaved."""
    import torch

    import tmpatch

    torch.set_num_threads(1)
    import torchmetrics

    cases = _cases()
    times: Dict[str, Dict[str, List[float]]] = {name: {"unpatched": [], "patched": []} for name in cases}
    for _ in range(blocks):
        for mode in ("unpatched", "patched"):
            if mode == "patched":
                tmpatch.apply("nan_check", strict=True)
            else:
                tmpatch.revert()
            for name, factory in cases.items():
                fn = factory()
                for _ in range(50):  # warm-up
                    fn()
                times[name][mode].append(_per_call(fn, number))
    tmpatch.revert()
    sys.stdout.write(f"torchmetrics {torchmetrics.__version__}, torch {torch.__version__}, CPU, 1 thread\n")
    for name, found in times.items():
        before, after = statistics.median(found["unpatched"]), statistics.median(found["patched"])
        sys.stdout.write(
            f"  {name:36s} unpatched {before * 1e6:7.1f} us   patched {after * 1e6:7.1f} us   "
            f"ratio {after / before:.2f}\n"
        )
    return 0


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--release", action="append", help="a torchmetrics release (repeatable)")
    parser.add_argument("--folder", default=os.path.join(ROOT, ".matrix"), help="where releases are installed")
    parser.add_argument("--blocks", type=int, default=9, help="alternating blocks per mode")
    parser.add_argument("--number", type=int, default=2000, help="calls per block")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args.blocks, args.number)
    status = 0
    for release in args.release or RELEASES:
        path = os.path.join(args.folder, release)
        if not os.path.isdir(os.path.join(path, "torchmetrics")):
            sys.stdout.write(f"torchmetrics {release}: not installed in {args.folder}\n")
            status = 1
            continue
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([path, ROOT]), OMP_NUM_THREADS="1")
        env.pop("TMPATCH", None)
        proc = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--child", "--blocks", str(args.blocks),
             "--number", str(args.number)],
            env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        sys.stdout.write(proc.stdout)
        sys.stdout.flush()
        status = status or proc.returncode
    return status


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
