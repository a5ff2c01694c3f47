"""Host time per ``update()``, patched against unpatched, on the patched paths of the audit panel.

    python benchmarks/panel_overhead.py                  # releases 1.4.0, 1.6.1, 1.9.0 from .matrix/
    python benchmarks/panel_overhead.py --release 1.9.0  # one
    python benchmarks/panel_overhead.py --here --case Mean --rounds 21   # the torchmetrics on the path, a subset

The method is benchmarks/overhead.py's (interleaved rounds of unpatched (U), patched (P) and
unpatched again (N) sides, each after ``revert()`` (+ ``apply()`` for P) with its metrics
rebuilt; the fastest of a few blocks on the thread CPU clock; per-round ratios P/U and the
null row N/U, the noise floor). P applies every patch (``tmpatch.apply()``, what a user
gets), so a case pays every layer its path goes through. One case per patched panel path
(``tmpatch audit``'s rows with a patched update, ``validate_args=False`` as there), with
the panel's arguments and a batch of 64 rows. Writes nothing but stdout;
benchmarks/panel_overhead.txt holds the last recorded run.
"""
from __future__ import annotations

import os
import subprocess
import sys
from typing import List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import overhead  # noqa: E402  (the method: measure(), its rounds, sides and clock)

RELEASES = overhead.RELEASES
N, C, L = 64, 5, 4


def _cases() -> List[overhead.Case]:
    """One ``update`` per patched panel path; a factory runs after apply/revert."""
    import torch
    import torchmetrics
    from torchmetrics import classification as cls

    g = torch.Generator().manual_seed(0)
    values, weights = torch.rand(N, generator=g), torch.rand(N, generator=g)
    probs = torch.rand(N, C, generator=g).softmax(1)
    labels = torch.randint(0, C, (N,), generator=g)
    binary, binary_target = torch.rand(N, generator=g), torch.randint(0, 2, (N,), generator=g)
    multilabel, multilabel_target = torch.rand(N, L, generator=g), torch.randint(0, 2, (N, L), generator=g)
    regression = (torch.rand(N, generator=g), torch.rand(N, generator=g))

    def update(build, *args) -> overhead.Callable[[], overhead.Call]:
        def factory() -> overhead.Call:
            metric = build()
            return lambda: metric.update(*args)

        return factory

    def mc(name: str, **kwargs):
        return lambda: getattr(cls, name)(num_classes=C, validate_args=False, **kwargs)

    def other(name: str, **kwargs):
        return lambda: getattr(cls, name)(validate_args=False, **kwargs)

    def ml(name: str, **kwargs):
        return lambda: getattr(cls, name)(num_labels=L, validate_args=False, **kwargs)

    agg = torchmetrics.aggregation
    return [
        ("MeanMetric.update(x)", None, update(agg.MeanMetric, values)),
        ("MeanMetric.update(x, w)", None, update(agg.MeanMetric, values, weights)),
        ("MeanMetric.update(3.5)", None, update(agg.MeanMetric, 3.5)),
        ("SumMetric.update(x)", None, update(agg.SumMetric, values)),
        ("MaxMetric.update(x)", None, update(agg.MaxMetric, values)),
        ("MulticlassAccuracy.update", None, update(mc("MulticlassAccuracy"), probs, labels)),
        ("MulticlassAccuracy(ignore_index).update", None,
         update(mc("MulticlassAccuracy", ignore_index=0), probs, labels)),
        ("MulticlassConfusionMatrix.update", None, update(mc("MulticlassConfusionMatrix"), probs, labels)),
        ("BinaryAccuracy.update", None, update(other("BinaryAccuracy"), binary, binary_target)),
        ("BinaryConfusionMatrix.update", None, update(other("BinaryConfusionMatrix"), binary, binary_target)),
        ("MultilabelAccuracy.update", None, update(ml("MultilabelAccuracy"), multilabel, multilabel_target)),
        ("BinaryAUROC(thresholds=50).update", None,
         update(other("BinaryAUROC", thresholds=50), binary, binary_target)),
        ("MulticlassPRCurve(thresholds=10).update", None,
         update(mc("MulticlassPrecisionRecallCurve", thresholds=10), probs, labels)),
        ("MeanSquaredError.update", None, update(torchmetrics.MeanSquaredError, *regression)),
    ]


def main(argv: List[str]) -> int:
    overhead._cases = _cases  # overhead.measure() runs these cases by its method
    if "--here" in argv:
        return overhead.main(argv)
    releases = [argv[i + 1] for i, a in enumerate(argv) if a == "--release"] or list(RELEASES)
    rest = [a for i, a in enumerate(argv) if a != "--release" and (i == 0 or argv[i - 1] != "--release")]
    for release in releases:
        folder = os.path.join(os.path.dirname(HERE), ".matrix", release)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([folder, os.path.dirname(HERE)]), OMP_NUM_THREADS="1")
        env.pop("TMPATCH", None)
        sys.stdout.flush()
        subprocess.run([sys.executable, os.path.abspath(__file__), "--here", *rest], env=env, check=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
