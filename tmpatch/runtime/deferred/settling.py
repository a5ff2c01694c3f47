"""The books at a settle point: those of a metric and of the metrics inside it, read in
one device read, each record's reporter called once, then cleared (:func:`settle`); the
forward and reset steps around it (:func:`count_once`, :func:`start_compute`, :func:`clear`);
and what a settle point needs to know: where the report is given (:func:`point`), whether
anything is pending (:func:`pending`), and which metric holds the one it was called on
(:func:`enclosing`).

A settle point is where a metric's data leaves it or is dropped: the user's ``compute()``,
``state_dict()``, pickling or copying, ``merge_state()`` (into or out of), ``sync()``,
``reset()``. The ``deferred_reports`` patch settles there, so that no copy of a state
carries data whose report was never given.
"""
from __future__ import annotations

import contextvars
import sys
from typing import Any, Dict, Iterator, List, Sequence, Tuple

from tmpatch.runtime.deferred import AUDIT_TAG, LOCK, Book, _books, _records, book_of, gather, log

#: the settle point whose report is being given (reporters name it: :func:`point`)
_point: "contextvars.ContextVar[str]" = contextvars.ContextVar("tmpatch_settle_point", default="compute()")


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


def _lone(metric: Any) -> Any:
    """The book of a metric with no module inside it (most metrics: the whole of what
    :func:`start_compute` and :func:`settle` look at), or None (no book, or inner metrics)."""
    return None if getattr(metric, "_modules", None) else book_of(metric)


def start_compute(metric: Any) -> None:
    """Before the user's compute: forget totals of an earlier sync (a forward's)."""
    book = _lone(metric)
    if book is not None:  # most metrics: one book, no walk through modules
        gather(book)
        book.synced = None
        return
    for book in books_in(metric):
        book.synced = None


def clear(metric: Any) -> None:
    """Forget what the books of ``metric`` and of the metrics inside it hold."""
    for inner in _metrics_in(metric):
        book = book_of(inner)
        if book is not None:
            gather(book)
            book.counts, book.synced, book.stamp = {}, None, None


def point() -> str:
    """Where the report being given is given: ``compute()`` (the default), ``state_dict()``,
    ``reset()``, ``sync()``, ``merge_state()`` or ``pickling``, for a reporter's text."""
    return _point.get()


def pending(metric: Any) -> bool:
    """Whether the books of ``metric`` (and of the metrics inside it) hold anything (no read)."""
    with LOCK:  # not between another thread's unmarking of a book and its fold
        book = _lone(metric)
        if book is not None:
            return bool(book.marked or book.counts or book.synced)
        return any(book.counts or book.synced for book in books_in(metric))


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
    frame = sys._getframe(1)
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
    them: one device read for all of them. Called after the user's ``compute()``, and at
    the other settle points (``where`` names the point for the reporters: :func:`point`)."""
    keys: List[Tuple[Any, str, bool]] = []
    values: List[Any] = []
    with LOCK:  # what the books hold is taken whole: no fold from another thread in between
        book = _lone(metric)
        if book is not None and not (book.marked or book.counts or book.synced):
            return  # most computes: one empty book, nothing to read (nor being folded: the lock)
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
            source = book.synced if book.synced is not None else book.counts
            for key, value in source.items():
                keys.append((inner, key, book.synced is not None))
                values.append(value)
            book.counts, book.synced, book.stamp = {}, None, None  # cleared first: a raise leaves nothing
    if not values:
        return
    import torch

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
    token = _point.set(where)
    try:
        for key, found in by_key.items():
            record = _records.get(key)
            if record is None:
                continue
            try:
                record.reporter(metric, found, all_ranks[key])
            except Exception as exc:  # noqa: BLE001 - an error report: raised after the warnings
                errors.append(exc)
    finally:
        _point.reset(token)
    if len(errors) > 1 and len(errors[0].args) == 1 and isinstance(errors[0].args[0], str):
        # one raise per compute: the others ride in its message, not lost
        errors[0].args = ("\n".join([errors[0].args[0]] + [f"Also: {exc}" for exc in errors[1:]]),)
    if errors:
        raise errors[0]
