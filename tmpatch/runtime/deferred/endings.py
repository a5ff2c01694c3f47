"""Reports no call can raise: what a book still holds when its metric is garbage-collected
(:func:`collected`), when the process exits (``atexit``) and when a ``multiprocessing`` child, a
DataLoader worker among them, ends (:func:`armed`: a ``multiprocessing.util.Finalize``, which the
child's exit runs before ``os._exit``, registered again in each child it starts). Each is logged
on the ``tmpatch`` logger, as an error or a warning, and written to stderr when no handler of that
logger writes there (:func:`tell`), naming the metric (a :class:`Ghost` once it is gone), what was
seen, the update of the first occurrence where known and how to get the release's eager checks
(the reporter's own text). A forked child starts with every book empty (``os.register_at_fork``):
it reports its own updates, its parent the parent's.

A metric collected while no read can be made (a dispatch mode is active: the sync audit, a trace;
a CUDA graph is being captured) leaves its book to the next update of any metric, or to the exit.
"""
from __future__ import annotations

import atexit
import contextlib
import logging
import os
import sys
import warnings
import weakref
from typing import Any, List, Optional, Tuple

from tmpatch.runtime.compiled import inside_trace
from tmpatch.runtime.deferred.books import LOCK, Book, _books, log
from tmpatch.runtime.deferred.giving import Tally, deliver
from tmpatch.runtime.deferred.landing import (
    WATCH,
    decode,
    device_of,
    gather_traced,
    holds,
    read,
    reduced,
    simulated,
    take,
)


# -- what a metric that is gone leaves to its reporters -------------------------------------------
class Ghost:
    """A metric's stand-in once it is garbage-collected: an instance of a class of the same name
    holding the metric's plain attributes (``nan_strategy``, ``power``...), as the reporters
    read them. Made at the first evidence the metric notes."""


_GHOSTS: "weakref.WeakKeyDictionary[type, type]" = weakref.WeakKeyDictionary()
_PLAIN = (str, int, float, bool, type(None))


def ghost(metric: Any) -> Ghost:
    """A :class:`Ghost` of ``metric``."""
    cls = type(metric)
    kind = _GHOSTS.get(cls)
    if kind is None:
        kind = _GHOSTS[cls] = type(cls.__name__, (Ghost,), {"__module__": cls.__module__,
                                                            "__qualname__": cls.__qualname__})
    made = kind()
    made.__dict__.update({name: value for name, value in getattr(metric, "__dict__", {}).items()
                          if type(value) in _PLAIN})
    return made


# -- where nothing can raise: the metric collected, the process or a child ending ----------------------
def holder(book: Book) -> Any:
    """The metric of ``book``, or its :class:`Ghost` once it is gone."""
    metric = book.ref()
    return metric if metric is not None else (book.ghost if book.ghost is not None else Ghost())


def _unreadable_now(book: Book) -> bool:
    """Whether the book's evidence cannot be read now: a dispatch or function mode is active (the
    sync audit's simulation, a trace: a finalizer may run inside one), torch.compile is tracing
    (a garbage collection in the middle of it runs finalizers with torch's dispatch half set up:
    an op there yields garbage and leaves the trace broken), torch's dispatch is switched off
    (``no_dispatch()``), or its CUDA stream is being captured into a graph."""
    import torch

    if inside_trace() or _dispatch_off(torch):
        return True
    if any(getattr(torch._C, name, lambda: 0)() for name in ("_len_torch_dispatch_stack", "_len_torch_function_stack")):
        return True
    key = getattr(getattr(torch._C, "_TorchDispatchModeKey", None), "FAKE", None)
    if key is not None and torch._C._get_dispatch_mode(key) is not None:
        return True
    device = device_of(book)
    if device is None or device.type != "cuda" or not torch.cuda.is_available():
        return False
    try:
        return bool(torch.cuda.is_current_stream_capturing())
    except Exception:  # noqa: BLE001 - no CUDA to ask
        return False


