"""Deferred reports: a condition a patch sees during ``update()`` (NaN values, values out
of range) is counted on the device and reported at the user's next ``compute()``, or at
the first other point where the metric's data leaves it or is dropped.

A check such as ``if torch.isnan(x).any(): warn(...)`` in ``update()`` reads a device
value on every step. A patch calls :meth:`Record.add` instead: the count stays on the
device, in a *book* that tmpatch keeps for the metric, outside the metric itself. It is
no metric state: nothing of it is in ``state_dict()``, ``metric_state``,
``merge_state``, pickles, copies or DDP collectives, and torchmetrics never sees it.

The book's rules (the ``deferred_reports`` patch puts them in place):

* a metric gets a book when it is built while the patch is applied (so do its clones
  and unpickled copies, which start with nothing pending); a metric without one
  reports at once, as the release does (:meth:`Record.deferred` is False);
* the user's ``compute()`` reports what the books of the metric and of the metrics
  inside it (wrappers, compositions) hold, once, after the release's compute and its
  sync have finished on every rank, and clears them; a ``compute()`` made inside
  ``forward()``, inside another metric's ``compute()`` or inside a wrapper's
  ``update()`` reports nothing (:func:`internal`);
* the other settle points report them the same way, once, before the data goes: the
  user's ``reset()``, ``state_dict()`` (when a metric state is persistent), pickling or
  copying, ``merge_state()`` (the books of both metrics) and, after it, ``sync()``
  (:func:`point` names the point for the reporter); a reset torchmetrics makes inside
  ``forward()`` or a wrapper's ``update()`` reports nothing and keeps them;
* an exception anywhere leaves them as they are, to be reported at the next settle
  point; ``revert()`` keeps them for the next ``compute()``, whose layer stays with the
  metric (:func:`detach`; the other settle points' layers are gone then).

Each rank reports what it saw. The coalesced-sync patch, when it syncs a metric, sums
the books over ranks in the same buffers as the states (:func:`local_records`,
:func:`set_synced`); the report then covers every rank.

Here: books and records; ``settling.py``: the report at a settle point and the
forward/reset steps around it; ``revert.py``: pending reports across ``revert()``.
"""
from __future__ import annotations

import logging
import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple

from tmpatch.compiled import ContextSlot, compiling

log = logging.getLogger("tmpatch")

#: attribute set on the tensor a book is read from, so that the sync audit, which cannot
#: know device values, reads it as 0 ("nothing to report") instead of its usual guess
AUDIT_TAG = "_tmpatch_record"

#: > 0 while torchmetrics runs a metric's compute/reset for itself (inside forward(),
#: another compute(), a wrapper's update()): no report, no clearing
#: how deep torchmetrics' own calls are nested (None: not at all); a slot compiled code can set too
_internal = ContextSlot("tmpatch_internal")

#: whether the deferred_reports patch is in effect (its forward/reset layers are in place)
_live = False

#: record key -> the Record (its reporter)
_records: Dict[str, "Record"] = {}


class Book:
    """The pending counts of one metric: record key -> 0-d integer tensor on its device.

    Compiled updates add to ``traced`` instead, in place: a 0-d zero per record, made with the
    book on the metric's device (and moved with it), so that a compiled step finds the same
    entries at every step (a count appearing, or changing device, would recompile it);
    ``marked`` says they hold something. :func:`gather` folds them into ``counts``."""

    __slots__ = ("ref", "counts", "synced", "stamp", "traced", "marked", "__weakref__")

    def __init__(self, metric: Any) -> None:
        self.ref = weakref.ref(metric)
        self.counts: Dict[str, Any] = {}
        self.synced: Optional[Dict[str, Any]] = None  # totals over ranks, from a coalesced sync
        self.stamp: Optional[int] = None  # the update count at revert() (see detach)
        self.traced: Dict[str, Any] = {}
        self.marked = False


#: id(metric) -> its book (metrics built while deferred_reports is applied)
_books: Dict[int, Book] = {}


#: attribute of the settling ``compute`` the patch puts on a metric (an instance attribute
#: torchmetrics leaves out of pickles and copies) that holds the metric's book
BOOK_ATTRIBUTE = "_tmpatch_book"


def book_of(metric: Any) -> Optional[Book]:
    """The metric's book, or None (built before ``apply()``: reports at once)."""
    book = _books.get(id(metric))
    return book if book is not None and book.ref() is metric else None


def traced_book(metric: Any) -> Optional[Book]:
    """The metric's book as compiled code finds it: through the metric's own ``compute``
    (a lookup in the id-keyed table is a guard on the whole table for torch.compile)."""
    namespace = getattr(metric, "__dict__", None)
    compute = namespace.get("compute") if namespace is not None else None
    return getattr(compute, BOOK_ATTRIBUTE, None)


def attach(compute: Any, book: Book) -> None:
    """Make ``book`` reachable from the metric's settling ``compute`` (:func:`traced_book`)."""
    setattr(compute, BOOK_ATTRIBUTE, book)


def open_book(metric: Any) -> Book:
    """Give ``metric`` a book (idempotent); it goes with the metric."""
    book = book_of(metric)
    if book is None:
        book = _books[id(metric)] = Book(metric)
        weakref.finalize(metric, _forget, id(metric), weakref.ref(book))
        device = getattr(metric, "device", None)
        if device is not None:
            import torch

            book.traced = {key: torch.zeros((), dtype=torch.long, device=device) for key in _records}
    return book


