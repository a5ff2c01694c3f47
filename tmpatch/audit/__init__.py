"""Sync audit: find the host<->device synchronisations of a call, with or without a GPU.

Not imported by ``import tmpatch``; importing it imports torch (not torchmetrics).
Without a GPU, calls run on simulated CUDA tensors (``FakeTensorMode``) and an ATen-level
oracle records each sync point (see :mod:`tmpatch.audit.classify` for the op table); with
one, ``torch.cuda.set_sync_debug_mode`` reports them. Works on CPU-only builds of torch
and on CUDA builds without a GPU or driver, torch >= 2.1 (:mod:`tmpatch.audit.support`);
below that, every name of this package raises ``ImportError`` saying so.
"""
from typing import Any

from tmpatch.audit import support

__all__ = [
    "AuditReport",
    "Breaks",
    "BranchReport",
    "SimulatedCuda",
    "SyncError",
    "SyncKind",
    "SyncPoint",
    "SyncRecorder",
    "audit",
    "audit_branches",
    "classify",
    "count_syncs",
    "cuda_device",
    "graph_breaks",
    "no_sync",
    "real_gpu_available",
    "result_devices",
    "simulated_cuda",
    "to_sim_cuda",
]

UNSUPPORTED = support.problem()

if UNSUPPORTED is None:
    from tmpatch.audit.api import audit, count_syncs, no_sync, real_gpu_available
    from tmpatch.audit.branches import BranchReport, audit_branches
    from tmpatch.audit.breaks import Breaks, graph_breaks
    from tmpatch.audit.recorder import SyncRecorder, classify
    from tmpatch.audit.report import AuditReport, SyncError, SyncKind, SyncPoint, result_devices
    from tmpatch.audit.sim import SimulatedCuda, cuda_device, simulated_cuda, to_sim_cuda
else:
    def __getattr__(name: str) -> Any:
        if name in __all__:
            raise ImportError(UNSUPPORTED)
        raise AttributeError(name)