def _dispatch_off(torch: Any) -> bool:
    """Whether torch's Python dispatch is switched off on this thread (``no_dispatch()``)."""
    python_key = getattr(torch._C.DispatchKey, "Python", None)
    excluded = getattr(torch._C, "_dispatch_tls_is_dispatch_key_excluded", None)
    return bool(python_key is not None and excluded is not None and excluded(python_key))


def _simulated_book(book: Book) -> bool:
    """Whether the book's evidence is simulated (the sync audit's copies of a metric), which has no
    values to read: it is dropped, unread."""
    tensors = [evidence for _, evidence, _, _ in book.pending] + list(book.counts.values())
    tensors += list((book.synced or {}).values()) + (list(book.flight.dev) if book.flight is not None else [])
    return any(simulated(t) for t in tensors)


def detached(book: Book, where: str) -> None:
    """Report everything ``book`` holds where no call can raise it (``where``: the metric's
    collection, the process's exit): logged, after a synchronous read of what is on the device
    (the only read of the book; a metric kept to the end costs it at exit)."""
    with LOCK:
        if not holds(book):
            return
        if _simulated_book(book):  # a finalizer may run anywhere, inside a simulation too
            _drop(book)
            return
        if _unreadable_now(book):
            WATCH.orphan(book)  # the next update of any metric adopts it
            return
        gather_traced(book)
        synced, flight = book.synced, book.flight
        book.synced, book.flight = None, None
        parts = take(book)
    try:
        tallies: List[Tally] = []
        if synced:
            keys = list(synced)
            tallies.append(decode([(key, 1, [None]) for key in keys], read([synced[key].reshape(1) for key in keys])))
        else:
            if flight is not None:
                landed = flight.landed()
                tallies.append(landed if landed is not None else flight.tally(read(flight.device_values())))
            tallies.append(decode([(key, sign, steps) for key, sign, steps, _ in parts], read(reduced(parts))))
    except Exception as exc:  # noqa: BLE001 - never break the user's program at exit or in a finalizer
        if _simulated(exc):  # evidence of a simulated run (the sync audit's copies): nothing to read
            log.debug("tmpatch: the deferred reports of a simulated %s are not read", type(holder(book)).__name__)
        else:
            log.warning("tmpatch: could not read the pending deferred reports of %s (%s: %s)",
                        type(holder(book)).__name__, type(exc).__name__, exc)
        return
    metric = holder(book)
    with _told() as told:
        deliver(metric, [(metric, tally, bool(synced)) for tally in tallies if tally], where)
    for error, text in told:
        tell(error, text)


def _drop(book: Book) -> None:
    book.pending, book.steps, book.counts, book.synced, book.flight = [], [], {}, None, None
    book.pinned = book.noted = 0
    book.marked = book.traced_marked


def adopt() -> None:
    """Report the books of metrics collected while no read could be made, if one can be now."""
    for book in list(WATCH.orphans):
        if _unreadable_now(book):
            continue
        WATCH.orphans.remove(book)
        detached(book, "the garbage collection of the metric")


def _simulated(exc: BaseException) -> bool:
    """Whether ``exc`` is a read of a simulated tensor (torch's fake tensors have no values)."""
    fake = sys.modules.get("torch._subclasses.fake_tensor")
    kinds = tuple(getattr(fake, name) for name in ("DataDependentOutputException", "UnsupportedFakeTensorException")
                  if hasattr(fake, name)) if fake is not None else ()
    return bool(kinds) and isinstance(exc, kinds)


@contextlib.contextmanager
def _told() -> Any:
    """Collect what reporters say (their warnings; the error they raise) as ``(error, text)``."""
    caught: List[Tuple[bool, str]] = []
    with warnings.catch_warnings(record=True) as seen:
        try:
            yield caught
        except Exception as exc:  # noqa: BLE001 - the report, which nothing can raise here
            caught.append((True, f"{type(exc).__name__}: {exc}"))
    caught[:0] = [(False, f"{w.category.__name__}: {w.message}") for w in seen]