def moved(metric: Any, fn: Optional[Callable[[Any], Any]] = None) -> None:
    """After ``metric._apply(fn)`` (``.to()``, ``.cuda()``, ...): its traced counts go where its
    states went, through the same ``fn`` (no copy of our own: a simulated device stays one)."""
    book = book_of(metric)
    if book is None or not book.traced:
        return
    if fn is not None:
        book.traced = {key: fn(value) for key, value in book.traced.items()}
        return
    device = getattr(metric, "device", None)
    if device is not None:
        book.traced = {key: value.to(device) for key, value in book.traced.items()}


def gather(book: Book) -> None:
    """Fold what compiled updates added (``traced``) into the book's counts."""
    if not book.marked:
        return
    book.marked = False
    for key, value in list(book.traced.items()):
        old = book.counts.get(key)
        book.counts[key] = value.clone() if old is None else old + value
        value.zero_()  # the entry keeps its address (a static input of a captured CUDA graph)


def mirror(original: Any, twin: Any) -> Optional[Tuple[Book, Book]]:
    """Make ``twin`` (a copy of ``original``, e.g. the one an audit runs) have a book exactly
    when ``original`` has one: a copy made while the patch is applied gets one, which a
    metric built before ``apply()`` does not have. Returns ``(original's, twin's)`` books
    when both have one (a function of the original holding its book must hold the twin's)."""
    mine = book_of(original)
    if mine is None:
        if book_of(twin) is not None:
            del _books[id(twin)]
        return None
    return mine, open_book(twin)


def _forget(key: int, book: "weakref.ref[Book]") -> None:
    held = book()
    if held is not None and _books.get(key) is held:
        del _books[key]


def is_live() -> bool:
    """Whether the deferred_reports patch is applied (its forward and reset layers are in place)."""
    return _live


def went_live() -> None:
    """The deferred_reports patch is applied."""
    global _live
    _live = True


def went_dormant() -> None:
    """The deferred_reports patch is reverted: keep every pending report (:func:`detach`)."""
    global _live
    _live = False
    for metric, book in pending_books():
        detach(metric, book)


def internal() -> bool:
    """Whether torchmetrics itself is calling (inside forward(), a compute(), a wrapper's update())."""
    return bool(_internal.get())


class scope:
    """``with scope():`` marks torchmetrics' own calls (no report, no clearing) inside."""

    __slots__ = ("_token",)

    def __enter__(self) -> None:
        self._token = _internal.set((_internal.get() or 0) + 1)

    def __exit__(self, *exc: Any) -> None:
        _internal.reset(self._token)


Reporter = Callable[[Any, List[Tuple[Any, int]], bool], None]


class Record:
    """One kind of deferred report (``nan``, ``bincount``): counts added during updates,
    reported by ``reporter(top, [(metric, count), ...], all_ranks)`` at compute (or another
    settle point, which :func:`point` names), where ``top`` is the metric the user computed
    (reset, saved, ...) and the pairs are the metrics (``top`` or metrics inside it) whose
    count is not zero; ``all_ranks``: the counts are sums over the ranks of a coalesced sync."""

    def __init__(self, key: str, reporter: Reporter) -> None:
        self.key = key
        self.reporter = reporter
        _records[key] = self

    def __repr__(self) -> str:
        return f"Record({self.key!r})"

    @staticmethod
    def deferred(metric: Any) -> bool:
        """Whether ``metric`` has a book (reports can wait for compute)."""
        if compiling():
            return traced_book(metric) is not None
        return book_of(metric) is not None

    def add(self, metric: Any, amount: Any) -> bool:
        """Add ``amount`` (a device tensor, integer or bool) to the metric's count without
        reading it. False (nothing added) when the metric has no book."""
        if compiling():
            book = traced_book(metric)
            if book is None:
                return False
            old = book.traced.get(self.key)
            if old is not None:  # the same entry at every step: nothing for torch.compile to recompile
                old.add_(amount)  # in place: the book's dict is not rebuilt after the graph, nor guarded whole,
                book.marked = True  # and the entry keeps its address (a CUDA graph captures the add)
                return True
        else:
            book = _books.get(id(metric))
            if book is None:
                return False
        counts = book.counts
        old = counts.get(self.key)
        counts[self.key] = amount.long() if old is None else old + amount
        return True


def local_records(metric: Any) -> Dict[str, Any]:
    """This metric's own pending counts (not those of metrics inside it): key -> 0-d
    integer tensor on the metric's device; empty when none."""
    book = book_of(metric)
    if book is None:
        return {}
    gather(book)
    return dict(book.counts)


def set_synced(metric: Any, totals: Dict[str, Any]) -> None:
    """The counts summed over the ranks of the sync that is running; the next report of
    ``metric`` uses them (cleared with the counts)."""
    book = book_of(metric)
    if book is not None:
        book.synced = dict(totals)


def pending_books() -> List[Tuple[Any, Book]]:
    """Every live metric with something pending."""
    out = []
    for book in list(_books.values()):
        metric = book.ref()
        if metric is not None:
            gather(book)
        if metric is not None and (book.counts or book.synced):
            out.append((metric, book))
    return out


# the report at compute() and the pending reports across revert(), in modules of their own
from tmpatch.deferred.revert import detach, forward_step  # noqa: E402
from tmpatch.deferred.settling import (  # noqa: E402
    books_in, clear, count_once, enclosing, pending, point, settle, start_compute,
)

__all__ = ["AUDIT_TAG", "BOOK_ATTRIBUTE", "Book", "Record", "attach", "book_of", "books_in", "clear", "count_once",
           "detach", "enclosing", "forward_step", "gather", "internal", "is_live", "local_records", "mirror",
           "moved", "open_book", "pending", "pending_books", "point", "scope", "set_synced", "settle",
           "start_compute", "traced_book", "went_dormant", "went_live"]
