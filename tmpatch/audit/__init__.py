"""Sync audit: find the host<->device synchronisations of a call, with or without a GPU.

Not imported by ``import tmpatch``; importing it imports torch (not torchmetrics).
Without a GPU, calls run on simulated CUDA tensors (``FakeTensorMode``) and an ATen-level
oracle records each sync point (see :mod:`tmpatch.audit.oracle.classify` for the op table); with
one, ``torch.cuda.set_sync_debug_mode`` reports them. Works on CPU-only builds of torch
and on CUDA builds without a GPU or driver, torch >= 2.1 (:mod:`tmpatch.audit.support`);
below that, every name of this package raises ``ImportError`` saying so.

Contract: the audit sits on top of tmpatch and uses only its public API and
:mod:`tmpatch.control.session`; nothing below imports it. Its products are
sub-packages, each on the ones it names: the oracle (:mod:`~tmpatch.audit.oracle`:
simulated CUDA and the sync recorder, the names above), the built-in panel
(:mod:`~tmpatch.audit.panel`), the library sweep (:mod:`~tmpatch.audit.sweep`), the
user's step (:mod:`~tmpatch.audit.step`) and the GPU calibration
(:mod:`~tmpatch.audit.calibrate`); ``tmpatch audit`` is :mod:`~tmpatch.audit.cli`.
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
    from tmpatch.audit.oracle.api import audit, count_syncs, no_sync, real_gpu_available
    from tmpatch.audit.oracle.branches import BranchReport, audit_branches
    from tmpatch.audit.oracle.breaks import Breaks, graph_breaks
    from tmpatch.audit.oracle.recorder import SyncRecorder, classify
    from tmpatch.audit.oracle.report import AuditReport, SyncError, SyncKind, SyncPoint, result_devices
    from tmpatch.audit.oracle.sim import SimulatedCuda, cuda_device, simulated_cuda, to_sim_cuda
else:
    def __getattr__(name: str) -> Any:
        if name in __all__:
            raise ImportError(UNSUPPORTED)
        raise AttributeError(name)
