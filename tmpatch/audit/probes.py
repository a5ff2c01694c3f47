"""The probe table: one small function per event the audit knows, with its expected verdict.

Each :class:`Probe` is a function of CUDA tensors (its inputs are built on the CPU by
``make`` and moved by :func:`tmpatch.audit.audit`), the sync kinds the simulated audit
must report (in order, each at a line of the function), the non-syncs, and whether it
raises on a GPU as well. The test suite runs every probe on every torch of the matrix;
:mod:`tmpatch.audit.calibrate` runs them on a real GPU and compares.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional, Tuple

import torch

from tmpatch.audit.report import SyncKind as K


@dataclass(frozen=True)
class Probe:
    """One event: ``fn(*make())`` on CUDA reports ``syncs`` then ``others`` (non-syncs)."""

    fn: Callable[..., Any]
    syncs: Tuple[K, ...] = ()
    others: Tuple[K, ...] = ()
    make: Callable[[], tuple] = lambda: (_x(),)
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


def _x(n: int = 6) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(0))


def _spd() -> Tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    m = torch.randn(3, 3, generator=g)
    return m @ m.T + 3 * torch.eye(3), torch.randn(3, generator=g)


# --- value reads, copies, data-dependent shapes ------------------------------------------------

def item(x):
    return x.sum().item()


def if_any(x):
    if x.any():
        return x
    return -x


def float_of(x):
    return float(x.sum())


def tensor_to(x):
    return x + torch.tensor(1.0).to(x.device)


def as_tensor_on_device(x):
    return x * torch.as_tensor(1.0, device=x.device)


def tensor_of_list_on_device(x):
    return torch.tensor([1.0, 2.0], device=x.device)


def cuda_method(x):
    return x + torch.ones(6).cuda()


def copy_from_host(x):
    return x.copy_(torch.ones(x.shape))


def cpu(x):
    return x.cpu()


def to_cpu(x):
    return x.to("cpu")


def tolist(x):
    return x.tolist()


def bool_index(x):
    return x[x > 0]


def nonzero(x):
    return torch.nonzero(x)


def where_one_arg(x):
    return torch.where(x > 0)


def bincount(x):
    return torch.bincount(x.abs().long(), minlength=4)


def unique(x):
    return torch.unique(x)


def masked_select(x):
    return x.masked_select(x > 0)


def repeat_interleave(x):
    return torch.repeat_interleave(x, torch.ones(x.shape[0], dtype=torch.long, device=x.device))


def mask_assign_tensor(x):
    x[x > 0] = x.sum()
    return x


# --- the events of issue 17 ----------------------------------------------------------------

def linalg_solve(a, b):
    return torch.linalg.solve(a, b)


def linalg_inv(a, b):
    return torch.linalg.inv(a)


def linalg_cholesky(a, b):
    return torch.linalg.cholesky(a)


def linalg_svd(a, b):
    return torch.linalg.svd(a)


def linalg_eigh(a, b):
    return torch.linalg.eigh(a)


def linalg_eigvals(a, b):
    return torch.linalg.eigvals(a)


def cpu_index_get(x):
    return x[torch.tensor([0, 2])]


def cpu_arange_index(x, t):
    return x.view(2, 3)[torch.arange(2), t]


def cpu_mask_index(x):
    return x[torch.tensor([True, False, True, False, True, False])]


def cpu_index_put(x):
    x[torch.tensor([0, 2])] = x[:2]
    return x


def cpu_value_index_put(x, i):
    return x.index_put_((i,), torch.tensor(1.0))


def masked_fill_cuda_value(x):
    return x.masked_fill(x > 0, x.sum())


def histc_no_range(x):
    return torch.histc(x, bins=4)


def multinomial_no_replacement(x):
    return torch.multinomial(x.abs() + 0.1, 2)


def print_tensor(x):
    print(x)


def str_tensor(x):
    return str(x)


def fstring_tensor(x):
    return f"loss {x.sum()}"


def fstring_spec(x):
    return f"loss {x.sum():.3f}"


def synchronize(x):
    y = x * 2
    torch.cuda.synchronize()
    return y


def stream_synchronize(x):
    y = x * 2
    torch.cuda.current_stream().synchronize()
    return y


def tensor_of_cuda_values(x):
    return torch.tensor([x.sum(), x.max()])


# --- sync-free code --------------------------------------------------------------------------

def where_scalar(x):
    return torch.where(x > 0, x, 0.0)


def full_on_device(x):
    return x + torch.full((), 3.0, device=x.device)


def cpu_scalar_operand(x):
    return x * torch.tensor(2.0) + torch.tensor(1.0)


def masked_fill_python_value(x):
    return x.masked_fill(x > 0, 1.0)


def mask_assign_scalar(x):
    x[x > 0] = 1.0
    return x


def mask_assign_cpu_0d(x):
    x[torch.isnan(x)] = torch.tensor(0.0)
    return x


def cuda_index(x):
    return x[torch.arange(3, device=x.device)].sum() + x.view(2, 3)[1, 2]


def repeat_interleave_sized(x):
    return torch.repeat_interleave(x, torch.ones(6, dtype=torch.long, device=x.device), output_size=6)


def linalg_solve_ex(a, b):
    return torch.linalg.solve_ex(a, b)[0]


def histc_with_range(x):
    return torch.histc(x, bins=4, min=-3, max=3)


def multinomial_with_replacement(x):
    return torch.multinomial(x.abs() + 0.1, 4, replacement=True)


def host_only(x):
    t = torch.tensor([1.0, 2.0])
    return x.sum() + (t.sum().item() + float(t.max()))


# --- not syncs: reported apart ----------------------------------------------------------------

def nonblocking_to_cpu(x):
    return x.to("cpu", non_blocking=True)


def nonblocking_into_pinned(x):
    return torch.empty(6, pin_memory=True).copy_(x, non_blocking=True)


def nonblocking_from_pinned(x):
    return x + torch.ones(6).pin_memory().to(x.device, non_blocking=True)


def nonblocking_into_pageable(x):
    return torch.empty(6).copy_(x, non_blocking=True)


def to_other_device(x):
    return x.to("cuda:1") * 2


def operands_on_two_devices(x, y):
    return x + y.to("cuda:1")


def _two() -> tuple:
    return _x(), _x()


def _spd_pair() -> tuple:
    return _spd()


READ, H2D, D2H, DDS = K.D2H_READ, K.H2D_COPY, K.D2H_COPY, K.DATA_DEPENDENT_SHAPE

PROBES: Tuple[Probe, ...] = (
    Probe(item, (READ,)),
    Probe(if_any, (READ,)),
    Probe(float_of, (READ,)),
    Probe(tensor_to, (H2D,)),
    Probe(as_tensor_on_device, (H2D,)),
    Probe(tensor_of_list_on_device, (H2D,)),
    Probe(cuda_method, (H2D,)),
    Probe(copy_from_host, (H2D,)),
    Probe(cpu, (D2H,)),
    Probe(to_cpu, (D2H,)),
    Probe(tolist, (D2H,)),
    Probe(bool_index, (DDS,)),
    Probe(nonzero, (DDS,)),
    Probe(where_one_arg, (DDS,)),
    Probe(bincount, (DDS,)),
    Probe(unique, (DDS,)),
    Probe(masked_select, (DDS,)),
    Probe(repeat_interleave, (DDS,)),
    Probe(mask_assign_tensor, (DDS,)),
    Probe(linalg_solve, (K.LINALG_CHECK,), make=_spd_pair),
    Probe(linalg_inv, (K.LINALG_CHECK,), make=_spd_pair),
    Probe(linalg_cholesky, (K.LINALG_CHECK,), make=_spd_pair),
    Probe(linalg_svd, (K.LINALG_CHECK,), make=_spd_pair),
    Probe(linalg_eigh, (K.LINALG_CHECK,), make=_spd_pair),
    Probe(linalg_eigvals, (K.LINALG_CHECK,), make=_spd_pair),
    Probe(cpu_index_get, (K.CPU_INDEX,)),
    Probe(cpu_arange_index, (K.CPU_INDEX,), make=lambda: (_x(), torch.tensor([0, 2]))),
    Probe(cpu_mask_index, (K.CPU_INDEX,)),
    Probe(cpu_index_put, (K.CPU_INDEX,)),
    Probe(cpu_value_index_put, (K.CPU_VALUE,), make=lambda: (_x(), torch.tensor([0, 2]))),
    Probe(masked_fill_cuda_value, (READ,)),
    Probe(histc_no_range, (READ,)),
    Probe(multinomial_no_replacement, (READ,)),
    Probe(print_tensor, (K.FORMAT,)),
    Probe(str_tensor, (K.FORMAT,)),
    Probe(fstring_tensor, (K.FORMAT,)),
    Probe(fstring_spec, (K.FORMAT,)),
    Probe(synchronize, (K.SYNCHRONIZE,)),
    Probe(stream_synchronize, (K.SYNCHRONIZE,)),
    Probe(tensor_of_cuda_values, (READ, READ)),
    Probe(where_scalar),
    Probe(full_on_device),
    Probe(cpu_scalar_operand),
    Probe(masked_fill_python_value),
    Probe(mask_assign_scalar),
    Probe(mask_assign_cpu_0d),
    Probe(cuda_index),
    Probe(repeat_interleave_sized),
    Probe(linalg_solve_ex, make=_spd_pair),
    Probe(histc_with_range),
    Probe(multinomial_with_replacement),
    Probe(host_only),
    Probe(nonblocking_to_cpu, others=(K.PINNED_COPY,)),
    Probe(nonblocking_into_pinned, others=(K.PINNED_COPY,)),
    Probe(nonblocking_from_pinned, others=(K.PINNED_COPY,)),
    Probe(nonblocking_into_pageable, (D2H,), debug_mode_sees=False,
          note="the host waits for the copy, but torch's sync-debug mode does not flag it"),
    Probe(to_other_device, others=(K.DEVICE_MISMATCH, K.DEVICE_MISMATCH), devices=2,
          note="a copy between GPUs, and a result on another device than the inputs"),
    Probe(operands_on_two_devices, others=(K.DEVICE_MISMATCH, K.DEVICE_MISMATCH), make=_two, raises=RuntimeError,
          devices=2, note="an error on a GPU, not a sync"),
)

PROBE_NAMES: Tuple[str, ...] = tuple(p.name for p in PROBES)


def find_probe(name: str) -> Probe:
    """The probe called ``name``; ``KeyError`` if none."""
    for probe in PROBES:
        if probe.name == name:
            return probe
    raise KeyError(name)
