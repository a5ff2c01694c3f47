"""Deferred reports: a condition a patch sees during ``update()`` (NaN values, values out
of range) is counted on the device and reported later, once, without a read of its own:
from a later update once the evidence has reached the host (``updates.py``; on the CPU the
same update), at the user's ``compute()`` or the first other point where the metric's data
leaves it or is dropped (``settling.py``), and at the latest when the metric is collected or
the process ends (``endings.py``).

A check such as ``if torch.isnan(x).any(): warn(...)`` in ``update()`` reads a device
value on every step. A patch calls :meth:`Record.add` or :meth:`Record.note` instead: the
count stays on the device, in a *book* that tmpatch keeps for the metric, outside the
metric itself. It is no metric state: nothing of it is in ``state_dict()``,
``metric_state``, ``merge_state``, pickles, copies or DDP collectives, and torchmetrics
never sees it.

An update launches nothing for its report: the book keeps the tensors the update
already made (a NaN mask, the codes of a count; the caller's own tensors, which nothing
changes afterwards) with what to count in them, and counts them together, a few kernels
for many updates: each one apart when they leave for the host (``landing.py``: every
``LANDING`` entries, or at a settle point), or all together (:func:`gather`) when the book
holds :data:`PENDING_ENTRIES` of them or :data:`PENDING_BYTES`, or a full-state forward
halves its count.

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

Here: books and records; ``giving.py``: a report given (its reporters called once);
``landing.py``: evidence reduced entry by entry and sent to the host without a sync;
``updates.py``: the report after the user's update; ``endings.py``: where no call can
raise it; ``settling.py``: the report at a settle point and the forward/reset steps around
it; ``revert.py``: pending reports across ``revert()``.
"""
from __future__ import annotations

import logging
import threading
import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple

