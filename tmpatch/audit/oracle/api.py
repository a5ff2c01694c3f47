"""Entry points: ``audit``, ``count_syncs`` and the ``no_sync`` guard."""
from __future__ import annotations

import contextlib
import inspect
import logging
import warnings
from typing import Any, Callable, Iterator, Optional, Sequence

import torch
from torch.utils._pytree import tree_map

from tmpatch.audit.oracle import caches
from tmpatch.audit.oracle.locate import locate
from tmpatch.audit.oracle.recorder import FAKE_ERRORS, SyncRecorder, is_device_mismatch
from tmpatch.audit.oracle.report import AuditReport, SyncError, SyncKind, SyncPoint, result_devices
from tmpatch.audit.oracle.sim import DeviceLike, copy_modules, cuda_device, module_owner, simulated_cuda

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
        report.add(SyncPoint(SyncKind.DEVICE_MISMATCH, "(return value)", location, function,
                             f"returned tensor on {', '.join(stray)}; audited on {report.device}"))


def audit(fn: Callable[..., Any], *args: Any, device: DeviceLike = "cuda:0", real: Optional[bool] = None,
          answers: Optional[Sequence[Any]] = None, **kwargs: Any) -> AuditReport:
    """Run ``fn(*args, **kwargs)`` on CUDA ``device`` and report every sync point it hits.

    Tensors in the arguments go to ``device``; modules/Metrics in the arguments and the
    module ``fn`` is bound to (``metric.update``) are deep-copied first, then moved, so the
    caller's objects are left as they were; a copy runs what its original runs (a metric
    built before ``tmpatch.apply()`` keeps the release's update, see
    :func:`tmpatch.audit.oracle.sim.copy_modules`). ``real=None`` uses a real GPU when there is one
    (syncs counted by ``torch.cuda.set_sync_debug_mode("warn")``), else simulated CUDA
    (fake tensors: the return value holds fake tensors, and the run continues past each
    sync with plausible values, see :mod:`tmpatch.audit.oracle.continuation`). ``real=False``
    never touches the CUDA runtime. ``answers`` (simulated only) gives the values of the
    first value reads, in order (``None``: the default answer); the reads are in
    ``report.reads``, and :func:`tmpatch.audit.oracle.branches.audit_branches` explores both
    sides of each. A device mismatch (an op's or the return value's tensor on another
    CUDA device, operands on two devices) is reported apart from the syncs.
    """
    dev = cuda_device(device)
    fn, args, kwargs = copy_modules(fn, args, kwargs)
    if _use_real(real):
        report = _audit_real(fn, args, kwargs, dev)
    else:
        report = audit_simulated(fn, args, kwargs, dev, answers)
    _check_result(report, fn)
    return report


def audit_simulated(fn: Callable[..., Any], args: Any, kwargs: Any, dev: torch.device,
                    answers: Optional[Sequence[Any]] = None, catch: bool = False) -> AuditReport:
    """The simulated half of :func:`audit`, on already copied arguments. With ``catch``, any
    exception of ``fn`` ends the run as ``report.error`` instead of propagating."""
    report = AuditReport(device=dev, mode="simulated")
    with simulated_cuda(dev, answers=answers) as sim:
        owner = module_owner(fn)
        if owner is not None:
            sim.put(owner)
        args, kwargs = sim.put(args), sim.put(kwargs)
        del sim.sync_points[:]  # moving the inputs is set-up, not the audited code
        try:
            report.result = fn(*args, **kwargs)
        except FAKE_ERRORS as exc:
            log.warning("tmpatch.audit: simulation stopped early at %s", exc)
            report.error = exc
        except Exception as exc:  # noqa: BLE001 - re-raised unless asked to keep it
            if not (catch or is_device_mismatch(exc)):
                raise
            report.error = exc
        finally:
            for point in sim.sync_points:
                report.add(point)
            report.reads = list(sim.answers.reads)
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
    kind = found[0] if found and found[0].is_sync else SyncKind.D2H_READ
    location, function = locate(2)
    return SyncPoint(kind, op, location, function, message.strip().splitlines()[0][:120])


def _audit_real(fn: Callable[..., Any], args: Any, kwargs: Any, dev: torch.device) -> AuditReport:
    report = AuditReport(device=dev, mode="real")
    owner = module_owner(fn)
    if owner is not None:
        owner.to(dev)
    args, kwargs = tree_map(lambda v: _move_real(v, dev), (args, kwargs))
    tracker = SyncRecorder(report.add, simulate=False)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        shown = warnings.showwarning

        def hook(message: Any, category: Any, filename: str, lineno: int, file: Any = None,
                 line: Any = None) -> None:
            if _SYNC_MESSAGE in str(message):
                report.add(_real_point(tracker, str(message)))
            else:
                shown(message, category, filename, lineno, file, line)

        warnings.showwarning = hook
        with caches.kept(), torch.cuda.device(dev), _sync_debug("warn"), tracker:
            report.result = fn(*args, **kwargs)
    return report


def count_syncs(fn: Callable[..., Any], *args: Any, device: DeviceLike = "cuda:0", real: Optional[bool] = None,
                **kwargs: Any) -> int:
    """Number of sync points of ``fn(*args, **kwargs)``; see :func:`audit`."""
    return audit(fn, *args, device=device, real=real, **kwargs).count


MOVE_HINT = ("moving a metric or a tensor to the device inside the guarded block is itself a host-to-device "
             "copy: build and move it before the block ({how}), then call update() inside")


def move_hint(point: SyncPoint, how: str = "tmpatch.audit.to_sim_cuda(obj, device), or obj.to(device) on a GPU") -> str:
    """The hint a :class:`SyncError` carries when ``point`` looks like set-up (a host-to-device copy)."""
    return MOVE_HINT.format(how=how) if point.kind is SyncKind.H2D_COPY else ""


class _RaisingTracker(SyncRecorder):
    """On a real GPU: turn the sync-debug error into a :class:`SyncError` naming the op."""

    hint: Callable[[SyncPoint], str] = staticmethod(move_hint)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        try:
            return super().__torch_dispatch__(func, types, args, kwargs)
        except RuntimeError as exc:
            if _SYNC_MESSAGE in str(exc) and not isinstance(exc, SyncError):
                point = _real_point(self, str(exc))
                raise SyncError(point, self.hint(point)) from exc
            raise


@contextlib.contextmanager
def no_sync(device: DeviceLike = "cuda:0", real: Optional[bool] = None,
            hint: Callable[[SyncPoint], str] = move_hint) -> Iterator[torch.device]:
    """Raise :class:`SyncError` on the first sync point inside the block; yields the device.

    With a real GPU (``real=None`` auto) this is ``torch.cuda.set_sync_debug_mode("error")``.
    Without one the block runs in :func:`simulated_cuda`: tensors created inside with
    ``device="cuda"`` are fake (no values), and inputs must be moved in with
    ``to_sim_cuda(x, device)``.
    """
    dev = cuda_device(device)
    if _use_real(real):
        tracker = _RaisingTracker(lambda point: None, simulate=False)
        tracker.hint = hint
        with torch.cuda.device(dev), _sync_debug("error"), tracker:
            yield dev
        return

    def stop(point: SyncPoint) -> None:
        if point.is_sync:
            raise SyncError(point, hint(point))

    with simulated_cuda(dev, on_sync=stop):
        yield dev
