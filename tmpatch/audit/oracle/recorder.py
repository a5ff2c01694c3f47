"""The oracle: a TorchDispatchMode that records the sync points of every ATen op it sees.

Which ops sync, and how, is the table of :mod:`tmpatch.audit.oracle.classify`; how a simulated
run goes on past a value read or a data-dependent shape is :mod:`tmpatch.audit.oracle.continuation`;
what happens above ATen (formatting, ``tolist``, ``torch.tensor`` of CUDA values,
``torch.cuda.synchronize``) is :mod:`tmpatch.audit.oracle.host`. Besides the syncs, an op whose
CUDA output lands on a device none of its CUDA inputs is on, and operands on two devices
(an error on a GPU), are reported as device mismatches (not syncs).

Host tensors keep real values: an op on real CPU tensors only (``torch.arange(n)``,
``torch.tensor([...])``, ``t.tolist()`` of them) runs for real, outside the fake mode, so
host-side code (index lists, Python conditions on host values) runs as on a GPU machine;
only what comes from a CUDA tensor is simulated.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    FakeTensor,
    UnsupportedOperatorException,
)
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_map

from tmpatch.audit.oracle import bounds
from tmpatch.audit.oracle.classify import Found, classify, classify_all, is_cuda, tensors
from tmpatch.audit.oracle.continuation import Answers, shaped_on_host, synthesize, tag_all
from tmpatch.audit.oracle.locate import locate
from tmpatch.audit.oracle.report import SyncKind, SyncPoint

log = logging.getLogger("tmpatch")
aten = torch.ops.aten

Sink = Callable[[SyncPoint], None]
FAKE_ERRORS = (DataDependentOutputException, DynamicOutputShapeException)
_DEVICE_PUT = getattr(getattr(torch.ops, "prims", None), "device_put", None)
_MISMATCH_TEXTS = ("found two different devices", "on the same device", "found at least two devices")

__all__ = ["FAKE_ERRORS", "SyncRecorder", "classify", "classify_all", "is_device_mismatch", "op_name"]


def op_name(func: Any) -> str:
    """``aten._to_copy`` style name of an OpOverload."""
    return str(getattr(func, "overloadpacket", func))


def _to_cuda(func: Any, args: Sequence[Any], kwargs: Dict[str, Any]) -> bool:
    device = kwargs.get("device")
    if isinstance(device, (str, torch.device)):
        return torch.device(device).type == "cuda"
    if func.overloadpacket in (aten.copy_, aten.copy):
        return is_cuda(args[0])
    if func.overloadpacket is _DEVICE_PUT and len(args) > 1:
        return torch.device(args[1]).type == "cuda"
    return False


def _plain_sources(func: Any, args: Sequence[Any], kwargs: Dict[str, Any]) -> Tuple[Any, Any]:
    """An op that puts host data on CUDA gets its host sources as plain fake tensors: given real
    tensors or fake constants only, a FakeTensorMode runs the op for real ("constant
    propagation"), on the CUDA runtime."""
    if not _to_cuda(func, args, kwargs):
        return args, kwargs
    keep = args[0] if func.overloadpacket in (aten.copy_, aten.copy) else None

    def plain(value: Any) -> Any:
        if not isinstance(value, torch.Tensor) or value is keep or is_cuda(value):
            return value
        if isinstance(value, FakeTensor) and getattr(value, "constant", None) is None:
            return value
        return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device=value.device)

    return tree_map(plain, tuple(args)), tree_map(plain, dict(kwargs))


def _on_the_host(args: Sequence[Any], kwargs: Dict[str, Any]) -> bool:
    """Whether an op works on real host tensors only (none simulated, nothing for CUDA)."""
    device = kwargs.get("device")
    if device is not None and torch.device(device).type != "cpu":
        return False
    return all(not isinstance(t, FakeTensor) and t.device.type == "cpu" for t in tensors((args, kwargs)))


