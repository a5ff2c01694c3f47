"""What patches need of ``torch.compile``: whether code is being traced, calls left out
of the graph, and a context variable compiled code can use.

A patch keeps the release's eager code path and switches to a traceable one only where
the eager one cannot be compiled (a ``ContextVar``, an ``if`` on a device value): it
asks :func:`compiling`, which is torch's own check (``torch.compiler.is_compiling``;
``torch._dynamo.is_compiling`` before torch 2.3), True while dynamo traces and False in
eager code. :class:`Outside` runs a function eagerly from compiled code (a graph break
where it is called): for bookkeeping whose value torch.compile would otherwise guard
on, and recompile for, at every step. :func:`inline_only` marks a function dynamo is to
trace only inlined into a frame it compiles, never as a frame of its own.

Nothing here imports ``torch._dynamo`` (seconds of start-up): the pieces that need it
are made when it is imported, by a post-import hook armed with :func:`prepare`.
"""
from __future__ import annotations

import contextvars
import importlib
import logging
import sys
import weakref
from typing import Any, Callable, List, Optional

log = logging.getLogger("tmpatch")

DYNAMO = "torch._dynamo"


def _never() -> bool:
    return False


class _NoFlag:
    _is_compiling_flag = False


class _State:
    """Bound once torch (and, for some pieces, torch._dynamo) is loaded.

    ``dynamo_absent``: :func:`prepare` found ``torch._dynamo`` not imported, and it has not
    been since (its post-import hook clears it). Nothing can be tracing then but a
    non-strict ``torch.export``, which sets ``torch.compiler._is_compiling_flag``: that
    flag alone is torch's answer (``is_compiling()`` reads it, with no dynamo to ask).
    An attribute read instead of three calls, on paths every ``update()`` takes."""

    __slots__ = ("is_compiling", "dynamo_bound", "dynamo_absent", "flags")

    def __init__(self) -> None:
        self.is_compiling: Callable[[], bool] = _never
        self.dynamo_bound = False
        self.dynamo_absent = False
        self.flags: Any = _NoFlag


_state = _State()
_outsides: List["Outside"] = []
#: the functions marked by :func:`inline_only`
_inline_only: List[Callable[..., Any]] = []
#: called with ``torch._dynamo`` once it is imported (:func:`when_dynamo`)
_callbacks: List[Callable[[Any], None]] = []


class _Pending:
    """``counts``: True from the first compiled update that left its count on the device
    (``compiled_update``'s tallies, a store torch.compile replays after its graph) until
    host code reads or writes an update count again, which folds them all. Read on hot
    paths (``update_bookkeeping``'s plain stores stand aside while it is True)."""

    __slots__ = ("counts",)

    def __init__(self) -> None:
        self.counts = False


pending = _Pending()

#: a class attribute whose type has this attribute set True is a data descriptor that stores
#: into the instance's ``__dict__`` while :data:`pending` has nothing (``compiled_update``'s
#: ``Metric._update_count``): a plain store may stand for it then
PLAIN_SLOT = "_tmpatch_plain_slot"


def compiling() -> bool:
    """Whether torch.compile is tracing the caller (False in eager code)."""
    state = _state
    return state.flags._is_compiling_flag if state.dynamo_absent else state.is_compiling()


def inside_trace() -> bool:
    """Whether torch.compile's tracing is under way anywhere on this thread: in the traced code, and
    also in dynamo's or AOT autograd's own Python around it (where :func:`compiling` is False), which a
    garbage collection may interrupt to run finalizers. An older torch without the context: False."""
    guards = sys.modules.get("torch._guards")
    context = getattr(guards, "TracingContext", None) if guards is not None else None
    if context is None:
        return False
    try:  # try_get from torch 2.1; get() returns None before, raises after
        return (context.try_get() if hasattr(context, "try_get") else context.get()) is not None
    except Exception:  # noqa: BLE001 - torch's internals: nothing known to be tracing
        return False


