"""A whole training step, for ``tmpatch audit --step examples/train_step.py:make_step``.

A small conv net trained with SGD, a MetricCollection of Accuracy and F1 with their
defaults (``validate_args=True``, compute groups on) and a MeanMetric of the loss, as a
new user writes them, with a ``loss.item()`` for the progress bar. ``make_step(device)``
builds everything on ``device`` (set-up) and returns the step; the audit calls it twice
and counts the second call (the first call's work, such as the collection's check of its
compute groups, happens once per run). Without a GPU the backward pass and the optimizer
step run on simulated CUDA too.
"""
import torch
from torch import nn
from torchmetrics import MeanMetric, MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score

CLASSES = 10
progress = []


def make_step(device):
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(32, CLASSES),
    ).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    metrics = MetricCollection({"acc": MulticlassAccuracy(num_classes=CLASSES),
                                "f1": MulticlassF1Score(num_classes=CLASSES)}).to(device)
    loss_mean = MeanMetric().to(device)
    images = torch.randn(32, 3, 16, 16, device=device)
    labels = torch.randint(0, CLASSES, (32,), device=device)

    def step():
        optimizer.zero_grad()
        logits = model(images)
        loss = nn.functional.cross_entropy(logits, labels)
        loss.backward()
        optimizer.step()
        metrics.update(logits.detach(), labels)
        loss_mean.update(loss.detach())
        progress.append(loss.item())  # the progress bar's number: a read of the device

    return step
