"""The books at a settle point: those of a metric and of the metrics inside it, read in
one device read (none for evidence that has reached the host), each record's reporter called
once, then cleared (:func:`settle`); the forward and reset steps around it (:func:`count_once`,
:func:`start_compute`, :func:`clear`); and what a settle point needs to know: whether
anything is pending (:func:`pending`), and which metric holds the one it was called on
(:func:`enclosing`).

A settle point is where a metric's data leaves it or is dropped: the user's ``compute()``,
``state_dict()``, pickling or copying, ``merge_state()`` (into or out of), ``sync()``,
``reset()``. The ``deferred_reports`` patch settles there, so that no copy of a state
carries data whose report was never given.
"""
from __future__ import annotations

import sys
from types import FrameType
from typing import Any, Dict, List, Optional, Sequence, Tuple

from tmpatch.runtime.deferred.books import LOCK, Book, book_of, gather, log
from tmpatch.runtime.deferred.giving import Tally, deliver, metrics_in
from tmpatch.runtime.deferred.landing import Flight, decode, gather_traced, holds, read, reduced, take


def books_in(metric: Any) -> List[Book]:
    """The books of ``metric`` and of the metrics inside it (compiled updates' counts gathered)."""
    books = [book for book in (book_of(m) for m in metrics_in(metric)) if book is not None]
    for book in books:
        gather(book)
    return books


def count_once(book: Book, before: Dict[str, Any]) -> None:
    """After a forward that ran ``update()`` twice on the same batch: keep half of what
    the two added (rounded up), as if the batch was seen once."""
    gather(book)
    for key, now in list(book.counts.items()):
        old = before.get(key)
        if old is None:
            book.counts[key] = (now + 1) // 2
        elif now is not old:
            book.counts[key] = old + (now - old + 1) // 2


def _lone(metric: Any) -> Any:
    """The book of a metric with no module inside it (most metrics: the whole of what
    :func:`start_compute` and :func:`settle` look at), or None (no book, or inner metrics)."""
    return None if getattr(metric, "_modules", None) else book_of(metric)


def start_compute(metric: Any) -> None:
    """Before the user's compute: forget totals of an earlier sync (a forward's)."""
    book = _lone(metric)
    if book is not None:  # most metrics: one book, no walk through modules
        book.synced = None
        return
    for inner in metrics_in(metric):
        book = book_of(inner)
        if book is not None:
            book.synced = None


def clear(metric: Any) -> None:
    """Forget what the books of ``metric`` and of the metrics inside it hold."""
    for inner in metrics_in(metric):
        book = book_of(inner)
        if book is not None:
            with LOCK:
                gather(book)
                book.counts, book.synced, book.stamp, book.flight = {}, None, None, None


def pending(metric: Any) -> bool:
    """Whether the books of ``metric`` (and of the metrics inside it) hold anything (no read)."""
    with LOCK:  # not between another thread's unmarking of a book and its fold
        book = _lone(metric)
        if book is not None:
            return holds(book)
        return any(holds(book) for book in books_in(metric))


def _torchmetrics(obj: Any) -> bool:
    """Whether ``obj`` is a module of a torchmetrics class (a Metric, a MetricCollection, a
    MetricTracker, or a subclass of one)."""
    return hasattr(obj, "modules") and any(
        getattr(cls, "__module__", "").startswith("torchmetrics.") for cls in type(obj).__mro__)


#: modules whose frames a chain of calls from a holder down to its member may pass through
#: (torchmetrics', tmpatch's layers, torch's ``Module.state_dict``, ``copy.deepcopy``)
_PASSING = ("torchmetrics.", "tmpatch.", "torch.")
_PASSING_EXACT = frozenset({"copy", "copyreg"})


def enclosing(metric: Any, names: Sequence[str]) -> Any:
    """The outermost torchmetrics module holding ``metric`` whose method named in ``names`` is
    running in this thread (``MetricCollection.reset`` resetting its members, one by one), or
    ``metric``: the settle point's report covers it at once, before its first member goes.
    The walk up the stack stops at the first frame that is neither such a method nor code of
    torchmetrics, tmpatch, torch or ``copy`` (the user's code: a few frames up)."""
    top = metric
    frame: Optional[FrameType] = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name in names:
            holder = frame.f_locals.get("self")
            if holder is not None and holder is not top and _torchmetrics(holder) and (
                    any(inner is metric for inner in holder.modules())):
                top = holder
                frame = frame.f_back
                continue
        module = frame.f_globals.get("__name__")
        if module is not None and module not in _PASSING_EXACT and not module.startswith(_PASSING):
            break
        frame = frame.f_back
    return top


def settle(metric: Any, where: str = "compute()") -> None:
    """Report what the books of ``metric`` (and the metrics inside it) hold, then clear
    them: one device read for all of them (none for evidence that has reached the host).
    Called after the user's ``compute()``, and at the other settle points (``where`` names
    the point for the reporters: :func:`tmpatch.runtime.deferred.giving.point`)."""
    taken: List[Tuple[Any, Any, Optional[Flight], bool]] = []  # (metric, parts, flight, all ranks)
    with LOCK:  # what the books hold is taken whole: no fold from another thread in between
        book = _lone(metric)
        if book is not None and not holds(book):
            return  # most computes: one empty book, nothing to read (nor being folded: the lock)
        for inner in metrics_in(metric):
            book = book_of(inner)
            if book is None:
                continue
            gather_traced(book)
            if not holds(book):
                continue
            if book.stamp is not None and getattr(inner, "_update_count", 0) < book.stamp:
                _empty(book)  # reset after revert(): nothing to report
                continue
            if book.synced is not None:  # totals over the ranks: they cover what this rank holds
                parts = [(key, 1, [None], value.reshape(1)) for key, value in book.synced.items()]
                taken.append((inner, parts, None, True))
                _empty(book)
                continue
            flight, book.flight, book.stamp = book.flight, None, None
            taken.append((inner, take(book), flight, False))  # emptied first: a raise leaves nothing
    if not taken:
        return
    landed: List[Optional[Tally]] = [None if flight is None else flight.landed() for _, _, flight, _ in taken]
    values: List[Any] = []
    for (_, parts, flight, _), tally in zip(taken, landed):
        values.extend(reduced(parts))
        if flight is not None and tally is None:
            values.extend(flight.device_values())
    try:
        numbers = iter(read(values))  # the one device read
    except Exception:  # noqa: BLE001 - never let bookkeeping break the user's compute
        log.exception("tmpatch: could not read the deferred reports of %s", type(metric).__name__)
        return
    found: List[Tuple[Any, Tally, bool]] = []
    for (inner, parts, flight, all_ranks), tally in zip(taken, landed):
        layout = [(key, sign, steps) for key, sign, steps, _ in parts]
        counted = [decode(layout, [next(numbers) for _ in parts])]
        if flight is not None:
            counted.append(tally if tally is not None else flight.tally([next(numbers) for _ in flight.dev]))
        for each in counted:
            if each:
                found.append((inner, each, all_ranks))
    if found:
        deliver(metric, found, where)


def _empty(book: Book) -> None:
    book.pending, book.steps, book.pinned, book.noted = [], [], 0, 0
    book.marked = book.traced_marked
    book.counts, book.synced, book.stamp, book.flight = {}, None, None, None
