"""Entry points: ``audit``, ``count_syncs`` and the ``no_sync`` guard."""
from __future__ import annotations

import contextlib
import inspect
import logging
import warnings
from typing import Any, Callable, Iterator, Optional

import torch
from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException
from torch.utils._pytree import tree_map

from tmpatch.audit.locate import locate
from tmpatch.audit.recorder import SyncRecorder
from tmpatch.audit.report import AuditReport, SyncError, SyncKind, SyncPoint, result_devices
from tmpatch.audit.sim import DeviceLike, copy_modules, cuda_device, module_owner, simulated_cuda

log = logging.getLogger("tmpatch")

_SYNC_MESSAGE = "synchronizing CUDA operation"


def real_gpu_available() -> bool:
    """Whether a real CUDA GPU can run the audit."""
    return torch.cuda.is_available()


def _use_real(real: Optional[bool]) -> bool:
    if real and not real_gpu_available():
        raise RuntimeError("real=True needs a CUDA GPU")
    return real_gpu_available() if real is None else bool(real)


def _function_location(fn: Callable[..., Any]) -> "tuple[str, str]":
    target = inspect.unwrap(getattr(fn, "__func__", fn))
    code = getattr(getattr(target, "__func__", target), "__code__", None)
    if code is None:
        return "?", getattr(fn, "__qualname__", repr(fn))
    return f"{code.co_filename}:{code.co_firstlineno}", code.co_name


def _check_result(report: AuditReport, fn: Callable[..., Any]) -> None:
    stray = sorted({str(d) for d in result_devices(report.result) if d.type == "cuda" and d != report.device})
    if stray:
        location, function = _function_location(fn)
        report.sync_points.append(SyncPoint(SyncKind.DEVICE_MISMATCH, "(return value)", location, function,
                                            f"returned tensor on {', '.join(stray)}; audited on {report.device}"))


def audit(fn: Callable[..., Any], *args: Any, device: DeviceLike = "cuda:0", real: Optional[bool] = None,
          **kwargs: Any) -> AuditReport:
    """Run ``fn(*args, **kwargs)`` on CUDA ``device`` and report every sync point it hits.

    Tensors in the arguments go to ``device``; modules/Metrics in the arguments and the
    module ``fn`` is bound to (``metric.update``) are deep-copied first, then moved, so the
    caller's objects are left as they were. ``real=None`` uses a real GPU when there is one
    (syncs counted by ``torch.cuda.set_sync_debug_mode("warn")``), else simulated CUDA
    (fake tensors: the return value holds fake tensors, and the run continues past each
    sync with plausible values, see :mod:`tmpatch.audit.recorder`). A return value on
    another CUDA device than ``device`` adds a "device mismatch" point.
    """
    dev = cuda_device(device)
    fn, args, kwargs = copy_modules(fn, args, kwargs)
    runner = _audit_real if _use_real(real) else _audit_simulated
    report = runner(fn, args, kwargs, dev)
    _check_result(report, fn)
    return report


def _audit_simulated(fn: Callable[..., Any], args: Any, kwargs: Any, dev: torch.device) -> AuditReport:
    report = AuditReport(device=dev, mode="simulated")
    with simulated_cuda(dev) as sim:
        owner = module_owner(fn)
        if owner is not None:
            sim.put(owner)
        args, kwargs = sim.put(args), sim.put(kwargs)
        del sim.sync_points[:]  # moving the inputs is set-up, not the audited code
        report.sync_points = sim.sync_points
        try:
            report.result = fn(*args, **kwargs)
        except (DataDependentOutputException, DynamicOutputShapeException) as exc:
            log.warning("tmpatch.audit: simulation stopped early at %s", exc)
            report.error = exc
    return report


def _move_real(value: Any, dev: torch.device) -> Any:
    if isinstance(value, (torch.Tensor, torch.nn.Module)):
        return value.to(dev)
    return value


@contextlib.contextmanager
def _sync_debug(mode: str) -> Iterator[None]:
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode(mode)
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)


def _real_point(tracker: SyncRecorder, message: str) -> SyncPoint:
    op, found = tracker.current or ("?", None)
    kind = found[0] if found else SyncKind.D2H_READ
    location, function = locate(2)
    return SyncPoint(kind, op, location, function, message.strip().splitlines()[0][:120])


def _audit_real(fn: Callable[..., Any], args: Any, kwargs: Any, dev: torch.device) -> AuditReport:
    report = AuditReport(device=dev, mode="real")
    owner = module_owner(fn)
    if owner is not None:
        owner.to(dev)
    args, kwargs = tree_map(lambda v: _move_real(v, dev), (args, kwargs))
    tracker = SyncRecorder(report.sync_points.append, simulate=False)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        shown = warnings.showwarning

        def hook(message: Any, category: Any, filename: str, lineno: int, file: Any = None,
                 line: Any = None) -> None:
            if _SYNC_MESSAGE in str(message):
                report.sync_points.append(_real_point(tracker, str(message)))
            else:
                shown(message, category, filename, lineno, file, line)

        warnings.showwarning = hook
        with torch.cuda.device(dev), _sync_debug("warn"), tracker:
            report.result = fn(*args, **kwargs)
    return report


def count_syncs(fn: Callable[..., Any], *args: Any, device: DeviceLike = "cuda:0", real: Optional[bool] = None,
                **kwargs: Any) -> int:
    """Number of sync points of ``fn(*args, **kwargs)``; see :func:`audit`."""
    return audit(fn, *args, device=device, real=real, **kwargs).count


class _RaisingTracker(SyncRecorder):
    """On a real GPU: turn the sync-debug error into a :class:`SyncError` naming the op."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        try:
            return super().__torch_dispatch__(func, types, args, kwargs)
        except RuntimeError as exc:
            if _SYNC_MESSAGE in str(exc) and not isinstance(exc, SyncError):
                raise SyncError(_real_point(self, str(exc))) from exc
            raise


@contextlib.contextmanager
def no_sync(device: DeviceLike = "cuda:0", real: Optional[bool] = None) -> Iterator[torch.device]:
    """Raise :class:`SyncError` on the first sync point inside the block; yields the device.

    With a real GPU (``real=None`` auto) this is ``torch.cuda.set_sync_debug_mode("error")``.
    Without one the block runs in :func:`simulated_cuda`: tensors created inside with
    ``device="cuda"`` are fake (no values), and inputs must be moved in with
    ``to_sim_cuda(x, device)``.
    """
    dev = cuda_device(device)
    if _use_real(real):
        tracker = _RaisingTracker(lambda point: None, simulate=False)
        with torch.cuda.device(dev), _sync_debug("error"), tracker:
            yield dev
        return

    def stop(point: SyncPoint) -> None:
        raise SyncError(point)

    with simulated_cuda(dev, on_sync=stop):
        yield dev