def is_device_mismatch(exc: BaseException) -> bool:
    """Whether ``exc`` is the error of operands on different devices (fake mode or a GPU)."""
    return isinstance(exc, RuntimeError) and any(text in str(exc) for text in _MISMATCH_TEXTS)


class SyncRecorder(TorchDispatchMode):
    """Records sync points of the ops run under it; on fake tensors it also keeps the run going.

    Push it inside (after) a ``FakeTensorMode`` for simulation, or alone over real tensors
    (``simulate=False``), where it only names the op in flight (``current``) for the
    CUDA sync-debug warnings. ``answers`` answers the simulated value reads.
    """

    def __init__(self, sink: Sink, simulate: bool = True, answers: Optional[Answers] = None) -> None:
        super().__init__()
        self.sink = sink
        self.simulate = simulate
        self.answers = answers if answers is not None else Answers()
        self.current: Optional[Tuple[str, Optional[Found]]] = None

    def record(self, kind: SyncKind, op: str, detail: str) -> None:
        """Locate and report one point."""
        location, function = locate(1)
        point = SyncPoint(kind, op, location, function, detail)
        log.debug("tmpatch.audit: %s", point)
        self.sink(point)

    def __torch_dispatch__(self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        found = classify_all(func, args, kwargs)
        if not self.simulate:
            self.current = (op_name(func), found[0] if found else None)
            return func(*args, **kwargs)
        for kind, detail in found:
            self.record(kind, op_name(func), detail)
        if _on_the_host(args, kwargs):  # host values are real, as on a GPU machine
            with _disable_current_modes():
                return func(*args, **kwargs)
        out = self._run(func, args, kwargs)
        if func.overloadpacket is aten.all:
            tag_all(out)
        bounds.note(func, args, kwargs, out)
        self._check_devices(func, args, kwargs, out)
        return out

    def _run(self, func: Any, args: Sequence[Any], kwargs: Dict[str, Any]) -> Any:
        args, kwargs = _plain_sources(func, args, kwargs)
        try:
            return func(*args, **kwargs)
        except FAKE_ERRORS as exc:
            packet = func.overloadpacket
            if packet is aten._local_scalar_dense:
                return self.answers.scalar(args[0])
            if packet in (aten.equal, aten.allclose):
                return self.answers.equal(op_name(func))
            out = synthesize(func, args, kwargs)
            if out is NotImplemented:
                if not classify_all(func, args, kwargs) and any(is_cuda(t) for t in tensors(args)):
                    self.record(SyncKind.DATA_DEPENDENT_SHAPE, op_name(func), "unsupported; audit stopped")
                raise
            log.debug("tmpatch.audit: continued past %s (%s)", op_name(func), type(exc).__name__)
            return out
        except UnsupportedOperatorException:
            out = shaped_on_host(func, args, kwargs)
            if out is NotImplemented:
                raise
            log.debug("tmpatch.audit: %s shaped on the host (no fake kernel in this torch)", op_name(func))
            return out
        except RuntimeError as exc:
            if is_device_mismatch(exc):
                devices = sorted({str(t.device) for t in tensors((args, kwargs))})
                self.record(SyncKind.DEVICE_MISMATCH, op_name(func),
                            f"operands on {', '.join(devices)}: an error on a GPU")
            raise

    def _check_devices(self, func: Any, args: Sequence[Any], kwargs: Dict[str, Any], out: Any) -> None:
        inputs = {t.device for t in tensors((args, kwargs)) if t.device.type == "cuda"}
        if not inputs:
            return
        stray = sorted({str(t.device) for t in tensors(out) if t.device.type == "cuda"} - {str(d) for d in inputs})
        if stray:
            self.record(SyncKind.DEVICE_MISMATCH, op_name(func),
                        f"output on {', '.join(stray)}; inputs on {', '.join(sorted(map(str, inputs)))}")

