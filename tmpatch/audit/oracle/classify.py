"""Which ATen ops synchronise a CUDA device, and how (the oracle's table).

Only ops with a CUDA tensor among their arguments are considered. Op -> kind:

* ``aten._local_scalar_dense`` (``.item()``, ``bool(t)``, ``if t:``, ``float(t)``),
  ``aten.equal``, ``aten.allclose`` (a Python bool of device values) -> device-to-host
  read; also ``masked_fill`` with a 0-d CUDA value (the kernel reads it with
  ``.item()``), ``histc`` with ``min == max`` (reads the input's range),
  ``multinomial`` without replacement or with one sample (checks the probabilities;
  before torch 2.6 only: later releases check them with an asynchronous device assert,
  pytorch/pytorch#134818, and a GPU showed no sync with torch 2.11);
* ``aten._to_copy`` / ``aten.copy_`` / ``prims.device_put`` CPU -> CUDA -> host-to-device
  copy, CUDA -> CPU -> device-to-host copy (``.cpu()``, ``.to("cpu")``); a copy with
  ``non_blocking=True`` from or into pinned memory is not a sync (reported apart);
* ``aten.nonzero``, ``aten.masked_select``, ``unique`` and friends, ``aten.bincount`` (CUDA
  bincount reads min and max), ``aten.repeat_interleave.Tensor`` without ``output_size``,
  ``aten.index.Tensor`` with a CUDA boolean mask, ``index_put_`` with a boolean mask unless
  ATen turns it into ``masked_fill_`` (one same-device mask, a one-element CPU value) ->
  data-dependent shape;
* a CPU tensor among the indices of ``aten.index``/``index_put_`` of a CUDA tensor (one per
  index tensor; a CPU mask counts one per dimension) -> implicit host-to-device copy (CPU
  index); a 0-d CPU value of ``index_put_`` -> implicit host-to-device copy (CPU value);
* ``aten.lift_fresh`` of a real (not simulated) CUDA tensor while simulating -> host-to-device
  copy: ``torch.tensor(data, device="cuda")`` and a Python list index (``x[:, [0, 2]]``) make
  their tensor from host data; without a GPU the copy is a ``_to_copy`` seen here, with one
  torch makes it on the device out of the dispatcher's sight and lifts the result;
* ``aten._linalg_check_errors`` on a CUDA ``info``, the linalg kernels that check their own
  ``info`` (``_linalg_svd``, ``_linalg_eigh``, ``linalg_lstsq``, legacy ``cholesky``, the
  ``*_ex`` ops with ``check_errors=True``), ``linalg_eig``/``_linalg_eigvals`` (computed on
  the host on CUDA) -> linalg error check.

Not syncs: CPU 0-d tensors as operands (passed to kernels as scalars), factories with
``device="cuda"`` such as ``torch.full``, ``ones_like``, ``where(c, a, b)``, ``masked_fill``
with a Python or CPU value, the ``*_ex`` linalg ops without ``check_errors``.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_flatten

from tmpatch.audit.oracle.report import SyncKind
from tmpatch.audit.support import torch_at_least

aten = torch.ops.aten
Found = Tuple[SyncKind, str]

PINNED = "_tmpatch_audit_pinned"  #: set on simulated tensors made with pin_memory=True


def _ops(*names: str) -> frozenset:
    """The op packets of these names that this torch has."""
    return frozenset(getattr(aten, name) for name in names if hasattr(aten, name))


_READS = _ops("_local_scalar_dense", "equal", "allclose")
_COPIES = set(_ops("_to_copy", "copy_", "copy"))
_INDEX_PUTS = _ops("index_put_", "index_put", "_index_put_impl_")
_UNIQUES = _ops("_unique", "_unique2", "unique_dim", "unique_consecutive", "unique_dim_consecutive")
_DEVICE_PUT = getattr(getattr(torch.ops, "prims", None), "device_put", None)
if _DEVICE_PUT is not None:
    _COPIES.add(_DEVICE_PUT)
_MASKED_FILLS = _ops("masked_fill", "masked_fill_")
_LIFTS = _ops("lift_fresh", "lift_fresh_copy")

#: whether CUDA ``multinomial`` reads its probabilities' check back to the host (before torch 2.6)
MULTINOMIAL_READS = not torch_at_least("2.6")

#: linalg kernels that read their ``info`` back on CUDA whatever the arguments
_LINALG_ALWAYS = {
    **{op: "reads its convergence info" for op in _ops("_linalg_svd", "_linalg_eigh", "linalg_lstsq",
                                                        "cholesky", "linalg_pinv")},
    **{op: "CUDA eig runs on the host (input copied back)" for op in _ops("linalg_eig", "_linalg_eigvals")},
}
#: linalg kernels that read their ``info`` back when called with ``check_errors=True``
_LINALG_CHECKED = _ops("linalg_inv_ex", "linalg_cholesky_ex", "linalg_lu_factor_ex", "linalg_ldl_factor_ex",
                       "_linalg_solve_ex", "linalg_solve_ex")
_CHECK_ERRORS = _ops("_linalg_check_errors")


def is_cuda(value: Any) -> bool:
    """Whether ``value`` is a CUDA tensor (real or simulated)."""
    return isinstance(value, torch.Tensor) and value.device.type == "cuda"


def tensors(value: Any) -> List[torch.Tensor]:
    """The tensors among the leaves of ``value`` (lists, tuples, dicts walked)."""
    return [leaf for leaf in tree_flatten(value)[0] if isinstance(leaf, torch.Tensor)]


def is_mask(index: Any) -> bool:
    """Whether an index is a boolean (or uint8) mask."""
    return isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8)


def is_pinned(t: torch.Tensor) -> bool:
    """Whether a CPU tensor is in pinned memory (a simulated tensor: tagged when made so)."""
    if getattr(t, PINNED, False):
        return True
    if t.device.type != "cpu" or type(t) is not torch.Tensor:
        return False
    try:
        with _disable_current_modes():  # ask the tensor itself, not a fake mode
            return bool(t.is_pinned())
    except Exception:  # noqa: BLE001 - no CUDA to ask: not pinned
        return False


def _copy_kind(func: Any, args: Sequence[Any], kwargs: Dict[str, Any]) -> Optional[Found]:
    dst: Optional[torch.Tensor] = None
    if func.overloadpacket in (aten.copy_, aten.copy):
        dst, src = args[0], args[1]
        dst_dev = dst.device if isinstance(dst, torch.Tensor) else None
        non_blocking = bool(args[2] if len(args) > 2 else kwargs.get("non_blocking", False))
    else:
        src = args[0]
        dst_dev = kwargs.get("device", args[1] if len(args) > 1 and func.overloadpacket is _DEVICE_PUT else None)
        dst_dev = torch.device(dst_dev) if dst_dev is not None else getattr(src, "device", None)
        non_blocking = bool(kwargs.get("non_blocking", False))
    if not isinstance(src, torch.Tensor) or dst_dev is None:
        return None
    shape = f"{tuple(src.shape)} {src.dtype}"
    if src.device.type == "cpu" and dst_dev.type == "cuda":
        if non_blocking and is_pinned(src):
            return SyncKind.PINNED_COPY, f"non_blocking, {shape} pinned cpu -> {dst_dev}"
        how = "non_blocking from pageable memory" if non_blocking else "blocking"
        return SyncKind.H2D_COPY, f"{how}, {shape} cpu -> {dst_dev}"
    if src.device.type == "cuda" and dst_dev.type == "cpu":
        # _to_copy(non_blocking=True) to the CPU allocates its output pinned; copy_ needs a pinned dst
        if non_blocking and (dst is None or is_pinned(dst)):
            return SyncKind.PINNED_COPY, f"non_blocking, {shape} {src.device} -> pinned cpu"
        how = "non_blocking into pageable memory" if non_blocking else "blocking"
        return SyncKind.D2H_COPY, f"{how}, {shape} {src.device} -> cpu"
    return None


def masked_fill_dispatch(self: torch.Tensor, indices: Sequence[Any], value: Any) -> bool:
    """Whether ATen's ``index_put_`` turns into ``masked_fill_`` (no sync) for these arguments."""
    if not isinstance(value, torch.Tensor) or value.numel() != 1 or value.device.type != "cpu":
        return False
    masks = [i for i in indices if i is not None]
    return len(masks) == 1 and is_mask(masks[0]) and masks[0].device == self.device


