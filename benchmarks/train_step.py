"""Training-step time and host-device syncs per step: no metrics, unpatched metrics, patched metrics.

    python benchmarks/train_step.py                      # CPU: step time, syncs simulated
    python benchmarks/train_step.py --device cuda        # GPU: step time, syncs counted for real
    python benchmarks/train_step.py --steps 60 --batch 128 --classes 1000

A small conv net (pure torch, synthetic data, pre-built batches) trained with SGD. The
metric variants run the published case's set after each step: MeanMetric of the loss and
multiclass Accuracy, Precision, Recall, F1 over ``--classes`` classes (validate_args=False),
one ``update`` each. Variants run in alternating blocks (``--rounds``), tmpatch applied
only around the patched blocks, with metrics built after ``apply()``. Reported: the median
step time after warm-up, its ratio to no metrics, and the syncs of one step's metric
updates: counted with ``torch.cuda.set_sync_debug_mode("warn")`` on a GPU, found by the
:mod:`tmpatch.audit` oracle on simulated CUDA tensors on the CPU. On a GPU the headline
is the patched step time within 1% of no metrics.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import nn

VARIANTS = ("no metrics", "unpatched metrics", "patched metrics")
SYNC_MESSAGE = "synchronizing CUDA operation"


class ConvNet(nn.Module):
    """Four conv blocks and a linear head: a small ResNet-free stand-in for an image model."""

    def __init__(self, classes: int, width: int = 32) -> None:
        super().__init__()

        def block(cin: int, cout: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout),
                                 nn.ReLU(inplace=True))

        self.features = nn.Sequential(block(3, width), block(width, width), nn.MaxPool2d(2),
                                      block(width, 2 * width), block(2 * width, 2 * width),
                                      nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(2 * width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


def build_metrics(classes: int) -> List[Any]:
    """The published case's five metrics (build after ``tmpatch.apply()`` for the patched variant)."""
    from torchmetrics import MeanMetric
    from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score, MulticlassPrecision, MulticlassRecall

    return [MeanMetric()] + [cls(num_classes=classes, validate_args=False) for cls in
                             (MulticlassAccuracy, MulticlassPrecision, MulticlassRecall, MulticlassF1Score)]


def update_metrics(metrics: List[Any], loss: torch.Tensor, logits: torch.Tensor, target: torch.Tensor) -> None:
    """One step's metric work."""
    metrics[0].update(loss)
    for metric in metrics[1:]:
        metric.update(logits, target)


class Trainer:
    """Model, optimiser and pre-built synthetic batches on one device."""

    def __init__(self, device: torch.device, batch: int, classes: int, size: int, seed: int = 0) -> None:
        torch.manual_seed(seed)
        self.device = device
        self.model = ConvNet(classes).to(device)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        self.loss_fn = nn.CrossEntropyLoss()
        self.batches = [(torch.randn(batch, 3, size, size, device=device),
                         torch.randint(0, classes, (batch,), device=device)) for _ in range(4)]
        self.i = 0

    def step(self, metrics: Optional[List[Any]]) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x, y = self.batches[self.i % len(self.batches)]
        self.i += 1
        logits = self.model(x)
        loss = self.loss_fn(logits, y)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        loss, logits = loss.detach(), logits.detach()
        if metrics is not None:
            update_metrics(metrics, loss, logits, y)
        return loss, logits, y


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_steps(trainer: Trainer, metrics: Optional[List[Any]], n: int) -> List[float]:
    """Seconds per step, each step closed by a device synchronisation (outside the step's work)."""
    times = []
    for _ in range(n):
        _sync(trainer.device)
        start = time.perf_counter()
        trainer.step(metrics)
        _sync(trainer.device)
        times.append(time.perf_counter() - start)
    return times


def real_syncs(trainer: Trainer, metrics: Optional[List[Any]]) -> int:
    """Syncs of one whole training step on a GPU (``set_sync_debug_mode("warn")``)."""
    _sync(trainer.device)
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            trainer.step(metrics)
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    return sum(SYNC_MESSAGE in str(w.message) for w in caught)


