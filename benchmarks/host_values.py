"""Host time per ``update()``, patched against unpatched, for the patches of issue #14's sources 4, 6 and 7.

    python benchmarks/host_values.py                  # releases 1.4.0, 1.6.1, 1.9.0 from .matrix/
    python benchmarks/host_values.py --release 1.4.0  # one
    python benchmarks/host_values.py --here --case PSNR --rounds 21   # the torchmetrics on the path, a subset

The method is benchmarks/overhead.py's (see its docstring; families.py runs it the same
way): interleaved rounds of unpatched (U), patched (P) and unpatched again (N) sides, each
after ``revert()`` (+ ``apply(patches)`` for P, which adds the patches they require) with
its metrics rebuilt; the fastest of a few blocks on the thread CPU clock; per-round ratios
P/U and the null row N/U (the noise floor). One ``update`` per patch, on small valid inputs;
a class the release lacks is left out (Dice from 1.7.0). Writes nothing but stdout
(no run recorded yet: save one as benchmarks/host_values.txt with this command).
"""
from __future__ import annotations

import os
import subprocess
import sys
from typing import Any, Callable, List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import overhead  # noqa: E402  (the method: measure(), its rounds, sides and clock)

RELEASES = overhead.RELEASES


def _cases() -> List[overhead.Case]:
    """One ``update`` per patch; a factory runs after apply/revert."""
    import torch
    import torchmetrics
    from packaging.version import Version
    from torchmetrics import MeanSquaredError
    from torchmetrics.classification import MulticlassExactMatch
    from torchmetrics.detection import PanopticQuality
    from torchmetrics.image import PeakSignalNoiseRatio, PeakSignalNoiseRatioWithBlockedEffect
    from torchmetrics.regression import LogCoshError, PearsonCorrCoef, TweedieDevianceScore
    from torchmetrics.wrappers import BootStrapper, MultioutputWrapper

    release = Version(torchmetrics.__version__)
    g = torch.Generator().manual_seed(0)
    n = 256
    x, y = torch.rand(n, generator=g) + 0.1, torch.rand(n, generator=g) + 0.1
    labels, guesses = torch.randint(0, 5, (n, 4), generator=g), torch.randint(0, 5, (n, 4), generator=g)
    image, other = torch.rand(4, 3, 32, 32, generator=g), torch.rand(4, 3, 32, 32, generator=g)
    gray, gray2 = torch.rand(4, 1, 32, 32, generator=g), torch.rand(4, 1, 32, 32, generator=g)
    pairs, pairs2 = torch.rand(n, 2, generator=g), torch.rand(n, 2, generator=g)
    cats = torch.tensor([0, 1, 2, 3])[torch.randint(0, 4, (2, 16, 16), generator=g)]
    panoptic = torch.stack([cats, torch.randint(0, 3, (2, 16, 16), generator=g)], -1)
    masks, masks2 = torch.rand(4, 3, 16, 16, generator=g) > 0.5, torch.rand(4, 3, 16, 16, generator=g) > 0.5

    def update(build: Callable[[], Any], *args: Any) -> Callable[[], overhead.Call]:
        def factory() -> overhead.Call:
            metric = build()
            return lambda: metric.update(*args)

        return factory

    psnrb = {"data_range": 1.0} if release >= Version("1.8.0") else {}
    cases: List[overhead.Case] = [
        ("LogCoshError.update", ("scalar_tensors",), update(LogCoshError, x, y)),
        ("MulticlassExactMatch.update", ("scalar_tensors",),
         update(lambda: MulticlassExactMatch(num_classes=5, validate_args=False), guesses, labels)),
        ("PeakSignalNoiseRatio.update", ("image_constants",),
         update(lambda: PeakSignalNoiseRatio(data_range=1.0), image, other)),
        ("PSNRB.update", ("image_constants",),
         update(lambda: PeakSignalNoiseRatioWithBlockedEffect(**psnrb), gray, gray2)),
        ("MultioutputWrapper(MSE, 2).update", ("wrapper_indices",),
         update(lambda: MultioutputWrapper(MeanSquaredError(), 2, remove_nans=False), pairs, pairs2)),
        ("BootStrapper(MSE, 4).update", ("wrapper_indices",),
         update(lambda: BootStrapper(MeanSquaredError(), num_bootstraps=4), x, y)),
        ("PanopticQuality.update", ("panoptic_preprocess",),
         update(lambda: PanopticQuality(things={0, 1}, stuffs={2, 3}), panoptic, panoptic.flip(1))),
        ("PearsonCorrCoef.update", ("pearson_update",), update(PearsonCorrCoef, x, y)),
        ("TweedieDevianceScore(1.5).update", ("tweedie_checks",),
         update(lambda: TweedieDevianceScore(power=1.5), x, y)),
    ]
    if release >= Version("1.4.0"):
        from torchmetrics.segmentation import MeanIoU

        cases.append(("MeanIoU.update(bool)", ("segmentation_format",), update(lambda: MeanIoU(num_classes=3),
                                                                                  masks, masks2)))
    if release < Version("1.7.0"):
        from torchmetrics.classification import Dice

        cases.append(("Dice.update", ("legacy_dice_checks",), update(lambda: Dice(num_classes=5), labels[:, 0],
                                                                     guesses[:, 0])))
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
