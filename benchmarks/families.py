"""Host time per ``update()``, patched against unpatched, for the metric families of issue #14.

    python benchmarks/families.py                  # releases 1.4.0, 1.6.1, 1.9.0 from .matrix/
    python benchmarks/families.py --release 1.9.0  # one
    python benchmarks/families.py --here --case Retrieval --rounds 21   # the torchmetrics on the path, a subset

The method is benchmarks/overhead.py's, run with the cases below: interleaved rounds of
unpatched (U), patched (P) and unpatched again (N) sides, each after ``revert()`` (+
``apply(patches)`` for P) with its metrics rebuilt; the fastest of a few blocks on the
thread CPU clock; per-round ratios P/U and the null row N/U (the noise floor). See
overhead.py's docstring. One case per family (one metric with simple valid arguments,
the patch of that family and the patches it requires); each family's patch is listed
with the case. Writes nothing but stdout; benchmarks/families.txt holds the last
recorded run.
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


def _cases() -> List[overhead.Case]:
    """One ``update`` per family, on a batch of 256 rows; a factory runs after apply/revert."""
    import torch
    from torchmetrics.audio import SignalDistortionRatio
    from torchmetrics.classification import BinaryFairness, BinaryGroupStatRates
    from torchmetrics.detection import PanopticQuality
    from torchmetrics.nominal import CramersV
    from torchmetrics.retrieval import RetrievalMAP, RetrievalPrecision

    g = torch.Generator().manual_seed(0)
    n = 256
    scores, relevant = torch.rand(n, generator=g), torch.randint(0, 2, (n,), generator=g)
    queries = torch.randint(0, 16, (n,), generator=g)
    first, second = torch.randint(0, 5, (n,), generator=g), torch.randint(0, 5, (n,), generator=g)
    groups = torch.randint(0, 4, (n,), generator=g)
    speech, estimate = torch.randn(4, 1024, generator=g), torch.randn(4, 1024, generator=g)
    colors = torch.stack([torch.randint(0, 4, (2, 16, 16), generator=g),
                          torch.randint(0, 3, (2, 16, 16), generator=g)], -1)

    def update(build, *args, **kwargs) -> overhead.Callable[[], overhead.Call]:
        def factory() -> overhead.Call:
            metric = build()

            return lambda: metric.update(*args, **kwargs)

        return factory

    cases = [
        ("RetrievalMAP.update", ("retrieval_check",), update(RetrievalMAP, scores, relevant, indexes=queries)),
        ("RetrievalPrecision.update(float t)", ("retrieval_check",),
         update(lambda: RetrievalPrecision(top_k=4), scores, relevant.float(), indexes=queries)),
        ("CramersV.update", ("nominal_bincount",), update(lambda: CramersV(num_classes=5), first, second)),
        ("BinaryGroupStatRates.update", ("fairness_groups",),
         update(lambda: BinaryGroupStatRates(num_groups=4, validate_args=False), scores, relevant, groups)),
        ("BinaryFairness.update", ("fairness_groups",),
         update(lambda: BinaryFairness(num_groups=4, validate_args=False), scores, relevant, groups)),
        ("PanopticQuality.update(2x16x16)", ("panoptic_matching",),
         update(lambda: PanopticQuality(things={0, 1}, stuffs={2, 3}), colors, colors.flip(1))),
        ("SignalDistortionRatio.update", ("sdr_solve",),
         update(lambda: SignalDistortionRatio(filter_length=64), estimate, speech)),
    ]
    try:  # 1.5.0+
        from torchmetrics.segmentation import HausdorffDistance
    except ImportError:
        return cases
    masks = (torch.rand(2, 3, 16, 16, generator=g) < 0.3).long(), (torch.rand(2, 3, 16, 16, generator=g) < 0.3).long()
    cases.append(("HausdorffDistance.update(2x3x16x16)", ("edge_distances",),
                  update(lambda: HausdorffDistance(num_classes=3), *masks)))
    return cases


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