def inline_only(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark ``fn`` (returned as is) to be traced by torch.compile only inlined into a frame
    it compiles. Called from eager code, ``fn`` runs as plain Python, not as a frame dynamo
    compiles on its own (as dynamo runs every ``__setattr__``). Eager code inside a compiled
    step is a frame dynamo gave up on (a data-dependent ``if`` in a metric's update): there
    it compiles each function called, and a frame of tmpatch's bookkeeping on the release's
    path (the count's descriptor, ``Metric.__setattr__``'s replacement) would add graph breaks
    and guards that the release's code has not. With torch's ``skip_code`` (a frame's own
    code skipped, the functions it calls compiled as before); without it, nothing changes."""
    _inline_only.append(fn)
    if DYNAMO in sys.modules:
        _skip_frame(sys.modules[DYNAMO], fn)
    return fn


def _skip_frame(dynamo: Any, fn: Callable[..., Any]) -> None:
    skip = getattr(getattr(dynamo, "eval_frame", None), "skip_code", None)
    if skip is None:  # not loaded yet (its post-import hook binds it), or another torch
        return
    try:
        skip(fn.__code__)
    except Exception as exc:  # noqa: BLE001 - torch's internals: the frame is compiled as before
        log.debug("tmpatch: %s's frame is compiled on its own (%s: %s)", fn.__qualname__, type(exc).__name__, exc)


class Outside:
    """``fn``, called from compiled code, runs eagerly (``torch._dynamo.disable``): a
    graph break there, and nothing it reads becomes a guard. ``ready``: the eager
    twin exists (torch._dynamo is loaded); else :meth:`__call__` runs ``fn`` as is.
    Called from eager code it is no frame for dynamo to compile (:func:`inline_only`)."""

    __slots__ = ("fn", "eager")

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.eager: Optional[Callable[..., Any]] = None
        _outsides.append(self)
        if DYNAMO in sys.modules:
            self._bind(sys.modules[DYNAMO])

    def _bind(self, dynamo: Any) -> None:
        if self.eager is None:
            self.eager = dynamo.disable(self.fn)

    @property
    def ready(self) -> bool:
        return self.eager is not None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        eager = self.eager
        if eager is None:
            return self.fn(*args, **kwargs)
        return eager(*args, **kwargs)


inline_only(Outside.__call__)


class ContextSlot:
    """A ``contextvars.ContextVar`` that compiled code can use: ``get()``, ``set(value)``
    (returns a token) and ``reset(token)``, as a ContextVar in eager code and as a plain
    slot while torch.compile traces (dynamo cannot trace a ContextVar; the graph never
    reads the slot: dynamo resolves it while tracing and writes the last value back).
    A value set in compiled code is not seen by eager code running in the middle of it
    (a frame dynamo gave up on), and is shared by threads while it is set.

    While ``torch._dynamo`` is not imported nothing can trace, and ``get`` is the
    ContextVar's own (a C call, no Python frame: the engine's gated layers ask it on
    every call of their targets); its post-import hook puts the checking ``get`` back."""

    __slots__ = ("_var", "traced", "get", "__weakref__")

    def __init__(self, name: str) -> None:
        self._var: "contextvars.ContextVar[Any]" = contextvars.ContextVar(name, default=None)
        self.traced: Any = None
        self.get: Callable[[], Any] = self._var.get if _state.dynamo_absent else self._get
        _slots.add(self)

    def _get(self) -> Any:
        if _traced():
            return self.traced
        return self._var.get()

    def set(self, value: Any) -> Any:
        if _traced():
            token, self.traced = (self.traced,), value  # a tuple: never a contextvars.Token
            return token
        return self._var.set(value)

    def reset(self, token: Any) -> None:
        if type(token) is tuple:
            self.traced = token[0]
        else:
            self._var.reset(token)


#: every slot, to switch its ``get`` when torch._dynamo's presence changes
_slots: "weakref.WeakSet[ContextSlot]" = weakref.WeakSet()


def _traced() -> bool:
    """Whether a slot is to use its plain value: dynamo is tracing (without dynamo, even a
    non-strict ``torch.export`` runs Python eagerly, where the ContextVar works)."""
    return not _state.dynamo_absent and _state.is_compiling()


def _absent(absent: bool) -> None:
    """Record whether torch._dynamo is absent, and give every slot the ``get`` for that."""
    _state.dynamo_absent = absent
    for slot in list(_slots):
        slot.get = slot._var.get if absent else slot._get


def _bind_torch() -> None:
    import torch

    compiler = getattr(torch, "compiler", None)
    check = getattr(compiler, "is_compiling", None)
    if check is not None:
        _state.is_compiling = check
        if hasattr(compiler, "_is_compiling_flag"):
            _state.flags = compiler
    elif DYNAMO in sys.modules:
        _state.is_compiling = sys.modules[DYNAMO].is_compiling  # torch < 2.3


def on_dynamo(module: Any) -> None:
    """Post-import hook of ``torch._dynamo``: bind the pieces that need it."""
    _absent(False)
    _bind_torch()
    for outside in _outsides:
        outside._bind(module)
    for fn in _inline_only:
        _skip_frame(module, fn)
    _state.dynamo_bound = True
    for callback in list(_callbacks):
        callback(module)


def when_dynamo(callback: Callable[[Any], None]) -> None:
    """Call ``callback(torch._dynamo)`` now if it is imported and bound (:func:`prepare`), else
    when it is; once either way."""
    if _state.dynamo_bound and DYNAMO in sys.modules:
        callback(sys.modules[DYNAMO])
    elif callback not in _callbacks:
        _callbacks.append(callback)


def prepare(arm: Callable[[str, Callable[[Any], None]], None]) -> None:
    """Bind torch's check now, and the rest once ``torch._dynamo`` is imported
    (``arm(module_name, callback)``: the engine's post-import hook). Idempotent."""
    if _state.is_compiling is _never:
        _bind_torch()
    if DYNAMO in sys.modules:
        if not _state.dynamo_bound:
            on_dynamo(sys.modules[DYNAMO])
    else:
        arm(DYNAMO, on_dynamo)
        # the flag stands for torch's check only where is_compiling() reads it (torch 2.3+)
        _absent(DYNAMO not in sys.modules and _state.flags is not _NoFlag)


def reset_dynamo() -> None:
    """``torch._dynamo.reset()``, also where a ``mode="reduce-overhead"`` compile (the
    default of :func:`tmpatch.capture`) is cached: that backend's reset imports
    ``torch._inductor.cudagraph_trees`` the first time, and the import adds a backend to the
    dict torch is walking ("dictionary changed size during iteration", torch 2.13). The
    module is imported first, where it can be."""
    import torch._dynamo

    try:
        importlib.import_module("torch._inductor.cudagraph_trees")  # for its side effect, see above
    except Exception:  # noqa: BLE001 - a torch without it: its reset does not import it either
        pass
    torch._dynamo.reset()