from tmpatch.runtime.compiled import ContextSlot, compiling

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

    Eager updates leave their evidence in ``pending`` (:meth:`Record.note`: tensors and
    what to count in them), ``pinned`` bytes of it. Compiled updates add to ``traced``
    instead, in place: a 0-d zero per record, made with the book on the metric's device (and
    moved with it), so that a compiled step finds the same entries at every step (a count
    appearing, or changing device, would recompile it); ``traced_marked`` says they hold
    something. ``marked``: either holds something. :func:`gather` folds both into
    ``counts``."""

    __slots__ = ("ref", "counts", "synced", "stamp", "traced", "marked", "traced_marked", "pending", "pinned",
                 "steps", "noted", "flight", "ghost", "at_once", "__weakref__")

    def __init__(self, metric: Any) -> None:
        self.ref = weakref.ref(metric)
        self.counts: Dict[str, Any] = {}
        self.synced: Optional[Dict[str, Any]] = None  # totals over ranks, from a coalesced sync
        self.stamp: Optional[int] = None  # the update count at revert() (see detach)
        self.traced: Dict[str, Any] = {}
        self.marked = False
        self.traced_marked = False
        self.pending: List[Tuple[str, Any, "Kind", int]] = []
        self.pinned = 0
        #: the update count of the user's update() or forward() each of the first ``len(steps)``
        #: pending entries came from (stamped after that call: :func:`landing.after_update`)
        self.steps: List[Optional[int]] = []
        self.noted = 0  # entries noted since the evidence last went to the host (landing.LANDING)
        self.flight: Any = None  # evidence on its way to the host (landing.Flight)
        self.ghost: Any = None  # what the reporters need of the metric once it is gone (landing.ghost)
        self.at_once: Optional[bool] = None  # its evidence is read at once (host memory); None: not known yet


#: id(metric) -> its book (metrics built while deferred_reports is applied)
_books: Dict[int, Book] = {}
#: held while a book's evidence and counts change: an update adding evidence, a gather folding it
#: (``revert()`` gathers every book from the thread that reverts) and a settle taking the counts
LOCK = threading.RLock()


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
        # atexit=False: at exit a live metric's report is given by landing's exit hook, which names the exit
        weakref.finalize(metric, collected, id(metric), weakref.ref(book)).atexit = False
        device = getattr(metric, "device", None)
        if device is not None:
            import torch

            book.traced = {key: torch.zeros((), dtype=torch.long, device=device) for key in _records}
        armed()
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
    """Fold what updates left in the book (eager ``pending`` evidence, compiled ``traced``
    counts) into its counts."""
    if not book.marked:
        return
    with LOCK:
        book.marked = False
        if book.pending:
            _fold(book)
        if book.traced_marked:
            book.traced_marked = False
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


def is_live() -> bool:
    """Whether the deferred_reports patch is applied (its forward and reset layers are in place)."""
    return _live


def went_live() -> None:
    """The deferred_reports patch is applied."""
    global _live
    _live = True


def went_dormant() -> None:
    """The deferred_reports patch is reverted: keep every pending report (:func:`detach`) for the
    next compute; updates no longer report (the ``wrapped_func`` of a metric built while applied
    still calls the update hook: it returns at once)."""
    global _live
    _live = False
    for metric, book in pending_books():
        detach(metric, book)
    WATCH.drop_books()


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
            amount = _reduce(kind, [evidence])
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
            if len(book.pending) >= PENDING_ENTRIES or book.pinned >= PENDING_BYTES:
                _fold(book)
        return True


# -- evidence: what an update leaves in a book, counted when the book is gathered -------------
#: a kind of evidence (:meth:`Record.note`): a tuple whose first item names it
Kind = Tuple[Any, ...]

#: the sum of the tensor (a count, a bool, a mask)
SUM: Kind = ("sum",)
#: 1 if any element is true (a NaN mask: the update saw NaN)
ANY: Kind = ("any",)
#: the number of false elements (a mask of the positions kept)
FALSE: Kind = ("false",)


def outside(low: int, high: int) -> Kind:
    """The number of elements outside ``[low, high)`` (integer tensors: codes, classes)."""
    return ("outside", low, high)


_EMPTY: Dict[str, Any] = {}

#: a book folds its pending evidence when it holds this many entries, or this many bytes of
#: tensors (kept alive until then: device memory a metric holds beyond its states); each fold
#: is a few kernels for all of them. Small batches (launch-bound) fold every 64 updates; an
#: update of a megabyte of evidence or more, at once
PENDING_ENTRIES = 64
PENDING_BYTES = 1 << 20


def _reduce(kind: Kind, tensors: List[Any]) -> Any:
    """The count of ``kind`` over ``tensors`` (all of one dtype and device; for ``ANY``, of
    one number of elements): a 0-d int64 tensor."""
    import torch

    name = kind[0]
    if name == "any":
        if len(tensors) == 1:
            return tensors[0].any().long()
        return torch.stack([t.reshape(-1) for t in tensors]).any(1).sum()
    flat = tensors[0].reshape(-1) if len(tensors) == 1 else torch.cat([t.reshape(-1) for t in tensors])
    if name == "sum":
        total = flat.sum()
        return total if total.dtype == torch.int64 else total.long()
    if name == "false":
        return flat.numel() - flat.sum()
    low, high = kind[1], kind[2]
    if flat.dtype in (torch.int32, torch.int64) and low < high:
        return (flat.clamp(low, high - 1) != flat).sum()
    return ((flat < low) | (flat >= high)).sum()


def _fold(book: Book) -> None:
    """Count the book's pending evidence into its counts: one reduction per key, kind, sign,
    dtype and device (and number of elements, for ``ANY``). Which update each entry came from
    is not kept (:mod:`landing` keeps it where it reduces the entries one by one)."""
    pending, book.pending, book.pinned, book.steps = book.pending, [], 0, []
    groups: Dict[Tuple[Any, ...], List[Any]] = {}
    hosts: Dict[Tuple[str, int], int] = {}
    for key, evidence, kind, sign in pending:
        if type(evidence) is int:  # a count already on the host
            hosts[(key, sign)] = hosts.get((key, sign), 0) + evidence
            continue
        group = (key, kind, sign, evidence.dtype, evidence.device, evidence.numel() if kind[0] == "any" else None)
        groups.setdefault(group, []).append(evidence)
    counts = book.counts
    for (key, kind, sign, _, _, _), tensors in groups.items():
        amount = _reduce(kind, tensors)
        old = counts.get(key)
        if old is not None and old.device != amount.device:
            amount = amount.to(old.device)  # a metric moved between updates
        if sign > 0:
            counts[key] = amount if old is None else old + amount
        else:
            counts[key] = -amount if old is None else old - amount
    for (key, sign), value in hosts.items():
        old, value = counts.get(key), value if sign > 0 else -value
        if old is None:
            import torch

            counts[key] = torch.full((), value, dtype=torch.long, device=getattr(book.ref(), "device", None))
        else:
            counts[key] = old + value


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


def pending_books() -> List[Tuple[Any, Book]]:
    """Every live metric with something pending."""
    out = []
    for book in list(_books.values()):
        metric = book.ref()
        if metric is not None:
            gather(book)
        if metric is not None and (book.counts or book.synced or book.flight is not None):
            out.append((metric, book))
    return out


# the report's giving, the evidence's way to the host, the reports after an update and where a metric or the
# process goes, the pending reports across revert() and the report at a settle point, in modules of their own
from tmpatch.runtime.deferred import landing  # noqa: E402
from tmpatch.runtime.deferred.endings import armed, collected, ghost  # noqa: E402
from tmpatch.runtime.deferred.giving import point  # noqa: E402
from tmpatch.runtime.deferred.landing import LANDING, WATCH, recall  # noqa: E402
from tmpatch.runtime.deferred.revert import detach, forward_step  # noqa: E402
from tmpatch.runtime.deferred.settling import (  # noqa: E402
    books_in,
    clear,
    count_once,
    enclosing,
    pending,
    settle,
    start_compute,
)
from tmpatch.runtime.deferred.updates import after_update, marks, restamp  # noqa: E402

__all__ = ["ANY", "AUDIT_TAG", "BOOK_ATTRIBUTE", "Book", "FALSE", "Kind", "LANDING", "PENDING_BYTES",
           "PENDING_ENTRIES", "Record", "SUM", "WATCH", "after_update", "armed", "attach", "book_of", "books_in", "clear",
           "collected", "count_once", "detach", "enclosing", "forward_step", "gather", "ghost", "internal", "is_live",
           "landing", "local_records", "marks", "mirror", "moved", "open_book", "outside", "pending", "pending_books",
           "point", "recall", "restamp", "scope", "set_synced", "settle", "start_compute", "traced_book", "went_dormant", "went_live"]
