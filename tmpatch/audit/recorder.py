"""The oracle: a TorchDispatchMode that classifies every ATen op as a sync point or not.

Op -> kind (only when a CUDA tensor is involved):

* ``aten._local_scalar_dense`` (``.item()``, ``bool(t)``, ``if t:``, ``float(t)``),
  ``aten.equal`` -> device-to-host read;
* ``aten._to_copy`` / ``aten.copy_`` / ``prims.device_put`` CPU -> CUDA -> host-to-device copy,
  CUDA -> CPU -> device-to-host copy (``.cpu()``, ``.to("cpu")``; ``.tolist()`` is one copy);
* ``aten.nonzero``, ``aten.masked_select``, ``aten._unique``/``_unique2``/``unique_dim``/
  ``unique_consecutive``/``unique_dim_consecutive``, ``aten.bincount`` (CUDA bincount reads
  min and max), ``aten.repeat_interleave.Tensor`` without ``output_size``, ``aten.index.Tensor``
  with a boolean mask, ``aten.index_put_``/``index_put``/``_index_put_impl_`` with a boolean
  mask unless ATen turns it into ``masked_fill_`` (one same-device mask, a one-element CPU
  value) -> data-dependent shape;
* an op whose CUDA output is on a device none of its CUDA inputs is on -> device mismatch.

Not syncs: CPU 0-d tensors as operands (passed to kernels as scalars), factories with
``device="cuda"`` such as ``torch.full``, ``ones_like``, ``where(c, a, b)``, ``masked_fill``.

Continuation (the fake mode cannot know values, so the audit picks plausible ones and
goes on): a scalar read returns ``True`` for the result of ``all()`` and ``False`` for
other booleans (every check passes: "no NaN", "all in range"), ``1``/``1.0`` for
numbers (no division by zero), ``0`` for the count of a tmpatch deferred record (nothing
to report), ``True`` for ``equal``; a data-dependent dimension is the
largest it can be (``nonzero``/``masked_select``/boolean index/``unique``: every element
kept; ``repeat_interleave``: one repeat each); ``bincount`` has ``minlength`` bins, or one
per input element when ``minlength`` is 0.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException, FakeTensor
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves
from torch.utils._python_dispatch import TorchDispatchMode

from tmpatch.audit.locate import locate
from tmpatch.audit.report import SyncKind, SyncPoint
from tmpatch.deferred import AUDIT_TAG

log = logging.getLogger("tmpatch")
aten = torch.ops.aten

Sink = Callable[[SyncPoint], None]
_FAKE_ERRORS = (DataDependentOutputException, DynamicOutputShapeException)

_READS = {aten._local_scalar_dense, aten.equal}
_COPIES = {aten._to_copy, aten.copy_, aten.copy}
_INDEX_PUTS = {aten.index_put_, aten.index_put, aten._index_put_impl_}
_UNIQUES = {aten._unique, aten._unique2, aten.unique_dim, aten.unique_consecutive, aten.unique_dim_consecutive}
_DEVICE_PUT = getattr(getattr(torch.ops, "prims", None), "device_put", None)
if _DEVICE_PUT is not None:
    _COPIES.add(_DEVICE_PUT)


def op_name(func: Any) -> str:
    """``aten._to_copy`` style name of an OpOverload."""
    return str(getattr(func, "overloadpacket", func))


def _is_cuda(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type == "cuda"


def _tensors(value: Any) -> List[torch.Tensor]:
    return [leaf for leaf in tree_leaves(value) if isinstance(leaf, torch.Tensor)]


def _is_mask(index: Any) -> bool:
    return isinstance(index, torch.Tensor) and index.dtype in (torch.bool, torch.uint8)


def _copy_kind(func: Any, args: Sequence[Any], kwargs: Dict[str, Any]) -> Optional[Tuple[SyncKind, str]]:
    if func.overloadpacket in (aten.copy_, aten.copy):
        dst, src = args[0], args[1]
        dst_dev = dst.device if isinstance(dst, torch.Tensor) else None
    else:
        src = args[0]
        dst_dev = kwargs.get("device", args[1] if len(args) > 1 and func.overloadpacket is _DEVICE_PUT else None)
        dst_dev = torch.device(dst_dev) if dst_dev is not None else getattr(src, "device", None)
    if not isinstance(src, torch.Tensor) or dst_dev is None:
        return None
    blocking = "non_blocking" if kwargs.get("non_blocking") else "blocking"
    if src.device.type == "cpu" and dst_dev.type == "cuda":
        return SyncKind.H2D_COPY, f"{blocking}, {tuple(src.shape)} {src.dtype} cpu -> {dst_dev}"
    if src.device.type == "cuda" and dst_dev.type == "cpu":
        return SyncKind.D2H_COPY, f"{blocking}, {tuple(src.shape)} {src.dtype} {src.device} -> cpu"
    return None


def _masked_fill_dispatch(self: torch.Tensor, indices: Sequence[Any], value: Any) -> bool:
    """Whether ATen's ``index_put_`` turns into ``masked_fill_`` (no sync) for these arguments."""
    if not isinstance(value, torch.Tensor) or value.numel() != 1 or value.device.type != "cpu":
        return False
    masks = [i for i in indices if i is not None]
    return len(masks) == 1 and _is_mask(masks[0]) and masks[0].device == self.device