def _cpu_indices(indices: Sequence[Any]) -> int:
    """Host-to-device copies ATen makes to bring CPU index tensors to the device."""
    return sum(max(1, i.dim()) if is_mask(i) else 1 for i in indices
               if isinstance(i, torch.Tensor) and i.device.type == "cpu")


def _indexing(func: Any, args: Sequence[Any]) -> List[Found]:
    self, indices = args[0], list(args[1])
    found: List[Found] = []
    if not is_cuda(self):
        return found
    if func.overloadpacket is aten.index:
        found += [(SyncKind.CPU_INDEX, "CPU index tensor copied to the device")] * _cpu_indices(indices)
        if any(is_mask(i) and is_cuda(i) for i in indices):
            found.append((SyncKind.DATA_DEPENDENT_SHAPE, "boolean-mask indexing"))
        return found
    value = args[2]
    if masked_fill_dispatch(self, indices, value):
        return found
    found += [(SyncKind.CPU_INDEX, "CPU index tensor copied to the device")] * _cpu_indices(indices)
    if isinstance(value, torch.Tensor) and value.device.type == "cpu" and value.dim() == 0:
        found.append((SyncKind.CPU_VALUE, "0-d CPU value copied to the device"))
    if any(is_mask(i) and is_cuda(i) for i in indices):
        found.append((SyncKind.DATA_DEPENDENT_SHAPE, "boolean-mask assignment of a tensor (index_put_ with a mask)"))
    return found