def simulated_syncs(metrics: List[Any], loss: torch.Tensor, logits: torch.Tensor, target: torch.Tensor) -> int:
    """Sync points of one step's metric updates on simulated CUDA (the model's step has none)."""
    from tmpatch.audit import audit

    report = audit(update_metrics, metrics, loss.cpu(), logits.cpu(), target.cpu(), real=False)
    return report.count


class Variant:
    """A variant's metrics and the tmpatch state it runs in."""

    def __init__(self, name: str, classes: int, device: torch.device) -> None:
        self.name = name
        self.patched = name == "patched metrics"
        self.metrics: Optional[List[Any]] = None
        if name != "no metrics":
            with self:
                self.metrics = [metric.to(device) for metric in build_metrics(classes)]

    def __enter__(self) -> "Variant":
        import tmpatch

        if self.patched:
            tmpatch.apply()
        else:
            tmpatch.revert()
        return self

    def __exit__(self, *exc: Any) -> None:
        import tmpatch

        tmpatch.revert()


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default cpu)")
    parser.add_argument("--steps", type=int, default=60, help="timed steps per variant (default 60)")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps per variant first (default 5)")
    parser.add_argument("--rounds", type=int, default=10, help="alternating blocks per variant (default 10)")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--size", type=int, default=32, help="image side (default 32)")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (default: torch's)")
    args = parser.parse_args(argv)

    import torchmetrics

    import tmpatch

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA GPU here")
    if args.threads:
        torch.set_num_threads(args.threads)
    tmpatch.revert()
    trainer = Trainer(device, args.batch, args.classes, args.size)
    variants = [Variant(name, args.classes, device) for name in VARIANTS]
    per_block = max(1, args.steps // args.rounds)

    for variant in variants:
        with variant:
            for _ in range(args.warmup):
                trainer.step(variant.metrics)
    times: Dict[str, List[float]] = {v.name: [] for v in variants}
    for _ in range(args.rounds):
        for variant in variants:
            with variant:
                times[variant.name] += timed_steps(trainer, variant.metrics, per_block)

    syncs: Dict[str, int] = {}
    for variant in variants:
        with variant:
            if device.type == "cuda":
                syncs[variant.name] = real_syncs(trainer, variant.metrics)
            elif variant.metrics is None:
                syncs[variant.name] = 0
            else:
                loss, logits, target = trainer.step(None)
                syncs[variant.name] = simulated_syncs(variant.metrics, loss, logits, target)

    how = "counted (set_sync_debug_mode)" if device.type == "cuda" else "simulated (tmpatch.audit, CUDA oracle)"
    gpu = f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""
    print(f"train_step: torch {torch.__version__}, torchmetrics {torchmetrics.__version__}, "
          f"device {device}{gpu}, threads {torch.get_num_threads()}")
    print(f"conv net, batch {args.batch}, {args.classes} classes, {args.size}x{args.size} images; "
          f"{len(times[VARIANTS[0]])} timed steps per variant in {args.rounds} alternating rounds, "
          f"after {args.warmup} warm-up steps")
    base = statistics.median(times["no metrics"])
    print(f"\n{'variant':<18}  {'median ms/step':>14}  {'vs no metrics':>13}  syncs/step ({how})")
    for variant in variants:
        median = statistics.median(times[variant.name])
        print(f"{variant.name:<18}  {median * 1e3:>14.2f}  {median / base:>12.3f}x  {syncs[variant.name]}")
    patched = statistics.median(times["patched metrics"]) / base
    if device.type == "cuda":
        verdict = "PASS" if patched <= 1.01 else "FAIL"
        print(f"\nheadline: patched step time within 1% of no metrics: {verdict} ({(patched - 1) * 100:+.2f}%)")
    else:
        print("\nOn the CPU nothing waits for a device: the times show host cost only, and the syncs are those "
              "the same step would have on CUDA (sync points: a CUDA bincount is one point but two syncs). "
              "Run with --device cuda on a GPU for the headline (patched step time within 1% of no metrics).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
