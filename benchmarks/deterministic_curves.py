"""Host time of a binned curve's and a confusion matrix's ``update()`` in deterministic mode on
the CPU (``torch.use_deterministic_algorithms(True)``): the release counts with an
N x thresholds x classes mesh there; tmpatch's recorded update counts with ``torch.bincount``,
deterministic on the CPU, into the same states.

    PYTHONPATH=.matrix/1.9.0:. python benchmarks/deterministic_curves.py > benchmarks/deterministic_curves.txt

Interleaved rounds in one process (unpatched, patched, ...), the median of each; the ratio is
patched/unpatched.
"""
from __future__ import annotations

import statistics
import time
import warnings

import torch
import torchmetrics
from torchmetrics import classification as cls

import tmpatch

warnings.simplefilter("ignore")
torch.manual_seed(0)
ROUNDS = 7
ROWS = [
    # the release's mesh holds (codes x bins) int64s: sizes kept to a few hundred MB
    ("MulticlassAUROC(10, thresholds=50), 64 scores", lambda: cls.MulticlassAUROC(10, thresholds=50),
     torch.softmax(torch.randn(64, 10), 1), torch.randint(0, 10, (64,))),
    ("BinaryAUROC(thresholds=100), 512 scores", lambda: cls.BinaryAUROC(thresholds=100),
     torch.rand(512), torch.randint(0, 2, (512,))),
    ("MulticlassConfusionMatrix(100), 2048 labels", lambda: cls.MulticlassConfusionMatrix(100),
     torch.randint(0, 100, (2048,)), torch.randint(0, 100, (2048,))),
]


def _time(metric, preds, target) -> float:
    start = time.perf_counter()
    metric.update(preds, target)
    return time.perf_counter() - start


def main() -> None:
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    print(f"torch {torch.__version__}, torchmetrics {torchmetrics.__version__}, one thread, deterministic mode, "
          f"{ROUNDS} interleaved rounds (median ms per update)")
    for name, make, preds, target in ROWS:
        times = {False: [], True: []}
        for _ in range(ROUNDS):
            for patched in (False, True):
                tmpatch.apply() if patched else tmpatch.revert()
                metric = make()
                metric.update(preds, target)  # first update: set-up
                times[patched].append(_time(metric, preds, target))
        tmpatch.revert()
        before, after = statistics.median(times[False]), statistics.median(times[True])
        print(f"{name:48s} release {before * 1e3:9.2f}  patched {after * 1e3:8.2f}  ratio {after / before:.5f} "
              f"({before / after:,.0f}x faster)")


if __name__ == "__main__":
    main()
