"""How a simulated run goes on past a sync: answers for value reads, sizes for data-dependent ops.

Fake tensors have no values, so the audit picks plausible ones. A scalar read (``.item()``,
``bool(t)``, ``if t:``) is answered by :class:`Answers`: by default ``True`` for the result
of ``all()`` and ``False`` for other booleans (every check passes: "no NaN", "all in range"),
``1``/``1.0`` for numbers (no division by zero), ``0`` for the count of a tmpatch deferred
record (a tensor carrying ``tmpatch.runtime.deferred.AUDIT_TAG``: nothing to report), ``True`` for
``equal`` and ``allclose``. Each read is logged with the other answers that would take the other branch
(booleans: the opposite; numbers: 0; a deferred record: 1), which is what
:func:`tmpatch.audit.oracle.branches.audit_branches` explores; ``audit(..., answers=[...])`` gives
the answers of the first reads explicitly.

A data-dependent dimension is the largest it can be (``nonzero``/``masked_select``/boolean
index: every element kept; ``unique``: every element, or as many as the values' known range
holds, see :mod:`tmpatch.audit.oracle.bounds`; ``repeat_interleave``: one repeat each); ``bincount``
has ``minlength`` bins, or one per input element when ``minlength`` is 0.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_map

from tmpatch.audit.oracle.bounds import distinct
from tmpatch.audit.oracle.classify import is_mask
from tmpatch.audit.oracle.locate import locate
from tmpatch.audit.oracle.report import Read
from tmpatch.runtime.deferred import AUDIT_TAG

aten = torch.ops.aten

_FROM_ALL = "_tmpatch_audit_from_all"


def tag_all(out: Any) -> None:
    """Mark the output of an ``all()`` so that a read of it answers True."""
    if isinstance(out, torch.Tensor):
        setattr(out, _FROM_ALL, True)


def from_all(t: torch.Tensor) -> bool:
    """Whether ``t`` is the output of an ``all()`` (tagged by the recorder)."""
    return bool(getattr(t, _FROM_ALL, False))


def plausible_scalar(t: torch.Tensor, from_all: bool) -> Any:
    """The default answer of a simulated scalar read (see the module docstring)."""
    if getattr(t, AUDIT_TAG, False):
        return 0  # a tmpatch deferred record: nothing to report
    if t.dtype is torch.bool:
        return bool(from_all)
    if t.dtype.is_complex:
        return complex(1.0)
    if t.dtype.is_floating_point:
        return 1.0
    return 1


def alternatives(t: Optional[torch.Tensor], default: Any) -> Tuple[Any, ...]:
    """The answers, other than ``default``, that may take another branch."""
    if isinstance(default, bool):
        return (not default,)
    if t is not None and getattr(t, AUDIT_TAG, False):
        return (1,)
    if isinstance(default, complex):
        return ()
    return (type(default)(0),)


class Answers:
    """The answers of one simulated run's value reads: ``script`` first (``None`` entries:
    the default), then the defaults; every read is logged in :attr:`reads`."""

    def __init__(self, script: Optional[Sequence[Any]] = None) -> None:
        self.script = list(script or ())
        self.reads: List[Read] = []

    def answer(self, op: str, t: Optional[torch.Tensor], default: Any) -> Any:
        """The value read ``len(reads)`` returns; logged with its alternatives."""
        index = len(self.reads)
        given = self.script[index] if index < len(self.script) else None
        value = default if given is None else given
        location, function = locate(1)
        self.reads.append(Read(index, op, location, function, value, default, alternatives(t, default)))
        return value

    def scalar(self, t: torch.Tensor) -> Any:
        """Answer ``t.item()``."""
        return self.answer("aten._local_scalar_dense", t, plausible_scalar(t, from_all(t)))

    def equal(self, op: str = "aten.equal") -> bool:
        """Answer ``torch.equal`` (or ``op``, another comparison of two tensors: ``aten.allclose``)."""
        return bool(self.answer(op, None, True))


# --- plausible outputs for ops the fake mode cannot size -------------------------------------

def _empty(shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.empty(tuple(shape), dtype=dtype, device=device)


def _unique_out(x: torch.Tensor, dim: Optional[int], inverse: bool, counts: bool) -> Tuple[torch.Tensor, ...]:
    long = torch.long
    if dim is None:
        most = distinct(x)
        n = x.numel() if most is None else min(x.numel(), most)
        return (_empty((n,), x.dtype, x.device), _empty(x.shape if inverse else (0,), long, x.device),
                _empty((n,) if counts else (0,), long, x.device))
    size = x.shape[dim]
    return (_empty(x.shape, x.dtype, x.device), _empty((size,) if inverse else (0,), long, x.device),
            _empty((size,) if counts else (0,), long, x.device))


def _arg(args: Sequence[Any], kwargs: Dict[str, Any], i: int, name: str, default: Any) -> Any:
    return args[i] if len(args) > i else kwargs.get(name, default)


def _lstsq(a: torch.Tensor, b: torch.Tensor) -> Tuple[torch.Tensor, ...]:
    """linalg_lstsq on CUDA (driver gels): the solution; residuals, rank and singular values empty."""
    vector = b.dim() == 1
    b2 = b.unsqueeze(-1) if vector else b
    batch = torch.broadcast_shapes(a.shape[:-2], b2.shape[:-2])
    solution = _empty((*batch, a.shape[-1], b2.shape[-1]), a.dtype, a.device)
    none = _empty((0,), a.dtype, a.device)
    return (solution.squeeze(-1) if vector else solution, none, _empty((0,), torch.long, a.device), none)


def synthesize(func: Any, args: Sequence[Any], kwargs: Dict[str, Any]) -> Any:
    """A fake output of plausible shape for a data-dependent op; NotImplemented if unknown."""
    packet = func.overloadpacket
    x: Any = args[0] if args else None  # the ops below all take a tensor first
    if packet is aten.nonzero:
        return _empty((x.numel(), x.dim()), torch.long, x.device)
    if packet is aten.masked_select:
        n = torch.broadcast_shapes(x.shape, args[1].shape).numel()
        return _empty((n,), x.dtype, x.device)
    if packet is aten.bincount:
        weights, minlength = _arg(args, kwargs, 1, "weights", None), _arg(args, kwargs, 2, "minlength", 0)
        dtype = torch.long if weights is None else (
            weights.dtype if weights.dtype.is_floating_point else torch.double)
        return _empty((minlength if minlength > 0 else x.numel(),), dtype, x.device)
    if packet is aten.repeat_interleave and func is aten.repeat_interleave.Tensor:
        return _empty((x.numel(),), x.dtype, x.device)
    if packet is aten._unique:
        return _unique_out(x, None, _arg(args, kwargs, 2, "return_inverse", False), False)[:2]
    if packet is aten._unique2:
        return _unique_out(x, None, _arg(args, kwargs, 2, "return_inverse", False),
                           _arg(args, kwargs, 3, "return_counts", False))
    if packet is aten.unique_consecutive:
        return _unique_out(x, _arg(args, kwargs, 3, "dim", None), _arg(args, kwargs, 1, "return_inverse", False),
                           _arg(args, kwargs, 2, "return_counts", False))
    if packet in (aten.unique_dim, aten.unique_dim_consecutive):
        off = 1 if packet is aten.unique_dim else 0  # unique_dim has `sorted` before the flags
        return _unique_out(x, args[1], _arg(args, kwargs, 2 + off, "return_inverse", False),
                           _arg(args, kwargs, 3 + off, "return_counts", False))
    if packet is aten.index:
        return func(x, masks_as_indices(args[1]), *args[2:], **kwargs)
    if packet in (aten.index_put_, aten.index_put, aten._index_put_impl_):
        return func(x, masks_as_indices(args[1]), *args[2:], **kwargs)
    if packet is getattr(aten, "linalg_lstsq", None):
        return _lstsq(x, args[1])
    return NotImplemented


def shaped_on_host(func: Any, args: Sequence[Any], kwargs: Dict[str, Any]) -> Any:
    """Outputs of an op the fake mode has no kernel for (older torch: ``histc``, ``linalg_eig``):
    the op runs on zero-filled CPU tensors of the same shapes and its outputs become simulated
    tensors on the device of its first CUDA input. NotImplemented when that fails."""
    flat = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
    device = next((t.device for t in flat if t.device.type == "cuda"), None)
    if device is None:
        return NotImplemented

    def host(value: Any) -> Any:
        if isinstance(value, FakeTensor):
            return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype).zero_()
        if isinstance(value, torch.Tensor):
            return value.detach().cpu()
        if isinstance(value, torch.device) or (isinstance(value, str) and value.startswith("cuda")):
            return torch.device("cpu")
        return value

    try:
        with _disable_current_modes():
            host_args, host_kwargs = tree_map(host, tuple(args)), tree_map(host, dict(kwargs))
            out = func(*host_args, **host_kwargs)
    except Exception:  # noqa: BLE001 - zeros are not always valid input: give up
        return NotImplemented
    first = args[0] if args else None

    def back(value: Any) -> Any:
        if not isinstance(value, torch.Tensor):
            return value
        if value is (host_args[0] if host_args else None):
            return first  # an in-place op returns its (simulated) input
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=device)

    return tree_map(back, out)


def masks_as_indices(indices: Sequence[Any]) -> List[Any]:
    """Replace every boolean mask by integer indices that keep all of its elements."""
    out: List[Any] = []
    for index in indices:
        if is_mask(index):
            out.extend(_empty((index.numel(),), torch.long, index.device).zero_() for _ in range(index.dim()))
        else:
            out.append(index)
    return out
