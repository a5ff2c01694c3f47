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

``books.py``: books and the kinds of evidence; ``records.py``: a book opened, the records patches
note with; ``giving.py``: a report given (its reporters called once);
``landing.py``: evidence reduced entry by entry and sent to the host without a sync;
``updates.py``: the report after the user's update; ``endings.py``: where no call can
raise it; ``settling.py``: the report at a settle point and the forward/reset steps around
it; ``revert.py``: pending reports across ``revert()``. This package's names are the interface
the patches use; its modules import one another, in that order from ``books.py`` up, never the
package itself.
"""
from tmpatch.runtime.deferred import landing
from tmpatch.runtime.deferred.books import (
    ANY,
    AUDIT_TAG,
    BOOK_ATTRIBUTE,
    FALSE,
    PENDING_BYTES,
    PENDING_ENTRIES,
    SUM,
    Book,
    Kind,
    attach,
    book_of,
    gather,
    internal,
    is_live,
    moved,
    outside,
    pending_books,
    scope,
    traced_book,
    went_live,
)
from tmpatch.runtime.deferred.endings import armed, collected, ghost
from tmpatch.runtime.deferred.giving import error_as_release, point, warn_as_release, warn_in
from tmpatch.runtime.deferred.landing import LANDING, WATCH, recall
from tmpatch.runtime.deferred.records import Record, local_records, mirror, open_book, set_synced
from tmpatch.runtime.deferred.revert import detach, forward_step, went_dormant
from tmpatch.runtime.deferred.settling import books_in, clear, count_once, enclosing, pending, settle, start_compute
from tmpatch.runtime.deferred.updates import after_update, marks, restamp

__all__ = ["ANY", "AUDIT_TAG", "BOOK_ATTRIBUTE", "Book", "FALSE", "Kind", "LANDING", "PENDING_BYTES",
           "PENDING_ENTRIES", "Record", "SUM", "WATCH", "after_update", "armed", "attach", "book_of", "books_in",
           "clear", "collected", "count_once", "detach", "enclosing", "error_as_release", "forward_step", "gather",
           "ghost", "internal", "is_live", "landing", "local_records", "marks", "mirror", "moved", "open_book",
           "outside", "pending", "pending_books", "point", "recall", "restamp", "scope", "set_synced", "settle",
           "start_compute", "traced_book", "warn_as_release", "warn_in", "went_dormant", "went_live"]
