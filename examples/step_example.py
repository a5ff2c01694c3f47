"""A training step's metric work, for ``tmpatch audit --step examples/step_example.py:make_step``.

``make_step(device)`` builds the metrics and a batch on ``device`` (set-up, not audited) and
returns the step: a callable without arguments, audited once per run (tmpatch reverted, then
applied). Under the audit without a GPU, ``device`` is a simulated CUDA device: tensors have
shapes, dtypes and devices but no values.
"""
import torch
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy

history = []


def log_value(name, value):
    """A logging helper: keeps a Python float of ``value`` (a device-to-host read per call)."""
    history.append((name, float(value)))


def make_step(device):
    loss_mean = MeanMetric().to(device)
    accuracy = MulticlassAccuracy(num_classes=10, validate_args=False).to(device)
    preds = torch.randn(32, 10, device=device)
    target = torch.randint(0, 10, (32,), device=device)

    def step():
        loss = torch.nn.functional.cross_entropy(preds, target)
        loss_mean.update(loss)
        accuracy.update(preds, target)
        log_value("loss", loss)
        if loss.isnan():  # a Python `if` on a device tensor reads it back
            raise RuntimeError("loss is NaN")

    return step
