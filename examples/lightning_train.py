"""A tiny Lightning run with torchmetrics, to compare the release with tmpatch.

::

    python examples/lightning_train.py --out release.json
    TMPATCH=1 python examples/lightning_train.py --out patched.json
    tmpatch run -- python examples/lightning_train.py --devices 2 --out ddp.json   # DDP, 2 CPU ranks

Each rank writes ``OUT`` (rank 1: ``OUT.rank1``): what it logged (``float.hex``: bit for bit), the
warnings it was given (words, category, file), the exception that ended the run, and whether
tmpatch was applied in that process. ``--nan`` feeds one NaN loss to ``MeanMetric(nan_strategy="warn")``;
``--bad-target`` one target of 5 to ``MulticlassAccuracy(num_classes=5)`` (``--no-validate``: with
``validate_args=False``); ``--no-deterministic`` runs without ``Trainer(deterministic=True)``.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import traceback
import warnings
from typing import Any, Dict, List

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics import MeanMetric, MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score, MulticlassPrecision

seen: List[Dict[str, Any]] = []
_show = warnings.showwarning


def _record(message, category, filename, lineno, file=None, line=None):  # type: ignore[no-untyped-def]
    seen.append({"message": str(message), "category": category.__name__,
                 "file": "/".join(filename.split(os.sep)[-2:])})
    _show(message, category, filename, lineno, file, line)


warnings.showwarning = _record
notes: List[str] = []  # tmpatch's notes (logger "tmpatch", INFO): where a deferred report came from


class _Notes(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        notes.append(record.getMessage())


logging.getLogger("tmpatch").addHandler(_Notes(logging.INFO))
logging.getLogger("tmpatch").setLevel(logging.INFO)


class Model(L.LightningModule):
    def __init__(self, nan: bool, bad_target: bool, validate: bool) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 5)
        self.nan, self.bad_target = nan, bad_target
        self.accuracy = MulticlassAccuracy(num_classes=5, validate_args=validate)
        self.scores = MetricCollection({"precision": MulticlassPrecision(num_classes=5),
                                        "f1": MulticlassF1Score(num_classes=5, average="micro")})
        self.loss_mean = MeanMetric(nan_strategy="warn")

    def training_step(self, batch: Any, index: int) -> torch.Tensor:
        x, y = batch
        if self.bad_target and index == 1:
            y = y.clone()
            y[0] = 5  # outside [0, num_classes)
        logits = self.layer(x)
        loss = torch.nn.functional.cross_entropy(logits, y.clamp(max=4))
        self.accuracy(logits, y)  # forward(): the batch value, and the epoch's states
        self.log("acc", self.accuracy, on_step=True, on_epoch=True)
        self.scores(logits, y)
        self.log_dict(self.scores, on_step=True, on_epoch=True)  # a MetricCollection: each member
        value = loss.detach()
        if self.nan and index == 1:
            value = torch.tensor(float("nan"))
        self.loss_mean(value)
        self.log("loss_mean", self.loss_mean, on_step=True, on_epoch=True)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--nan", action="store_true")
    parser.add_argument("--bad-target", action="store_true")
    parser.add_argument("--no-validate", action="store_true")
    parser.add_argument("--no-deterministic", action="store_true")
    parser.add_argument("--csv", help="a CSVLogger in this folder (default: no logger)")
    args = parser.parse_args()

    L.seed_everything(0, verbose=False)
    data = TensorDataset(torch.randn(64, 8), torch.randint(0, 5, (64,)))
    model = Model(args.nan, args.bad_target, not args.no_validate)
    logger: Any = False
    if args.csv:
        from lightning.pytorch.loggers import CSVLogger

        logger = CSVLogger(args.csv, name="run", version=0)
    trainer = L.Trainer(deterministic=not args.no_deterministic, accelerator="cpu", devices=args.devices,
                        strategy="ddp" if args.devices > 1 else "auto", max_epochs=1, logger=logger,
                        enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
    error = None
    try:
        trainer.fit(model, DataLoader(data, batch_size=8))
    except Exception as exc:  # the run's end, recorded for the comparison
        error = {"type": type(exc).__name__, "message": str(exc),
                 "at": traceback.extract_tb(exc.__traceback__)[-1].name}
    rank = trainer.global_rank
    tm = sys.modules.get("tmpatch")  # imported by TMPATCH=1 / tmpatch run in every process, ranks included
    applied = sorted(row.name for row in tm.status() if row.state == "applied") if tm else []
    result = {
        "rank": rank,
        "applied": len(applied),
        "env": os.environ.get("TMPATCH", ""),
        "logged": {k: float(v).hex() for k, v in sorted(trainer.callback_metrics.items())},
        "warnings": seen,
        "error": error,
        "notes": notes,
    }
    with open(args.out + (f".rank{rank}" if rank else ""), "w") as handle:
        json.dump(result, handle, indent=1)


if __name__ == "__main__":
    main()