def classify(func: Any, args: Sequence[Any], kwargs: Dict[str, Any]) -> Optional[Tuple[SyncKind, str]]:
    """``(kind, detail)`` when running ``func`` on these arguments syncs a CUDA device, else None."""
    packet = func.overloadpacket
    if packet in _READS:
        if any(_is_cuda(a) for a in args):
            return SyncKind.D2H_READ, "value read by the host"
        return None
    if packet in _COPIES:
        return _copy_kind(func, args, kwargs)
    cuda = any(_is_cuda(t) for t in _tensors((args, kwargs)))
    if not cuda:
        return None
    if packet in (aten.nonzero, aten.masked_select) or packet in _UNIQUES:
        return SyncKind.DATA_DEPENDENT_SHAPE, "output size depends on values"
    if packet is aten.bincount:
        return SyncKind.DATA_DEPENDENT_SHAPE, "CUDA bincount reads min and max to size its output"
    if packet is aten.repeat_interleave and func is aten.repeat_interleave.Tensor:
        if kwargs.get("output_size", args[1] if len(args) > 1 else None) is None:
            return SyncKind.DATA_DEPENDENT_SHAPE, "repeat_interleave without output_size"
        return None
    if packet is aten.index and any(_is_mask(i) for i in args[1]):
        return SyncKind.DATA_DEPENDENT_SHAPE, "boolean-mask indexing"
    if packet in _INDEX_PUTS and any(_is_mask(i) for i in args[1]):
        if not _masked_fill_dispatch(args[0], args[1], args[2]):
            return SyncKind.DATA_DEPENDENT_SHAPE, "boolean-mask assignment of a tensor (index_put_ with a mask)"
    return None


# --- plausible outputs for ops the fake mode cannot size -------------------------------------