def _reaches_stderr(level: int) -> bool:
    """Whether a record of ``level`` on the tmpatch logger is written to stderr by logging."""
    if log.disabled or not log.isEnabledFor(level):
        return False
    handled = False
    logger: Optional[logging.Logger] = log
    while logger is not None:
        for handler in logger.handlers:
            handled = True
            if (level >= handler.level and isinstance(handler, logging.StreamHandler)
                    and getattr(handler, "stream", None) in (sys.stderr, sys.__stderr__)):
                return True
        logger = logger.parent if logger.propagate else None
    last = logging.lastResort
    return not handled and last is not None and level >= last.level


def tell(error: bool, text: str) -> None:
    """Log a report no call can raise (an error or a warning) and make sure it reaches stderr."""
    level = logging.ERROR if error else logging.WARNING
    log.log(level, "%s", text)
    if not _reaches_stderr(level):
        try:
            sys.stderr.write(f"tmpatch: {text}\n")
            sys.stderr.flush()
        except Exception:  # noqa: BLE001 - no stderr (closed at exit)
            pass


def collected(key: int, ref: "weakref.ref[Book]") -> None:
    """A metric with a book was garbage-collected: forget its book, reporting what it held."""
    book = ref()
    if book is None:
        return
    if _books.get(key) is book:
        del _books[key]
    WATCH.drop(book)
    if holds(book):
        detached(book, "the garbage collection of the metric")


def _exit(where: Optional[str] = None) -> None:
    """Report what every book holds (the process ends); each book once."""
    where = where or f"the exit of process {os.getpid()}"
    books = list(_books.values()) + WATCH.orphans
    del WATCH.orphans[:]
    for book in books:
        if holds(book):
            detached(book, where)


class _Armed:
    """Per process: the exit hooks are in place (``pid``); per interpreter: ``atexit`` and the
    multiprocessing after-fork hook are registered (both inherited by forked children).
    ``mp_util``: ``multiprocessing.util``. An instance: ``multiprocessing`` keeps an after-fork
    hook while the object it is registered for lives."""

    __slots__ = ("pid", "mp_util", "__weakref__")

    def __init__(self) -> None:
        self.pid: Optional[int] = None
        self.mp_util: Any = None


_ARMED = _Armed()


def _child_exit() -> None:
    _exit(f"the end of process {os.getpid()}")


def _finalizer(armed_state: _Armed) -> None:
    """The hook a ``multiprocessing`` process's exit runs before ``os._exit`` (its finalizers;
    the process's start clears them, then runs the after-fork hooks: registered again there)."""
    armed_state.mp_util.Finalize(None, _child_exit, exitpriority=100)
    armed_state.pid = os.getpid()


def armed() -> None:
    """Put the exit hooks in place in this process (cheap once done): ``atexit``, and the
    finalizer a ``multiprocessing`` child's exit runs (again in each child it starts)."""
    if _ARMED.pid == os.getpid():
        return
    with LOCK:
        if _ARMED.pid == os.getpid():
            return
        if _ARMED.mp_util is None:
            # a metric is being built: torch, which loads multiprocessing, is imported already
            import multiprocessing.util as mp_util

            _ARMED.mp_util = mp_util
            atexit.register(_exit)
            mp_util.register_after_fork(_ARMED, _finalizer)
        _finalizer(_ARMED)


def _forked() -> None:
    """In a forked child: every book starts empty (the parent reports what it had)."""
    reinit = getattr(LOCK, "_at_fork_reinit", None)
    if reinit is not None:
        reinit()  # a thread of the parent may have held it
    for book in list(_books.values()):
        book.pending, book.steps, book.counts, book.synced, book.flight = [], [], {}, None, None
        book.pinned = book.noted = 0
        if book.traced_marked:
            for value in book.traced.values():
                if value.device.type == "cpu":
                    value.zero_()
        book.marked = book.traced_marked = False
    WATCH.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)



__all__ = ["Ghost", "adopt", "armed", "collected", "detached", "ghost", "holder", "tell"]
