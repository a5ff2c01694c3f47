"""The probe functions: one small function of CUDA tensors per event the audit knows.

The table of their verdicts is :mod:`tmpatch.audit.calibrate.probes`. These functions are code
under audit: sync points are located in them (:mod:`tmpatch.audit.oracle.locate`).
"""
from __future__ import annotations

from typing import Tuple

import torch

# --- inputs (built on the CPU; the audit moves them to the device) -----------------------------

def vector(n: int = 6) -> torch.Tensor:
    """Six seeded values."""
    return torch.randn(n, generator=torch.Generator().manual_seed(0))


def vectors() -> Tuple[torch.Tensor, torch.Tensor]:
    """Two of them."""
    return vector(), vector()


def spd_system() -> Tuple[torch.Tensor, torch.Tensor]:
    """A well-conditioned symmetric positive definite 3x3 matrix and a right-hand side (every
    linalg probe succeeds on a GPU)."""
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


def list_index(x):
    return x[[0, 2]]


def cpu_index_get(x):
    return x[torch.tensor([0, 2])]


def cpu_arange_index(x, t):
    return x.view(2, 3)[torch.arange(2), t]


def cpu_mask_index(x):
    return x[torch.tensor([True, False, True, False, True, False])]


def cpu_index_put(x):
    x[torch.tensor([0, 2])] = x[:2] + 1  # a new value: writing x[:2] into x itself is refused on a GPU
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
    """``print(x)`` in user code: the line print would write (the tensor formatted by ``str``),
    returned instead of written to the process's stdout."""
    return str(x) + "\n"


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

