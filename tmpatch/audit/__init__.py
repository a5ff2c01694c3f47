"""Sync audit: find the host<->device synchronisations of a call, with or without a GPU.

Not imported by ``import tmpatch``; importing it imports torch (not torchmetrics).
Without a GPU, calls run on simulated CUDA tensors (``FakeTensorMode``) and an ATen-level
oracle records each sync point (see :mod:`tmpatch.audit.recorder` for the op mapping);
with one, ``torch.cuda.set_sync_debug_mode`` reports them.
"""
from tmpatch.audit.api import audit, count_syncs, no_sync, real_gpu_available
from tmpatch.audit.recorder import SyncRecorder, classify
from tmpatch.audit.report import AuditReport, SyncError, SyncKind, SyncPoint, result_devices
from tmpatch.audit.sim import SimulatedCuda, cuda_device, simulated_cuda, to_sim_cuda

__all__ = [
    "AuditReport",
    "SimulatedCuda",
    "SyncError",
    "SyncKind",
    "SyncPoint",
    "SyncRecorder",
    "audit",
    "classify",
    "count_syncs",
    "cuda_device",
    "no_sync",
    "real_gpu_available",
    "result_devices",
    "simulated_cuda",
    "to_sim_cuda",
]
