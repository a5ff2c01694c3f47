"""What a simulated run does above ATen: the host-side views of CUDA tensors.

A ``TorchFunctionMode`` (pushed by :func:`tmpatch.audit.simulated_cuda`) handles:

* formatting a CUDA tensor (``print(t)``, ``str``, ``repr``, ``f"{t}"``, ``f"{t:.3f}"``): the
  values are copied to the host, one "tensor formatted on the host" point each; the text
  is the fake tensor's own, or the formatted plausible value for a 0-d tensor with a spec;
* ``Tensor.tolist()`` (one device-to-host copy, then plausible values), ``Tensor.numpy()``;
* ``torch.tensor``/``as_tensor``/``new_tensor``/``Tensor.new(list)`` of data holding CUDA tensors: one
  device-to-host read per CUDA element (what a GPU does), then built from plausible values;
  data is always built on the host and then moved, so a CUDA ``device=`` is one host-to-device
  copy;
* ``pin_memory``: simulated tensors are tagged, so a non-blocking copy from or into them is
  reported as a non-blocking copy (not a sync);
* ``.cuda()`` and ``.to("cuda")`` / ``device="cuda"`` without an index mean ``cuda:0`` (the
  current device of a GPU unless changed);
* ``copy.deepcopy`` of a tensor (what a Metric's ``__init__`` does): real tensors are copied
  for real, simulated ones as simulated clones, so a Metric can be built inside a simulation;
* ``torch.cuda.synchronize()`` and ``torch.cuda.current_stream().synchronize()``: an "explicit
  synchronize" point each.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import _disable_current_modes
from torch.utils._pytree import tree_flatten

from tmpatch.audit.oracle.classify import PINNED, is_cuda
from tmpatch.audit.oracle.continuation import from_all, plausible_scalar
from tmpatch.audit.oracle.report import SyncKind

_FORMATTERS = (torch.Tensor.__repr__, torch.Tensor.__format__)
_BUILDERS = (torch.tensor, torch.as_tensor)
T = torch.Tensor


def _nested(shape: Sequence[int], value: Any) -> Any:
    if not shape:
        return value
    return [_nested(shape[1:], value) for _ in range(shape[0])]


def _cuda_device(device: Any) -> Any:
    """``"cuda"``/``torch.device("cuda")`` -> ``cuda:0``; anything else unchanged."""
    if isinstance(device, (str, torch.device)):
        try:
            dev = torch.device(device)
        except RuntimeError:
            return device
        if dev.type == "cuda" and dev.index is None:
            return torch.device("cuda", 0)
    return device


def _numpy_dtype(dtype: torch.dtype) -> Any:
    import numpy

    names = {torch.bool: "bool", torch.uint8: "uint8", torch.int8: "int8", torch.int16: "int16",
             torch.int32: "int32", torch.int64: "int64", torch.float16: "float16", torch.float32: "float32",
             torch.float64: "float64", torch.complex64: "complex64", torch.complex128: "complex128"}
    return numpy.dtype(names.get(dtype, "float32"))


class SimStream:
    """``torch.cuda.current_stream()`` in a simulation: ``synchronize()`` is recorded."""

    def __init__(self, views: "FakeHostViews", device: Any = None) -> None:
        self.views = views
        self.device = torch.device("cuda", 0) if device is None else torch.device(device)

    def synchronize(self) -> None:
        self.views.record(SyncKind.SYNCHRONIZE, "Stream.synchronize", "the host waits for the stream")

    def query(self) -> bool:
        return True

    def wait_stream(self, stream: Any) -> None:  # device-side ordering: no sync
        return None


class FakeHostViews(TorchFunctionMode):
    """The host-side views of simulated tensors (see the module docstring)."""

    _stack: List["FakeHostViews"] = []
    _saved: Dict[str, Any] = {}

    def __init__(self, recorder: Any) -> None:
        super().__init__()
        self.recorder = recorder

    def record(self, kind: SyncKind, op: str, detail: str) -> None:
        self.recorder.record(kind, op, detail)

    # -- entering and leaving: the attributes patched while any simulation runs -----------------
    def __enter__(self) -> "FakeHostViews":
        if not FakeHostViews._stack:
            saved = FakeHostViews._saved
            saved["tolist"] = FakeTensor.__dict__.get("tolist")
            saved["synchronize"] = torch.cuda.synchronize
            saved["current_stream"] = torch.cuda.current_stream
            saved["default_stream"] = torch.cuda.default_stream
            FakeTensor.tolist = _fake_tolist  # type: ignore[method-assign]  # simulated, put back on exit
            torch.cuda.synchronize = _synchronize
            torch.cuda.current_stream = _current_stream  # type: ignore[assignment]  # simulated, put back on exit
            torch.cuda.default_stream = _current_stream  # type: ignore[assignment]  # simulated, put back on exit
        FakeHostViews._stack.append(self)
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        try:
            super().__exit__(*exc)
        finally:
            FakeHostViews._stack.remove(self)
            if not FakeHostViews._stack:
                saved = FakeHostViews._saved
                if saved.get("tolist") is None:
                    del FakeTensor.tolist
                else:
                    FakeTensor.tolist = saved["tolist"]  # type: ignore[method-assign]  # put back
                torch.cuda.synchronize = saved["synchronize"]
                torch.cuda.current_stream = saved["current_stream"]
                torch.cuda.default_stream = saved["default_stream"]
                saved.clear()

    # -- dispatch --------------------------------------------------------------------------------
    def __torch_function__(self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Any = None) -> Any:
        kwargs = dict(kwargs or {})
        if func in _FORMATTERS and args and is_cuda(args[0]):
            return self._format(func, args)
        if func is T.numpy:
            return self._numpy(args[0])
        if func is T.__deepcopy__:
            return _deepcopy(args[0], args[1] if len(args) > 1 else kwargs.get("memo", {}))
        if func is T.cuda:
            return self._cuda(args, kwargs)
        if func is T.pin_memory:
            return _pinned(args[0].clone())
        if func is T.is_pinned:
            return bool(getattr(args[0], PINNED, False))
        if "device" in kwargs:
            kwargs["device"] = _cuda_device(kwargs["device"])
        if func is T.to:
            args = tuple(_cuda_device(a) for a in args)
        if func is T.new and len(args) == 2 and not kwargs and _is_data(args[1]) and is_cuda(args[0]):
            # the legacy constructor with data: built on the host, then copied (torch 2.1's fake
            # tensors would build it on the meta device, with no copy)
            func, args, kwargs = torch.tensor, (args[1],), {"dtype": args[0].dtype, "device": args[0].device}
        if func is T.new_tensor:
            self_, data = args[0], args[1] if len(args) > 1 else kwargs.pop("data")
            kwargs.setdefault("dtype", self_.dtype)
            kwargs.setdefault("device", self_.device)
            func, args = torch.tensor, (data,)
        pinned = kwargs.get("pin_memory") is True
        if pinned:
            kwargs.pop("pin_memory")
        out = self._build(func, args, kwargs) if func in _BUILDERS else func(*args, **kwargs)
        return _pinned(out) if pinned and isinstance(out, torch.Tensor) else out

    def _format(self, func: Any, args: Sequence[Any]) -> str:
        t, spec = args[0], args[1] if len(args) > 1 else ""
        if spec and t.dim() != 0:
            return func(*args)  # a TypeError, as on a GPU, before any copy
        self.record(SyncKind.FORMAT, f"Tensor.{func.__name__}",
                    f"{tuple(t.shape)} {t.dtype} {t.device}: values copied to the host to print")
        if spec:
            return format(plausible_scalar(t, from_all(t)), spec)
        return func(*args)

    def _cuda(self, args: Sequence[Any], kwargs: Dict[str, Any]) -> Any:
        t, device = args[0], args[1] if len(args) > 1 else kwargs.pop("device", None)
        index = 0 if device is None else (device if isinstance(device, int) else _cuda_device(device).index or 0)
        return t.to(torch.device("cuda", index), non_blocking=kwargs.get("non_blocking", False))

    def _build(self, func: Any, args: Sequence[Any], kwargs: Dict[str, Any]) -> Any:
        data = args[0] if args else kwargs.pop("data")
        if isinstance(data, torch.Tensor):
            return func(data, *args[1:], **kwargs)
        leaves = [leaf for leaf in tree_flatten(data)[0] if is_cuda(leaf)]
        for leaf in leaves:
            self.record(SyncKind.D2H_READ, f"torch.{func.__name__}",
                        f"element {tuple(leaf.shape)} {leaf.dtype} {leaf.device} read to build a tensor")
        data = _plain(data)
        device = kwargs.pop("device", None)
        requires_grad = kwargs.pop("requires_grad", False)
        out = func(data, *args[1:], **kwargs)  # on the host, as a GPU would build it first
        if device is not None and torch.device(device).type != "cpu":
            out = out.to(device)
        return out.requires_grad_(True) if requires_grad else out

    def tolist(self, t: torch.Tensor) -> Any:
        """One device-to-host copy for a CUDA tensor, then a nested list of plausible values."""
        if t.device.type == "cuda":
            self.record(SyncKind.D2H_COPY, "aten._to_copy",
                        f"Tensor.tolist, {tuple(t.shape)} {t.dtype} {t.device} -> host")
        return _nested(tuple(t.shape), plausible_scalar(t, from_all(t)))

    @staticmethod
    def _numpy(t: torch.Tensor) -> Any:
        if t.device.type != "cpu":
            raise TypeError(f"can't convert {t.device.type} device type tensor to numpy. "
                            "Use Tensor.cpu() to copy the tensor to host memory first.")
        if not isinstance(t, FakeTensor):
            with _disable_current_modes():
                return t.numpy()
        import numpy

        return numpy.zeros(tuple(t.shape), dtype=_numpy_dtype(t.dtype))


def _is_data(value: Any) -> bool:
    """``Tensor.new``'s one argument read as values (a list or tuple), not as a size."""
    return isinstance(value, (list, tuple)) and not isinstance(value, torch.Size)


