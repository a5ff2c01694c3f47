"""Books and records of deferred reports: the book tmpatch keeps beside a metric (the evidence its
updates left, the counts gathered from it), the kinds of evidence, and the flags of the patch's
state. Every other module of the package builds on this one; see the package's docstring."""
from __future__ import annotations

import logging
import threading
import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple

from tmpatch.runtime.compiled import ContextSlot

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
_records: Dict[str, Any] = {}  # the Record of records.py


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


def is_live() -> bool:
    """Whether the deferred_reports patch is applied (its forward and reset layers are in place)."""
    return _live


def went_live() -> None:
    """The deferred_reports patch is applied."""
    global _live
    _live = True


def not_live() -> None:
    """The deferred_reports patch is reverted (what follows for the pending reports:
    ``revert.went_dormant``)."""
    global _live
    _live = False


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
