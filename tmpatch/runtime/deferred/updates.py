"""The report that comes without a ``compute()``: after the user's ``update()`` or
``forward()`` (:func:`after_update`, called at the end of the release's ``wrapped_func`` and of
``forward()`` while some book has something due: :data:`landing.WATCH`; an update that only
notes evidence on a GPU calls nothing).

* Evidence in host memory (a CPU metric) is read at once (no sync involved) and reported from
  that same call, its batch already in the states.
* Evidence on a CUDA device leaves for the host every :data:`landing.LANDING` entries, without a
  sync (:mod:`landing`); the first call after its copy has landed reads it and reports, naming
  the update the first occurrence came from. A report comes at most ``LANDING`` counting updates
  after the first one it concerns, plus the updates the host runs ahead of the device (in a step
  paced by the host: about one).
* Evidence on other devices, or left by compiled code, waits for a settle point.

The report is the release's error, raised from this call, or its warning, as at a settle point
(``giving.deliver``); a report given here is not given again anywhere.
"""
from __future__ import annotations

from typing import Any, List, Optional, Tuple

from tmpatch.runtime.compiled import inline_only
from tmpatch.runtime.deferred import landing
from tmpatch.runtime.deferred.books import LOCK, Book, _books, _internal, book_of, is_live
from tmpatch.runtime.deferred.endings import adopt, holder
from tmpatch.runtime.deferred.giving import Tally, deliver, metrics_in
from tmpatch.runtime.deferred.landing import FLYING, WATCH, decode, device_of, launch, on_host, read, reduced, take


def due(book: Book) -> bool:
    """Whether the next update must look at ``book``: its evidence is in host memory (read at
    once), enough has been noted to send it, or a flight is in the air."""
    return book.flight is not None or (book.noted >= landing.LANDING) or \
        bool(book.at_once and (book.pending or book.counts))


def restamp(books: List[Tuple[Book, int]], step: Optional[int]) -> None:
    """After a ``forward()`` (or a wrapper's call): the entries its updates noted (after each
    book's ``len(steps)`` before it) belong to the user's call ``step`` (inside, torchmetrics
    resets the count)."""
    with LOCK:
        for book, start in books:
            steps = book.steps
            for index in range(start, len(steps)):
                steps[index] = step


def marks(metric: Any) -> List[Tuple[Book, int]]:
    """The books of ``metric`` and of the metrics inside it, with how many entries they hold (for
    :func:`restamp`); empty for a metric without one (one lookup)."""
    if not metric.__dict__.get("_modules"):
        book = _books.get(id(metric))
        return [] if book is None or book.ref() is not metric else [(book, len(book.steps))]
    return [(book, len(book.steps)) for book in (book_of(inner) for inner in metrics_in(metric)) if book is not None]


def _visit(book: Book, step: Optional[int], found: List[Tuple[Book, Tally]]) -> None:
    """One book after an update: take a landed flight, read host evidence at once, launch device
    evidence that is due (the caller holds :data:`LOCK`)."""
    flight = book.flight
    if flight is not None:
        tally = flight.landed()
        if tally is not None:
            book.flight = None
            if tally:
                found.append((book, tally))
    if book.pending or book.counts:
        device = device_of(book)
        book.at_once = device is None or on_host(book)
        if book.at_once:
            parts = take(book)
            tally = decode([(k, s, st) for k, s, st, _ in parts], read(reduced(parts)))
            if tally:
                found.append((book, tally))
        elif book.flight is None and book.noted >= landing.LANDING and device.type in FLYING:
            launch(book)
    if not due(book):
        WATCH.drop(book)


# no frame of dynamo's own when eager code of a compiled step calls it (inline_only): it would guard on the
# orphans' count, which a metric collected while dynamo traces changes (a recompile at the next step)
@inline_only
def after_update(metric: Any, call: str = "update()") -> None:
    """After the user's ``update()`` (``call``: or ``forward()``) of ``metric``, while some book has
    something due: report what has reached the host of its books (and of the metrics inside it),
    send what is due. Raises the release's error, or warns, from this call. Nothing inside
    torchmetrics' own calls, nor once the patch is reverted."""
    if _internal.get() or not is_live():  # torchmetrics' own call, or the patch is reverted
        return
    if WATCH.orphans:  # books of metrics collected at a moment no read could be made
        adopt()
    namespace = metric.__dict__
    if namespace.get("_modules"):
        books = [book for book in (book_of(inner) for inner in metrics_in(metric))
                 if book is not None and book in WATCH.books]
    else:
        book = _books.get(id(metric))
        if book is None or book not in WATCH.books or book.ref() is not metric:
            return
        books = [book]
    if not books:
        return
    step = namespace.get("_update_count") or None  # names the update (Running.forward leaves its own at 0)
    found: List[Tuple[Book, Tally]] = []
    with LOCK:
        for book in books:
            _visit(book, step, found)
    if found:
        deliver(metric, [(holder(book), tally, False) for book, tally in found],
                call if step is None else f"{call} #{step}", step)


__all__ = ["after_update", "due", "marks", "restamp"]