def _plain(data: Any) -> Any:
    """``data`` with every simulated tensor replaced by plausible Python values."""
    if isinstance(data, (list, tuple)):
        return type(data)(_plain(item) for item in data)
    if isinstance(data, FakeTensor):
        return _nested(tuple(data.shape), plausible_scalar(data, from_all(data)))
    return data


def _pinned(t: torch.Tensor) -> torch.Tensor:
    setattr(t, PINNED, True)
    return t


def _deepcopy(t: torch.Tensor, memo: Dict[int, Any]) -> torch.Tensor:
    if id(t) in memo:
        return memo[id(t)]
    if not isinstance(t, FakeTensor):
        with _disable_current_modes():
            return T.__deepcopy__(t, memo)
    new = t.detach().clone()
    if t.requires_grad:
        new.requires_grad_(True)
    memo[id(t)] = new
    for key, value in t.__dict__.items():  # tags (tmpatch's, the user's); not FakeTensor's own
        if key not in new.__dict__:
            setattr(new, key, value)
    return new


def _views() -> Optional[FakeHostViews]:
    return FakeHostViews._stack[-1] if FakeHostViews._stack else None


def _fake_tolist(self: torch.Tensor) -> Any:
    return FakeHostViews._stack[-1].tolist(self)


def _synchronize(device: Any = None) -> None:
    views = _views()
    if views is not None:
        views.record(SyncKind.SYNCHRONIZE, "torch.cuda.synchronize", "the host waits for the device")


def _current_stream(device: Any = None) -> SimStream:
    return SimStream(_views(), device)  # type: ignore[arg-type]  # None outside a simulation: never called then
