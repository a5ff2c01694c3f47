"""Steps driven by a Lightning Trainer, for ``tmpatch audit --step examples/lightning_step.py:make_fit``.

``make_fit(device)`` returns a callable that builds a LightningModule on ``device`` and fits it for two
steps: every sync of the fit is listed, Lightning's own (at the ``trainer.fit`` line) apart from the
module's (at its ``training_step`` lines). On simulated CUDA (the default) the Trainer needs a strategy
that takes the simulated device (``OnDevice``); with ``--real`` on a GPU it is an ordinary
single-device strategy on that GPU.
"""
import lightning as L
import torch
from lightning.pytorch.accelerators import CPUAccelerator
from lightning.pytorch.strategies import SingleDeviceStrategy
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(8, 5)
        self.accuracy = MulticlassAccuracy(num_classes=5, validate_args=False)
        self.loss_mean = MeanMetric()

    def training_step(self, batch, index):
        x, y = batch
        logits = self.layer(x)
        loss = torch.nn.functional.cross_entropy(logits, y)
        self.accuracy(logits, y)
        self.log("acc", self.accuracy)
        self.loss_mean(loss.detach())
        self.log("loss_mean", self.loss_mean)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class AnyDevice(CPUAccelerator):
    """Lightning's CPU accelerator, without its check that the device is the CPU."""

    def setup_device(self, device):
        pass


class OnDevice(SingleDeviceStrategy):
    """One device, the model moved there before ``fit`` and left there after it (simulated tensors
    cannot be moved again: Lightning moves the model at the start, and back to the CPU at the end)."""

    def model_to_device(self):
        pass

    def teardown(self):
        pass


def make_fit(device):
    data = TensorDataset(torch.randn(16, 8), torch.randint(0, 5, (16,)))

    def fit():
        model = Model().to(device)
        trainer = L.Trainer(strategy=OnDevice(device=device, accelerator=AnyDevice()), max_steps=2, logger=False,
                            enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
        trainer.fit(model, DataLoader(data, batch_size=8))

    return fit
