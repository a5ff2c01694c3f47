"""Simulated CUDA: fake CUDA tensors on a CPU-only machine, with the sync recorder on top."""
from __future__ import annotations

import contextlib
import copy
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Union

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._pytree import tree_map

from tmpatch.audit import caches, guard
from tmpatch.audit.continuation import Answers
from tmpatch.audit.host import FakeHostViews
from tmpatch.audit.recorder import SyncRecorder
from tmpatch.audit.report import SyncPoint
from tmpatch.spec import VALUE_MOVE

log = logging.getLogger("tmpatch")

DeviceLike = Union[str, int, torch.device]


def cuda_device(device: DeviceLike = "cuda:0") -> torch.device:
    """Normalise to a CUDA device with an index (``"cuda"`` -> ``cuda:0``)."""
    dev = torch.device(f"cuda:{device}" if isinstance(device, int) else device)
    if dev.type != "cuda":
        raise ValueError(f"expected a CUDA device, got {dev}")
    return torch.device("cuda", dev.index or 0)


_ACTIVE: List["SimulatedCuda"] = []  #: the simulations entered and not left, innermost last


def active() -> Optional["SimulatedCuda"]:
    """The innermost active :func:`simulated_cuda` block, or None."""
    return _ACTIVE[-1] if _ACTIVE else None


def _fake_tensor(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    if isinstance(t, FakeTensor) and t.device == device:
        return t
    out = torch.empty_strided(t.size(), t.stride(), dtype=t.dtype, device=device)
    return out.requires_grad_(True) if t.requires_grad else out


def to_sim_cuda(obj: Any, device: DeviceLike = "cuda:0") -> Any:
    """Move a tensor, a module/Metric (states, defaults and ``.device``), or a container of them,
    to the simulated ``device``. Must run inside :func:`simulated_cuda`.

    Tensors become fake tensors of the same shape, stride and dtype (fake tensors have no
    values). Modules are changed in place (``Module._apply``) and returned; build a Metric
    outside the simulation, its ``__init__`` deep-copies real tensors.
    """
    if not _ACTIVE:
        raise RuntimeError("to_sim_cuda() needs an active simulated_cuda() context")
    dev = cuda_device(device)

    def move(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            return _fake_tensor(value, dev)
        if isinstance(value, torch.nn.Module):
            return _move_module(value, fake)
        return value

    def fake(t: torch.Tensor) -> torch.Tensor:
        return _fake_tensor(t, dev)

    setattr(fake, VALUE_MOVE, True)  # a move: what a patch knows of a state's values holds after it

    return tree_map(move, obj)


def _move_module(module: torch.nn.Module, fn: Callable[[torch.Tensor], torch.Tensor]) -> torch.nn.Module:
    """``module._apply(fn)`` for everything but parameters and buffers (a Metric's states,
    ``.device``...), which are replaced directly: ``Module._apply`` would set a real
    parameter's ``.data`` to a fake tensor, or try to swap them."""
    saved = [(m, dict(m._parameters), dict(m._buffers)) for m in module.modules()]
    for m, _, _ in saved:
        m._parameters.clear()
        m._buffers.clear()
    try:
        module._apply(fn)
    finally:
        for m, params, buffers in saved:
            for key, param in params.items():
                m._parameters[key] = None if param is None else \
                    torch.nn.Parameter(fn(param.detach()), requires_grad=param.requires_grad)
            for key, buffer in buffers.items():
                m._buffers[key] = None if buffer is None else fn(buffer)
    return module


@dataclass
class SimulatedCuda:
    """Handle of an active :func:`simulated_cuda` block: the points recorded (syncs and
    non-syncs, in order) and the value reads answered."""

    device: torch.device
    sync_points: List[SyncPoint] = field(default_factory=list)
    answers: Answers = field(default_factory=Answers)

    def put(self, obj: Any) -> Any:
        """:func:`to_sim_cuda` onto this simulation's device."""
        return to_sim_cuda(obj, self.device)


@contextlib.contextmanager
def simulated_cuda(device: DeviceLike = "cuda:0", on_sync: Optional[Callable[[SyncPoint], None]] = None,
                   answers: Optional[Sequence[Any]] = None) -> Iterator[SimulatedCuda]:
    """Run the block on simulated CUDA tensors and record its sync points.

    Inside, ``torch.*(..., device="cuda")`` creates fake tensors (shapes, dtypes and devices
    only; no values), real CPU tensors mix in as constants, and every point (syncs and
    non-syncs: see :attr:`SyncPoint.is_sync`) is appended to ``handle.sync_points`` (and
    passed to ``on_sync``, which may raise to stop the block). ``answers``: the values of
    the first value reads (see :class:`tmpatch.audit.continuation.Answers`). The current
    CUDA device is always ``cuda:0``. Works on CPU-only builds of torch and on CUDA builds
    without a GPU or driver (see :mod:`tmpatch.audit.guard`). Tensors made here must not be
    used after it; the module-level caches that would keep some are put back as they were
    (:mod:`tmpatch.audit.caches`).
    """
    handle = SimulatedCuda(cuda_device(device), answers=Answers(answers))

    def sink(point: SyncPoint) -> None:
        handle.sync_points.append(point)
        if on_sync is not None:
            on_sync(point)

    # torch logs a traceback at ERROR for every op whose meta kernel raises; the exception
    # itself reaches the caller, so the log is noise in an audit's output
    fake_log = logging.getLogger("torch._subclasses.fake_tensor")
    level = fake_log.level
    guard.acquire()
    try:
        recorder = SyncRecorder(sink, answers=handle.answers)
        fake_log.setLevel(logging.CRITICAL)
        with caches.kept(), FakeTensorMode(allow_non_fake_inputs=True, allow_fallback_kernels=False), recorder, \
                FakeHostViews(recorder):
            _ACTIVE.append(handle)
            try:
                yield handle
            finally:
                _ACTIVE.remove(handle)
    finally:
        fake_log.setLevel(level)
        guard.release()


def module_owner(fn: Callable[..., Any]) -> Optional[torch.nn.Module]:
    """The module ``fn`` is, or the module a (possibly ``functools.wraps``-wrapped) bound method
    belongs to."""
    if isinstance(fn, torch.nn.Module):
        return fn
    seen = 0
    while fn is not None and seen < 16:
        owner = getattr(fn, "__self__", None)
        if isinstance(owner, torch.nn.Module):
            return owner
        fn = getattr(fn, "__wrapped__", None)
        seen += 1
    return None


def copy_modules(fn: Callable[..., Any], args: Any, kwargs: Dict[str, Any]) -> Any:
    """Deep-copy the modules in ``args``/``kwargs`` and the one ``fn`` is bound to, consistently.

    Returns ``(fn, args, kwargs)`` pointing at the copies, so an audit leaves the caller's
    metrics untouched.
    """
    memo: Dict[int, Any] = {}

    def dup(value: Any) -> Any:
        return copy.deepcopy(value, memo) if isinstance(value, torch.nn.Module) else value

    owner = module_owner(fn)
    if owner is fn:
        fn = dup(fn)
    elif owner is not None:
        twin = dup(owner)
        name = getattr(fn, "__name__", None)
        bound = getattr(twin, name, None) if name else None
        if bound is None:
            log.warning("tmpatch.audit: cannot rebind %r to a copy; auditing the original module", fn)
        else:
            fn = bound
    return fn, tree_map(dup, args), tree_map(dup, kwargs)
