"""Pending reports across ``revert()``: kept for the metric's next ``compute()``, and
forgotten on a ``reset()`` made after the patch's hooks are gone."""
from __future__ import annotations

import sys
from typing import Any, Optional

from tmpatch.runtime.deferred.books import Book, book_of, gather, not_live, pending_books
from tmpatch.runtime.deferred.landing import WATCH


def detach(metric: Any, book: Book) -> None:
    """At ``revert()``: keep a pending report of ``metric`` for its next ``compute()`` (its
    compute layer stays with it), and recognise a later ``reset()``, whose hook is gone, by
    the update count, which ``reset()`` sets to 0 and every update raises: the count is
    checked at the next compute and, through a watch on the metric's own ``update``
    attribute (never pickled or copied by torchmetrics), before each update until the
    report is given."""
    gather(book)
    book.stamp = getattr(metric, "_update_count", 0)
    states = getattr(metric, "__dict__", {})
    inner = states.get("update")
    if inner is None or getattr(inner, "_tmpatch_watch", False):
        return

    def update(*args: Any, **kwargs: Any) -> Any:
        current = book_of(metric)
        if current is not None:
            gather(current)
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

    update._tmpatch_watch = True  # type: ignore[attr-defined]  # a mark on the function
    update.__wrapped__ = inner  # type: ignore[attr-defined]  # as functools.wraps sets it
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


def went_dormant() -> None:
    """The deferred_reports patch is reverted: keep every pending report (:func:`detach`) for the
    next compute; updates no longer report (the ``wrapped_func`` of a metric built while applied
    still calls the update hook: it returns at once)."""
    not_live()
    for metric, book in pending_books():
        detach(metric, book)
    WATCH.drop_books()