def _empty(shape: Sequence[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.empty(tuple(shape), dtype=dtype, device=device)


_FROM_ALL = "_tmpatch_audit_from_all"


def from_all(t: torch.Tensor) -> bool:
    """Whether ``t`` is the output of an ``all()`` (tagged by the recorder)."""
    return bool(getattr(t, _FROM_ALL, False))


def plausible_scalar(t: torch.Tensor, from_all: bool) -> Any:
    """The value a simulated scalar read returns (see the module docstring)."""
    if getattr(t, AUDIT_TAG, False):
        return 0  # a tmpatch deferred record: nothing to report
    if t.dtype is torch.bool:
        return bool(from_all)
    if t.dtype.is_complex:
        return complex(1.0)
    if t.dtype.is_floating_point:
        return 1.0
    return 1


def _unique_out(x: torch.Tensor, dim: Optional[int], inverse: bool, counts: bool) -> Tuple[torch.Tensor, ...]:
    long = torch.long
    if dim is None:
        n = x.numel()
        return (_empty((n,), x.dtype, x.device), _empty(x.shape if inverse else (0,), long, x.device),
                _empty((n,) if counts else (0,), long, x.device))
    size = x.shape[dim]
    return (_empty(x.shape, x.dtype, x.device), _empty((size,) if inverse else (0,), long, x.device),
            _empty((size,) if counts else (0,), long, x.device))


def _arg(args: Sequence[Any], kwargs: Dict[str, Any], i: int, name: str, default: Any) -> Any:
    return args[i] if len(args) > i else kwargs.get(name, default)


def synthesize(func: Any, args: Sequence[Any], kwargs: Dict[str, Any]) -> Any:
    """A fake output of plausible shape for a data-dependent op; NotImplemented if unknown."""
    packet, x = func.overloadpacket, args[0] if args else None
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
        return func(x, _masks_as_indices(args[1]), *args[2:], **kwargs)
    return NotImplemented


def _masks_as_indices(indices: Sequence[Any]) -> List[Any]:
    """Replace every boolean mask by integer indices that keep all of its elements."""
    out: List[Any] = []
    for index in indices:
        if _is_mask(index):
            out.extend(_empty((index.numel(),), torch.long, index.device).zero_() for _ in range(index.dim()))
        else:
            out.append(index)
    return out


# --- the modes ---------------------------------------------------------------------------------

class SyncRecorder(TorchDispatchMode):
    """Records sync points of the ops run under it; on fake tensors it also keeps the run going.

    Push it inside (after) a ``FakeTensorMode`` for simulation, or alone over real tensors
    (``simulate=False``), where it only names the op in flight (``current``) for the
    CUDA sync-debug warnings.
    """

    def __init__(self, sink: Sink, simulate: bool = True) -> None:
        super().__init__()
        self.sink = sink
        self.simulate = simulate
        self.current: Optional[Tuple[str, Optional[Tuple[SyncKind, str]]]] = None

    def record(self, kind: SyncKind, op: str, detail: str) -> None:
        """Locate and report one sync point."""
        location, function = locate(1)
        point = SyncPoint(kind, op, location, function, detail)
        log.debug("tmpatch.audit: %s", point)
        self.sink(point)

    def __torch_dispatch__(self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        found = classify(func, args, kwargs)
        if not self.simulate:
            self.current = (op_name(func), found)
            return func(*args, **kwargs)
        if found is not None:
            self.record(found[0], op_name(func), found[1])
        out = self._run(func, args, kwargs)
        if func.overloadpacket is aten.all:
            for t in _tensors(out):
                setattr(t, _FROM_ALL, True)
        self._check_devices(func, args, kwargs, out)
        return out

    def _run(self, func: Any, args: Sequence[Any], kwargs: Dict[str, Any]) -> Any:
        try:
            return func(*args, **kwargs)
        except _FAKE_ERRORS as exc:
            packet = func.overloadpacket
            if packet is aten._local_scalar_dense:
                return plausible_scalar(args[0], from_all(args[0]))
            if packet is aten.equal:
                return True
            out = synthesize(func, args, kwargs)
            if out is NotImplemented:
                if classify(func, args, kwargs) is None and any(_is_cuda(t) for t in _tensors(args)):
                    self.record(SyncKind.DATA_DEPENDENT_SHAPE, op_name(func), "unsupported; audit stopped")
                raise
            log.debug("tmpatch.audit: continued past %s (%s)", op_name(func), type(exc).__name__)
            return out

    def _check_devices(self, func: Any, args: Sequence[Any], kwargs: Dict[str, Any], out: Any) -> None:
        inputs = {t.device for t in _tensors((args, kwargs)) if t.device.type == "cuda"}
        if not inputs:
            return
        stray = sorted({str(t.device) for t in _tensors(out) if t.device.type == "cuda"} - {str(d) for d in inputs})
        if stray:
            self.record(SyncKind.DEVICE_MISMATCH, op_name(func),
                        f"output on {', '.join(stray)}; inputs on {', '.join(sorted(map(str, inputs)))}")


def _nested(shape: Sequence[int], value: Any) -> Any:
    if not shape:
        return value
    return [_nested(shape[1:], value) for _ in range(shape[0])]


class FakeHostViews(TorchFunctionMode):
    """Host views of fake tensors: ``tolist()`` as one copy with plausible values (FakeTensor's
    own ``tolist`` reads element by element), ``numpy()``, and ``new_tensor`` placed on the
    tensor's own device (the simulated guard cannot)."""

    _stack: List["FakeHostViews"] = []
    _saved_tolist: Any = None

    def __init__(self, recorder: SyncRecorder) -> None:
        super().__init__()
        self.recorder = recorder

    def __enter__(self) -> "FakeHostViews":
        if not FakeHostViews._stack:
            FakeHostViews._saved_tolist = FakeTensor.__dict__.get("tolist")
            FakeTensor.tolist = _fake_tolist  # type: ignore[method-assign]
        FakeHostViews._stack.append(self)
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        try:
            super().__exit__(*exc)
        finally:
            FakeHostViews._stack.remove(self)
            if not FakeHostViews._stack:
                if FakeHostViews._saved_tolist is None:
                    del FakeTensor.tolist
                else:
                    FakeTensor.tolist = FakeHostViews._saved_tolist  # type: ignore[method-assign]

    def __torch_function__(self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func is torch.Tensor.numpy:
            return self._numpy(args[0])
        if func is torch.Tensor.new_tensor:
            self_, data = args[0], args[1] if len(args) > 1 else kwargs.pop("data")
            kwargs.setdefault("dtype", self_.dtype)
            kwargs.setdefault("device", self_.device)
            return torch.tensor(data, **kwargs)
        return func(*args, **kwargs)

    def tolist(self, t: torch.Tensor) -> Any:
        """One device-to-host copy for a CUDA tensor, then a nested list of plausible values."""
        if t.device.type == "cuda":
            self.recorder.record(SyncKind.D2H_COPY, "aten._to_copy",
                                 f"Tensor.tolist, {tuple(t.shape)} {t.dtype} {t.device} -> host")
        return _nested(tuple(t.shape), plausible_scalar(t, from_all(t)))

    @staticmethod
    def _numpy(t: torch.Tensor) -> Any:
        if t.device.type != "cpu":
            raise TypeError(f"can't convert {t.device.type} device type tensor to numpy. "
                            "Use Tensor.cpu() to copy the tensor to host memory first.")
        import numpy

        return numpy.zeros(tuple(t.shape), dtype=_numpy_dtype(t.dtype))


def _fake_tolist(self: torch.Tensor) -> Any:
    return FakeHostViews._stack[-1].tolist(self)


def _numpy_dtype(dtype: torch.dtype) -> Any:
    import numpy

    names = {torch.bool: "bool", torch.uint8: "uint8", torch.int8: "int8", torch.int16: "int16",
             torch.int32: "int32", torch.int64: "int64", torch.float16: "float16", torch.float32: "float32",
             torch.float64: "float64", torch.complex64: "complex64", torch.complex128: "complex128"}
    return numpy.dtype(names.get(dtype, "float32"))
