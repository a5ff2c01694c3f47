"""A metric's book opened (with the hooks that report when it goes) and the Record a patch notes
its evidence with: each note tells the watch of updates (``landing.py``) when the evidence can be
read on the host."""
from __future__ import annotations

import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple

from tmpatch.runtime.compiled import compiling
from tmpatch.runtime.deferred import books, landing
from tmpatch.runtime.deferred.books import (
    _EMPTY,
    LOCK,
    SUM,
    Book,
    Kind,
    _books,
    _records,
    book_of,
    gather,
    traced_book,
)
from tmpatch.runtime.deferred.endings import armed, collected, ghost
from tmpatch.runtime.deferred.landing import WATCH, recall


def open_book(metric: Any) -> Book:
    """Give ``metric`` a book (idempotent); it goes with the metric."""
    book = book_of(metric)
    if book is None:
        book = _books[id(metric)] = Book(metric)
        # atexit=False: at exit a live metric's report is given by landing's exit hook, which names the exit
        weakref.finalize(metric, collected, id(metric), weakref.ref(book)).atexit = False
        device = getattr(metric, "device", None)
        if device is not None:
            import torch

            book.traced = {key: torch.zeros((), dtype=torch.long, device=device) for key in _records}
        armed()
    return book


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
        """Add ``amount`` (a device tensor, integer or bool, that the caller made and nothing
        changes afterwards) to the metric's count without reading it: kept as it is until
        the book is gathered. False (nothing added) when the metric has no book."""
        return self.note(metric, amount, SUM)

    def note(self, metric: Any, evidence: Any, kind: "Kind", sign: int = 1) -> bool:
        """Count ``kind`` in ``evidence`` (``SUM``: its sum; ``ANY``: 1 if any element is
        true; ``outside(low, high)``: its elements outside ``[low, high)``; ``FALSE``: its
        false elements), times ``sign`` (+1 or -1), into the metric's count, later: the
        tensor is kept, not read, so the caller must have made it and never change it. In
        compiled code the count is taken at once (a traced add). False (nothing noted)
        when the metric has no book."""
        if compiling():
            book = traced_book(metric)
            if book is None:
                return False
            amount = books._reduce(kind, [evidence])
            old = book.traced.get(self.key)
            if old is not None:  # the same entry at every step: nothing for torch.compile to recompile
                # in place: the book's dict is not rebuilt after the graph, nor guarded whole, and the
                # entry keeps its address (a CUDA graph captures the add)
                if sign > 0:
                    old.add_(amount)
                else:
                    old.sub_(amount)
                book.marked = book.traced_marked = True
                return True
            counts = book.counts
            old = counts.get(self.key)
            counts[self.key] = (amount if sign > 0 else -amount) if old is None else \
                (old + amount if sign > 0 else old - amount)
            return True
        book = _books.get(id(metric))
        if book is None:
            return False
        with LOCK:
            book.pending.append((self.key, evidence, kind, sign))
            # the update it came from (a forward()'s are stamped again after it: updates.restamp)
            book.steps.append(getattr(metric, "__dict__", _EMPTY).get("_update_count") or None)
            book.marked = True
            book.noted += 1
            if book.ghost is None:
                book.ghost = ghost(metric)
            if type(evidence) is not int:
                book.pinned += evidence.numel() * evidence.element_size()
                book.at_once = landing.read_at_once(evidence)
            else:
                book.at_once = True  # a count on the host already
            if (book.at_once or book.noted >= landing.LANDING) and book not in WATCH.books:
                WATCH.watch(book)  # the next update looks at it
            if len(book.pending) >= books.PENDING_ENTRIES or book.pinned >= books.PENDING_BYTES:
                books._fold(book)
        return True


def local_records(metric: Any) -> Dict[str, Any]:
    """This metric's own pending counts (not those of metrics inside it): key -> 0-d
    integer tensor on the metric's device; empty when none."""
    book = book_of(metric)
    if book is None:
        return {}
    gather(book)
    recall(book)  # evidence on its way to the host counts here too: the sync sums it over the ranks
    return dict(book.counts)


def set_synced(metric: Any, totals: Dict[str, Any]) -> None:
    """The counts summed over the ranks of the sync that is running; the next report of
    ``metric`` uses them (cleared with the counts)."""
    book = book_of(metric)
    if book is not None:
        book.synced = dict(totals)
