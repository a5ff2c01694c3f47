"""Time per ``update()`` in deterministic mode on the CPU, unpatched against patched.

    OMP_NUM_THREADS=1 PYTHONPATH=.matrix/1.9.0:. python benchmarks/deterministic_cpu.py

With ``torch.use_deterministic_algorithms(True)`` the release's ``_bincount`` compares every
code with every bin, an N x minlength mesh, on every device (``torch.bincount`` is
deterministic on the CPU, yet not used there); the patched update counts plainly (the
bincount patch's recorded update). Rounds interleave the two sides (each rebuilt after
``revert()`` / ``apply()``), the median per side and of the per-round ratios is printed;
the states of both sides are checked equal, bit for bit, first.
"""
from __future__ import annotations

import statistics
import sys
import time
from typing import Any, Callable, List, Tuple

import torch
from torchmetrics import classification as cls

import tmpatch


def _cases() -> List[Tuple[str, Callable[[], Any], Tuple[Any, ...]]]:
    g = torch.Generator().manual_seed(0)
    n = 128
    multiclass = (torch.randn(n, 5, generator=g).softmax(1), torch.randint(0, 5, (n,), generator=g))
    binary = (torch.rand(1000, generator=g), torch.randint(0, 2, (1000,), generator=g))
    multilabel = (torch.rand(n, 3, generator=g), torch.randint(0, 2, (n, 3), generator=g))
    return [
        ("MulticlassAUROC(5 classes, thresholds=50), batch 128",
         lambda: cls.MulticlassAUROC(5, thresholds=50, validate_args=False), multiclass),
        ("BinaryAUROC(thresholds=50), batch 1000", lambda: cls.BinaryAUROC(thresholds=50, validate_args=False),
         binary),
        ("MultilabelAveragePrecision(3 labels, thresholds=50), batch 128",
         lambda: cls.MultilabelAveragePrecision(3, thresholds=50, validate_args=False), multilabel),
        ("MulticlassAccuracy(5 classes), batch 128", lambda: cls.MulticlassAccuracy(5, validate_args=False),
         multiclass),
    ]


def _side(patched: bool, make: Callable[[], Any]) -> Any:
    tmpatch.revert()
    if patched:
        tmpatch.apply()
    return make()


def _time(metric: Any, args: Tuple[Any, ...], number: int) -> float:
    start = time.perf_counter()
    for _ in range(number):
        metric.update(*args)
    return (time.perf_counter() - start) / number


def main(rounds: int = 7, number: int = 3) -> int:
    import torchmetrics

    print(f"deterministic_cpu: torch {torch.__version__}, torchmetrics {torchmetrics.__version__}, "
          f"{torch.get_num_threads()} thread(s); {rounds} rounds x {number} updates per side, interleaved")
    print(f"\n  {'case':<64} {'unpatched':>11} {'patched':>10} {'ratio P/U':>10}")
    torch.use_deterministic_algorithms(True)
    try:
        for name, make, args in _cases():
            reference, metric = _side(False, make), _side(True, make)
            reference.update(*args)
            metric.update(*args)
            for got, want in zip((getattr(metric, s) for s in metric._defaults),
                                 (getattr(reference, s) for s in reference._defaults)):
                assert torch.equal(got, want) and got.dtype == want.dtype, name
            sides = {False: [], True: []}
            ratios = []
            for _ in range(rounds):
                times = {}
                for patched in (False, True):
                    side = _side(patched, make)
                    side.update(*args)  # warm
                    times[patched] = _time(side, args, number)
                    sides[patched].append(times[patched])
                ratios.append(times[True] / times[False])
            u, p = statistics.median(sides[False]), statistics.median(sides[True])
            print(f"  {name:<64} {u * 1e3:>8.2f} ms {p * 1e3:>7.2f} ms {statistics.median(ratios):>10.4f}")
    finally:
        torch.use_deterministic_algorithms(False)
        tmpatch.revert()
    return 0


if __name__ == "__main__":
    sys.exit(main())
