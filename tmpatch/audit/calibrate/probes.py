"""The probe table: one small function per event the audit knows, with its expected verdict.

Each :class:`Probe` is a function of CUDA tensors (:mod:`tmpatch.audit.calibrate.probe_fns`; its
inputs are built on the CPU by ``make`` and moved by :func:`tmpatch.audit.audit`), the
sync kinds the simulated audit must report (in order, each at a line of the function),
the non-syncs, and whether it raises on a GPU as well. The test suite runs every probe on
every torch of the matrix; :mod:`tmpatch.audit.calibrate.run` runs them on a real GPU and
compares.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Tuple

import torch

from tmpatch.audit.calibrate import probe_fns as F
from tmpatch.audit.oracle.classify import MULTINOMIAL_READS
from tmpatch.audit.oracle.report import SyncKind as K
from tmpatch.audit.support import torch_at_least


@dataclass(frozen=True)
class Probe:
    """One event: ``fn(*make())`` on CUDA reports ``syncs`` then ``others`` (non-syncs)."""

    fn: Callable[..., Any]
    syncs: Tuple[K, ...] = ()
    others: Tuple[K, ...] = ()
    make: Callable[[], tuple] = lambda: (F.vector(),)
    raises: Optional[type] = None  #: raises on a GPU too (e.g. operands on two devices)
    devices: int = 1  #: CUDA devices it needs
    #: whether torch.cuda.set_sync_debug_mode sees it on a GPU (None: same as ``bool(syncs)``)
    debug_mode_sees: Optional[bool] = None
    note: str = ""

    @property
    def name(self) -> str:
        return self.fn.__name__

    @property
    def expected_real(self) -> bool:
        """Whether a GPU's sync-debug mode is expected to report a sync."""
        return bool(self.syncs) if self.debug_mode_sees is None else self.debug_mode_sees


READ, H2D, D2H, DDS = K.D2H_READ, K.H2D_COPY, K.D2H_COPY, K.DATA_DEPENDENT_SHAPE

#: a CUDA build of torch before 2.5 makes a Python list index on the device itself (2.1.2 without a
#: GPU: "Found no NVIDIA driver"), which stops a simulation there (README, limits): no such probe
LIST_INDEX_SIMULATED = torch.version.cuda is None or torch_at_least("2.5")

PROBES: Tuple[Probe, ...] = (
    Probe(F.item, (READ,)),
    Probe(F.if_any, (READ,)),
    Probe(F.float_of, (READ,)),
    Probe(F.tensor_to, (H2D,)),
    Probe(F.as_tensor_on_device, (H2D,)),
    Probe(F.tensor_of_list_on_device, (H2D,)),
    Probe(F.cuda_method, (H2D,)),
    Probe(F.copy_from_host, (H2D,)),
    Probe(F.cpu, (D2H,)),
    Probe(F.to_cpu, (D2H,)),
    Probe(F.tolist, (D2H,)),
    Probe(F.bool_index, (DDS,)),
    Probe(F.nonzero, (DDS,)),
    Probe(F.where_one_arg, (DDS,)),
    Probe(F.bincount, (DDS,)),
    Probe(F.unique, (DDS,)),
    Probe(F.masked_select, (DDS,)),
    Probe(F.repeat_interleave, (DDS,)),
    Probe(F.mask_assign_tensor, (DDS,)),
    Probe(F.linalg_solve, (K.LINALG_CHECK,), make=F.spd_system),
    Probe(F.linalg_inv, (K.LINALG_CHECK,), make=F.spd_system),
    Probe(F.linalg_cholesky, (K.LINALG_CHECK,), make=F.spd_system),
    Probe(F.linalg_svd, (K.LINALG_CHECK,), make=F.spd_system),
    Probe(F.linalg_eigh, (K.LINALG_CHECK,), make=F.spd_system),
    Probe(F.linalg_eigvals, (K.LINALG_CHECK,), make=F.spd_system),
    *((Probe(F.list_index, (H2D,)),) if LIST_INDEX_SIMULATED else ()),
    Probe(F.cpu_index_get, (K.CPU_INDEX,)),
    Probe(F.cpu_arange_index, (K.CPU_INDEX,), make=lambda: (F.vector(), torch.tensor([0, 2]))),
    Probe(F.cpu_mask_index, (K.CPU_INDEX,), debug_mode_sees=False,
          note="not flagged on an H200 with torch 2.11 (the mask's indices may reach the device without a wait); "
               "the simulation keeps the copy, a possible false positive there"),
    Probe(F.cpu_index_put, (K.CPU_INDEX,)),
    Probe(F.cpu_value_index_put, (K.CPU_VALUE,), make=lambda: (F.vector(), torch.tensor([0, 2]))),
    Probe(F.masked_fill_cuda_value, (READ,)),
    Probe(F.histc_no_range, (READ,)),
    Probe(F.multinomial_no_replacement, (READ,) if MULTINOMIAL_READS else ()),
    Probe(F.print_tensor, (K.FORMAT,)),
    Probe(F.str_tensor, (K.FORMAT,)),
    Probe(F.fstring_tensor, (K.FORMAT,)),
    Probe(F.fstring_spec, (K.FORMAT,)),
    Probe(F.synchronize, (K.SYNCHRONIZE,), debug_mode_sees=False,
          note="torch's sync-debug mode flags syncs inside operations, not torch.cuda.synchronize() itself"),
    Probe(F.stream_synchronize, (K.SYNCHRONIZE,)),
    Probe(F.tensor_of_cuda_values, (READ, READ)),
    Probe(F.where_scalar),
    Probe(F.full_on_device),
    Probe(F.cpu_scalar_operand),
    Probe(F.masked_fill_python_value),
    Probe(F.mask_assign_scalar),
    Probe(F.mask_assign_cpu_0d),
    Probe(F.cuda_index),
    Probe(F.repeat_interleave_sized),
    Probe(F.linalg_solve_ex, make=F.spd_system),
    Probe(F.histc_with_range),
    Probe(F.multinomial_with_replacement),
    Probe(F.host_only),
    Probe(F.nonblocking_to_cpu, others=(K.PINNED_COPY,)),
    Probe(F.nonblocking_into_pinned, others=(K.PINNED_COPY,)),
    Probe(F.nonblocking_from_pinned, others=(K.PINNED_COPY,)),
    Probe(F.nonblocking_into_pageable, (D2H,), debug_mode_sees=False,
          note="the host waits for the copy, but torch's sync-debug mode does not flag it"),
    Probe(F.to_other_device, others=(K.DEVICE_MISMATCH, K.DEVICE_MISMATCH), devices=2,
          note="a copy between GPUs, and a result on another device than the inputs"),
    Probe(F.operands_on_two_devices, others=(K.DEVICE_MISMATCH, K.DEVICE_MISMATCH), make=F.vectors, raises=RuntimeError,
          devices=2, note="an error on a GPU, not a sync"),
)

PROBE_NAMES: Tuple[str, ...] = tuple(p.name for p in PROBES)


def find_probe(name: str) -> Probe:
    """The probe called ``name``; ``KeyError`` if none."""
    for probe in PROBES:
        if probe.name == name:
            return probe
    raise KeyError(name)
