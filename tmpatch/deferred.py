"""Deferred reports: a condition a patch sees during ``update()`` (NaN values, values out
of range) is counted on the device and reported at the user's next ``compute()``.

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
* ``reset()`` by the user clears them; a reset torchmetrics makes inside ``forward()``
  or a wrapper's ``update()`` does not;
* an exception anywhere leaves them as they are, to be reported at the next
  ``compute()``; ``revert()`` keeps them too (:func:`detach`).

Each rank reports what it saw. The coalesced-sync patch, when it syncs a metric, sums
the books over ranks in the same buffers as the states (:func:`local_records`,
:func:`set_synced`); the report then covers every rank.
"""
from __future__ import annotations

import contextvars
import logging
import sys
import weakref
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from tmpatch.compiled import compiling

log = logging.getLogger("tmpatch")

#: attribute set on the tensor a book is read from, so that the sync audit, which cannot
#: know device values, reads it as 0 ("nothing to report") instead of its usual guess
AUDIT_TAG = "_tmpatch_record"

#: > 0 while torchmetrics runs a metric's compute/reset for itself (inside forward(),
#: another compute(), a wrapper's update()): no report, no clearing
_internal: "contextvars.ContextVar[int]" = contextvars.ContextVar("tmpatch_internal", default=0)

#: whether the deferred_reports patch is in effect (its forward/reset layers are in place)
_live = False

#: record key -> the Record (its reporter)
_records: Dict[str, "Record"] = {}


class Book:
    """The pending counts of one metric: record key -> 0-d integer tensor on its device.

    Compiled updates add to ``traced`` instead: a 0-d zero per record, made with the book
    on the metric's device (and moved with it), so that a compiled step finds the same
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
        book.counts[key] = value if old is None else old + value
        book.traced[key] = value.new_zeros(())


def _forget(key: int, book: "weakref.ref[Book]") -> None:
    if _books.get(key) is book():
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
    return _internal.get() > 0


class scope:
    """``with scope():`` marks torchmetrics' own calls (no report, no clearing) inside."""

    __slots__ = ("_token",)

    def __enter__(self) -> None:
        self._token = _internal.set(_internal.get() + 1)

    def __exit__(self, *exc: Any) -> None:
        _internal.reset(self._token)


Reporter = Callable[[Any, List[Tuple[Any, int]], bool], None]


class Record:
    """One kind of deferred report (``nan``, ``bincount``): counts added during updates,
    reported by ``reporter(top, [(metric, count), ...], all_ranks)`` at compute, where
    ``top`` is the metric the user computed and the pairs are the metrics (``top`` or
    metrics inside it) whose count is not zero; ``all_ranks``: the counts are sums over
    the ranks of a coalesced sync."""

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
                book.traced[self.key] = old + amount
                book.marked = True
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


def _metrics_in(metric: Any) -> Iterator[Any]:
    """``metric`` and the metrics inside it (wrappers' base metrics, compositions' operands)."""
    if not getattr(metric, "_modules", None):
        yield metric
        return
    seen = set()
    for module in metric.modules():
        if id(module) not in seen and id(module) in _books:
            seen.add(id(module))
            yield module


def books_in(metric: Any) -> List[Book]:
    """The books of ``metric`` and of the metrics inside it (compiled updates' counts gathered)."""
    books = [book for book in (book_of(m) for m in _metrics_in(metric)) if book is not None]
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


def start_compute(metric: Any) -> None:
    """Before the user's compute: forget totals of an earlier sync (a forward's)."""
    for book in books_in(metric):
        book.synced = None


def clear(metric: Any) -> None:
    """Forget what the books of ``metric`` and of the metrics inside it hold."""
    for inner in _metrics_in(metric):
        book = book_of(inner)
        if book is not None:
            gather(book)
            book.counts, book.synced, book.stamp = {}, None, None


