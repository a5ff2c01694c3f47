"""Host time per ``update()`` of the training step's metrics on a device, unpatched against
patched, and where the patched host time goes (cProfile).

    python benchmarks/update_host_time.py --device cuda          # on a GPU
    python benchmarks/update_host_time.py --device cpu --calls 50 # a dry run anywhere

The metrics of ``benchmarks/train_step.py`` (MeanMetric of a loss; multiclass Accuracy,
Precision, Recall, F1 over ``--classes`` classes, ``validate_args=False``) on a logits batch
``(--batch, --classes)``. Per variant (alternating blocks, tmpatch applied around the patched
ones, metrics built after ``apply()``): *host* is the time the Python thread spends in
``--calls`` updates of one metric, *wall* that plus a final device synchronisation, both per
update. On a GPU an unpatched update's own syncs are inside its host time (the thread waits);
the patched one's kernels are only queued. Then cProfile of ``--calls`` patched updates of
MulticlassAccuracy: the functions with the most own time (the torch ops appear as the
built-ins that launch them). Writes nothing but stdout.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time
from typing import Any, Dict, List

import torch


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _metrics(classes: int) -> Dict[str, Any]:
    from torchmetrics import MeanMetric
    from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score, MulticlassPrecision, MulticlassRecall

    made: Dict[str, Any] = {"MeanMetric": MeanMetric()}
    for cls in (MulticlassAccuracy, MulticlassPrecision, MulticlassRecall, MulticlassF1Score):
        made[cls.__name__] = cls(num_classes=classes, validate_args=False)
    return made


def _block(metric: Any, args: tuple, calls: int, device: torch.device) -> tuple:
    _sync(device)
    start = time.perf_counter()
    for _ in range(calls):
        metric.update(*args)
    host = time.perf_counter() - start
    _sync(device)
    wall = time.perf_counter() - start
    return host / calls, wall / calls


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--calls", type=int, default=200, help="updates per timed block")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--top", type=int, default=25, help="cProfile rows")
    opts = parser.parse_args()

    import torchmetrics

    import tmpatch

    device = torch.device(opts.device)
    logits = torch.randn(opts.batch, opts.classes, device=device)
    target = torch.randint(0, opts.classes, (opts.batch,), device=device)
    loss = logits.float().logsumexp(1).mean()
    inputs = {"MeanMetric": (loss,)}
    name = device.type if device.type != "cuda" else torch.cuda.get_device_name(device)
    print(f"update_host_time: torch {torch.__version__}, torchmetrics {torchmetrics.__version__}, "
          f"device {name}; batch {opts.batch}, {opts.classes} classes; {opts.calls} updates per block, "
          f"{opts.rounds} rounds")
    times: Dict[str, Dict[str, List[tuple]]] = {}
    for _ in range(opts.rounds):
        for variant in ("unpatched", "patched"):
            tmpatch.revert()
            if variant == "patched":
                tmpatch.apply()
            for key, metric in _metrics(opts.classes).items():
                metric.to(device)
                args = inputs.get(key, (logits, target))
                _block(metric, args, 10, device)  # warm-up
                times.setdefault(key, {}).setdefault(variant, []).append(_block(metric, args, opts.calls, device))
    tmpatch.revert()
    print(f"\n{'metric':22s} {'host us/update':>26s} {'wall us/update':>26s}")
    print(f"{'':22s} {'unpatched  patched  ratio':>26s} {'unpatched  patched  ratio':>26s}")
    for key, per in times.items():
        cells = []
        for index in (0, 1):
            u = statistics.median(t[index] for t in per["unpatched"]) * 1e6
            p = statistics.median(t[index] for t in per["patched"]) * 1e6
            cells.append(f"{u:9.1f} {p:8.1f} {p / u:6.2f}")
        print(f"{key:22s} {cells[0]:>26s} {cells[1]:>26s}")

    for variant in ("unpatched", "patched"):
        tmpatch.revert()
        if variant == "patched":
            tmpatch.apply()
        metric = _metrics(opts.classes)["MulticlassAccuracy"].to(device)
        _block(metric, (logits, target), 10, device)
        profile = cProfile.Profile()
        profile.enable()
        _block(metric, (logits, target), opts.calls, device)
        profile.disable()
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(opts.top)
        lines = [line for line in text.getvalue().splitlines() if line.strip()]
        print(f"\ncProfile, {variant} MulticlassAccuracy, {opts.calls} updates (tottime: own time):")
        print("\n".join(lines[2:]))
    tmpatch.revert()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
