"""Simulated CUDA: fake CUDA tensors on a CPU-only machine, with the sync recorder on top."""
from __future__ import annotations

import contextlib
import copy
import logging
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Union

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._pytree import tree_map

from tmpatch.audit.oracle import autograd, bounds, caches, guard
from tmpatch.audit.oracle.continuation import Answers
from tmpatch.audit.oracle.host import FakeHostViews
from tmpatch.audit.oracle.recorder import SyncRecorder
from tmpatch.audit.oracle.report import SyncPoint
from tmpatch.patches import compiled_update
from tmpatch.runtime import deferred
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


@contextlib.contextmanager
def _new_parameters() -> Iterator[None]:
    """``module.to("cuda")`` in a simulation gives a module new parameters (simulated), as
    ``torch.__future__.set_overwrite_module_params_on_conversion(True)`` does, the default of
    newer torch for a fake tensor; older torch would set the real parameter's ``.data`` to
    it, leaving a parameter on the meta device."""
    future = torch.__future__
    before = future.get_overwrite_module_params_on_conversion()
    future.set_overwrite_module_params_on_conversion(True)
    try:
        yield
    finally:
        future.set_overwrite_module_params_on_conversion(before)


@dataclass
class SimulatedCuda:
    """Handle of an active :func:`simulated_cuda` block: the points recorded (syncs and
    non-syncs, in order) and the value reads answered."""

    device: torch.device
    sync_points: List[SyncPoint] = field(default_factory=list)
    answers: Answers = field(default_factory=Answers)
    engine: Optional[autograd.SimulatedEngine] = None  #: runs the block's backward passes

    @property
    def backward_calls(self) -> int:
        """Backward passes run on simulated tensors so far (see :mod:`tmpatch.audit.oracle.autograd`)."""
        return self.engine.calls if self.engine is not None else 0

    @property
    def backward_left_out(self) -> int:
        """Backward passes of simulated tensors this torch cannot run, left out so far."""
        return self.engine.left_out if self.engine is not None else 0

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
    the first value reads (see :class:`tmpatch.audit.oracle.continuation.Answers`). The current
    CUDA device is always ``cuda:0``. Works on CPU-only builds of torch and on CUDA builds
    without a GPU or driver (see :mod:`tmpatch.audit.oracle.guard`); backward passes run too (see
    :mod:`tmpatch.audit.oracle.autograd`). Tensors made here must not be
    used after it; the module-level caches that would keep some are put back as they were
    (:mod:`tmpatch.audit.oracle.caches`).
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
        fake = FakeTensorMode(allow_non_fake_inputs=True, allow_fallback_kernels=False)
        with caches.kept(), _new_parameters(), autograd.installed() as engine, fake, recorder, FakeHostViews(recorder):
            handle.engine = engine
            _ACTIVE.append(handle)
            try:
                yield handle
            finally:
                _ACTIVE.remove(handle)
                if not _ACTIVE:
                    bounds.forget()
    finally:
        fake_log.setLevel(level)
        guard.release()


def module_owner(fn: Any) -> Optional[torch.nn.Module]:
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
    metrics untouched. Each copy keeps its original's own functions (see :func:`_keep_functions`):
    it runs the code the original runs.
    """
    memo: Dict[int, Any] = {}

    def dup(value: Any) -> Any:
        if not isinstance(value, torch.nn.Module):
            return value
        with deferred.scope():  # the audit's own copy: the caller's pending reports stay with the caller's metric
            twin = copy.deepcopy(value, memo)
        _keep_functions(value, twin, memo)
        return twin

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


def _keep_functions(original: torch.nn.Module, twin: torch.nn.Module, memo: Dict[int, Any]) -> None:
    """Give each module of ``twin`` the functions its original holds in its instance ``__dict__``,
    rebound to the copies (``memo``: the deep copy's).

    A Metric wraps its ``update`` and ``compute`` when it is built and keeps the wrappers on
    the instance; a copy made by ``deepcopy`` (``__setstate__``) wraps them again with the
    class's code of now. A metric built before ``tmpatch.apply()`` keeps the release's
    functions (and has no book of deferred reports), so its copy must too, or the audit
    reports what a new metric would do.
    """
    for source, copied in zip(original.modules(), twin.modules()):
        books = deferred.mirror(source, copied)  # tmpatch's own record of the metric: as the original's
        if books is not None:
            memo.setdefault(id(books[0]), books[1])
        tallies = compiled_update.mirror(source, copied)  # its compiled updates' count: the twin's own
        if tallies is not None:
            memo.setdefault(id(tallies[0]), tallies[1])
        own = vars(copied)
        for name, value in vars(source).items():
            if isinstance(value, types.FunctionType) and value.__closure__:
                own[name] = _rebound(value, memo, 0)


def _rebound(value: Any, memo: Dict[int, Any], depth: int) -> Any:
    """``value`` with every object the deep copy copied replaced by its copy: a copied object
    itself, a bound method of one, a function whose closure or attributes hold one (a new
    function of the same code); anything else is ``value`` itself."""
    if depth > 8:
        return value
    twin = memo.get(id(value))
    if twin is not None and twin is not value and id(value) != id(memo):
        return twin
    if isinstance(value, types.MethodType):
        owner = _rebound(value.__self__, memo, depth + 1)
        return value if owner is value.__self__ else types.MethodType(value.__func__, owner)
    if not isinstance(value, types.FunctionType) or not (value.__closure__ or value.__dict__):
        return value
    cells = []
    for cell in value.__closure__ or ():
        try:
            content = cell.cell_contents
        except ValueError:  # an empty cell
            cells.append(cell)
            continue
        new = _rebound(content, memo, depth + 1)
        cells.append(cell if new is content else types.CellType(new))
    extra = {key: _rebound(item, memo, depth + 1) for key, item in value.__dict__.items()}
    if all(a is b for a, b in zip(cells, value.__closure__ or ())) and \
            all(extra[key] is item for key, item in value.__dict__.items()):
        return value
    made = types.FunctionType(value.__code__, value.__globals__, value.__name__, value.__defaults__,
                              tuple(cells) if value.__closure__ is not None else None)
    made.__kwdefaults__ = value.__kwdefaults__
    made.__qualname__, made.__module__, made.__doc__ = value.__qualname__, value.__module__, value.__doc__
    made.__dict__.update(extra)
    return made