def settle(metric: Any) -> None:
    """Report what the books of ``metric`` (and the metrics inside it) hold, then clear
    them: one device read for all of them. Called after the user's ``compute()``."""
    pending: List[Tuple[Any, Book]] = []
    for inner in _metrics_in(metric):
        book = book_of(inner)
        if book is None:
            continue
        gather(book)
        if not (book.counts or book.synced):
            continue
        if book.stamp is not None and getattr(inner, "_update_count", 0) < book.stamp:
            book.counts, book.synced, book.stamp = {}, None, None  # reset after revert(): nothing to report
            continue
        pending.append((inner, book))
    if not pending:
        return
    import torch

    keys: List[Tuple[Any, str, bool]] = []
    values: List[Any] = []
    for inner, book in pending:
        source = book.synced if book.synced is not None else book.counts
        for key, value in source.items():
            keys.append((inner, key, book.synced is not None))
            values.append(value)
        book.counts, book.synced, book.stamp = {}, None, None  # cleared first: a raise leaves nothing
    try:
        devices = {v.device for v in values}
        if len(devices) == 1:
            total = torch.stack([v.long() for v in values])
            setattr(total, AUDIT_TAG, True)
            read = total.tolist()  # the one device read
        else:
            read = []
            for v in values:
                setattr(v, AUDIT_TAG, True)
                read.append(int(v))
    except Exception:  # noqa: BLE001 - never let bookkeeping break the user's compute
        log.exception("tmpatch: could not read the deferred reports of %s", type(metric).__name__)
        return
    by_key: Dict[str, List[Tuple[Any, int]]] = {}
    all_ranks: Dict[str, bool] = {}
    for (inner, key, synced), count in zip(keys, read):
        if count:
            by_key.setdefault(key, []).append((inner, int(count)))
            all_ranks[key] = all_ranks.get(key, True) and synced
    errors: List[BaseException] = []
    for key, found in by_key.items():
        record = _records.get(key)
        if record is None:
            continue
        try:
            record.reporter(metric, found, all_ranks[key])
        except Exception as exc:  # noqa: BLE001 - an error report: raised after the warnings
            errors.append(exc)
    if len(errors) > 1 and len(errors[0].args) == 1 and isinstance(errors[0].args[0], str):
        # one raise per compute: the others ride in its message, not lost
        errors[0].args = ("\n".join([errors[0].args[0]] + [f"Also: {exc}" for exc in errors[1:]]),)
    if errors:
        raise errors[0]


def detach(metric: Any, book: Book) -> None:
    """At ``revert()``: keep a pending report of ``metric`` for its next ``compute()`` (its
    compute layer stays with it), and recognise a later ``reset()``, whose hook is gone, by
    the update count, which ``reset()`` sets to 0 and every update raises: the count is
    checked at the next compute and, through a watch on the metric's own ``update``
    attribute (never pickled or copied by torchmetrics), before each update until the
    report is given."""
    book.stamp = getattr(metric, "_update_count", 0)
    states = getattr(metric, "__dict__", {})
    inner = states.get("update")
    if inner is None or getattr(inner, "_tmpatch_watch", False):
        return

    def update(*args: Any, **kwargs: Any) -> Any:
        current = book_of(metric)
        if current is None or current.stamp is None or not (current.counts or current.synced):
            states["update"] = inner  # nothing left to watch
            return inner(*args, **kwargs)
        count = getattr(metric, "_update_count", 0)
        step = forward_step(1)
        if step is not None:  # forward's own reset: the count it saved (and restores) is the user's
            saved = step.f_locals.get("_update_count")
            count = saved if isinstance(saved, int) else current.stamp
        if count < current.stamp:
            current.counts, current.synced, current.stamp = {}, None, None  # reset() since revert()
            states["update"] = inner
        else:
            current.stamp = count
        return inner(*args, **kwargs)

    update._tmpatch_watch = True  # type: ignore[attr-defined]
    update.__wrapped__ = inner  # type: ignore[attr-defined]
    states["update"] = update


#: the steps of torchmetrics' ``Metric.forward`` that reset, update and compute the metric for
#: themselves (every release); ``_update_count`` is their local copy of the count they restore
_FORWARD_STEPS = frozenset({"_forward_full_state_update", "_forward_reduce_state_update"})


def forward_step(depth: int) -> Optional[Any]:
    """The frame ``depth`` levels up when it is a step of torchmetrics' ``forward()``, else
    None. Used after ``revert()``, when the forward layer is gone; forward's flags are not
    read (a forward that raised leaves ``_should_unsync`` False)."""
    try:
        frame = sys._getframe(depth + 1)
    except ValueError:
        return None
    return frame if frame.f_code.co_name in _FORWARD_STEPS else None


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