def _arg(args: Sequence[Any], kwargs: Dict[str, Any], i: int, name: str, default: Any) -> Any:
    return args[i] if len(args) > i else kwargs.get(name, default)


def _value_reads(func: Any, args: Sequence[Any], kwargs: Dict[str, Any]) -> Optional[Found]:
    packet = func.overloadpacket
    if packet in _MASKED_FILLS and is_cuda(_arg(args, kwargs, 2, "value", None)):
        return SyncKind.D2H_READ, "masked_fill reads its 0-d CUDA value (.item())"
    if packet is aten.histc and _arg(args, kwargs, 2, "min", 0) == _arg(args, kwargs, 3, "max", 0):
        return SyncKind.D2H_READ, "histc with min == max reads the input's min and max"
    if packet is aten.multinomial and MULTINOMIAL_READS:
        samples, replacement = _arg(args, kwargs, 1, "num_samples", 1), _arg(args, kwargs, 2, "replacement", False)
        if not replacement or samples == 1:
            return SyncKind.D2H_READ, "multinomial checks its probabilities (.item())"
    return None


def _linalg(func: Any, args: Sequence[Any], kwargs: Dict[str, Any]) -> Optional[Found]:
    packet = func.overloadpacket
    if packet in _CHECK_ERRORS:
        return SyncKind.LINALG_CHECK, f"{_arg(args, kwargs, 1, 'api_name', 'linalg')}: reads info"
    if packet in _LINALG_ALWAYS:
        return SyncKind.LINALG_CHECK, _LINALG_ALWAYS[packet]
    if packet in _LINALG_CHECKED and kwargs.get("check_errors", False):
        return SyncKind.LINALG_CHECK, "check_errors=True: reads info"
    return None


def classify_all(func: Any, args: Sequence[Any], kwargs: Dict[str, Any]) -> List[Found]:
    """Every ``(kind, detail)`` that running ``func`` on these arguments causes on a CUDA device
    (syncs and non-syncs; empty if none)."""
    packet = func.overloadpacket
    if packet in _READS:
        return [(SyncKind.D2H_READ, "value read by the host")] if any(is_cuda(a) for a in args) else []
    if packet in _COPIES:
        found = _copy_kind(func, args, kwargs)
        return [found] if found else []
    if not any(is_cuda(t) for t in tensors((args, kwargs))):
        return []
    if packet in _LIFTS:
        made_on_gpu = bool(args) and is_cuda(args[0]) and not isinstance(args[0], FakeTensor)
        return [(SyncKind.H2D_COPY, "tensor made from host data on the GPU (torch.tensor, a list index)")] \
            if made_on_gpu else []
    if packet in (aten.index,) or packet in _INDEX_PUTS:
        return _indexing(func, args)
    if packet in (aten.nonzero, aten.masked_select) or packet in _UNIQUES:
        return [(SyncKind.DATA_DEPENDENT_SHAPE, "output size depends on values")]
    if packet is aten.bincount:
        return [(SyncKind.DATA_DEPENDENT_SHAPE, "CUDA bincount reads min and max to size its output")]
    if packet is aten.repeat_interleave and func is aten.repeat_interleave.Tensor:
        if _arg(args, kwargs, 1, "output_size", None) is None:
            return [(SyncKind.DATA_DEPENDENT_SHAPE, "repeat_interleave without output_size")]
        return []
    found = _value_reads(func, args, kwargs) or _linalg(func, args, kwargs)
    return [found] if found else []


def classify(func: Any, args: Sequence[Any], kwargs: Dict[str, Any]) -> Optional[Found]:
    """The first ``(kind, detail)`` of :func:`classify_all`, or None."""
    found = classify_all(func, args, kwargs)
    return found[0] if found else None
