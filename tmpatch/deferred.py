"""Deferred reports: a condition seen during ``update()`` is kept on the device
and reported at the user's next ``compute()``.

A check such as ``if torch.isnan(x).any(): warn(...)`` in ``update()`` reads a
device value back to the host on every step. A :class:`Record` keeps a count
instead: a 0-d int64 tensor registered as a *metric state* of the metric
(``dist_reduce_fx="sum"``, not persistent), to which ``update()`` adds on the
device, without a sync. Because it is a state, torchmetrics itself

* clears it in ``reset()``;
* carries it through ``forward()`` (the batch-state reduction and the
  full-state cache both include every state);
* moves it with ``.to(device)`` and copies it with the metric;
* sums it over ranks when ``compute()`` syncs the states in DDP, so a condition
  seen on any rank is reported by every rank, consistently.

At ``compute()`` a patch calls :meth:`Record.take`: one device read, then the
record starts afresh. ``forward()`` calls ``compute()`` internally for the batch
value; :func:`explicit_compute` tells the two apart (``take`` returns 0 inside
``forward()``). :func:`fail` raises from ``compute()`` without leaving the
metric in its synced state.

The record is attached when the metric is built (:meth:`Record.attach`); a
metric built before tmpatch was applied has none, and :meth:`Record.has` lets
the patch fall back to reporting at once.
"""
from __future__ import annotations

import logging
from typing import Any, Sequence, Tuple

log = logging.getLogger("tmpatch")

_PREFIX = "_tmpatch_"

#: attribute set on the tensor a record is read from, so that the sync audit, which cannot
#: know device values, reads it as 0 ("nothing to report") instead of its usual guess
AUDIT_TAG = "_tmpatch_record"


def explicit_compute(metric: Any) -> bool:
    """Whether ``metric.compute()`` runs for the user, not inside ``forward()``.

    Both ``Metric._forward_full_state_update`` and
    ``Metric._forward_reduce_state_update`` (every release 1.0-1.9) set
    ``_should_unsync = False`` around their internal ``compute()`` and back to
    ``True`` afterwards.
    """
    return getattr(metric, "_should_unsync", True) is not False


def fail(metric: Any, error: BaseException) -> None:
    """Raise ``error`` from ``compute()``, restoring the local states first if
    ``compute()`` synced them (torchmetrics' ``sync_context`` does not unsync
    when the body raises, and a synced metric refuses further updates)."""
    if getattr(metric, "_is_synced", False) and getattr(metric, "_cache", None) is not None:
        metric.unsync()
    raise error


class Record:
    """A device-side count, kept as the metric state ``_tmpatch_<key>``."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.name = _PREFIX + key

    def __repr__(self) -> str:
        return f"Record({self.key!r})"

    def attach(self, metric: Any) -> None:
        """Register the record on ``metric`` (call it from the metric's ``__init__``)."""
        import torch

        if self.name in metric._defaults:
            return
        device = getattr(metric, "device", None)
        metric.add_state(
            self.name, default=torch.zeros((), dtype=torch.int64, device=device),
            dist_reduce_fx="sum", persistent=False,
        )

    def has(self, metric: Any) -> bool:
        """Whether ``metric`` carries the record."""
        defaults = getattr(metric, "_defaults", None)
        return defaults is not None and self.name in defaults

    def add(self, metric: Any, amount: Any) -> None:
        """Add ``amount`` (a device tensor, or a Python number) to the record,
        without reading anything back. ``metric`` must carry the record.

        ``add_state`` keeps a state in the instance dict: written there directly,
        without ``Module.__setattr__`` (a few microseconds per update)."""
        states = metric.__dict__
        states[self.name] = states[self.name] + amount

    def slots(self, window: int) -> Tuple[str, ...]:
        """The names the ``Running`` wrapper gives the record's copies (``<name>_<i>``)."""
        return tuple(f"{self.name}_{i}" for i in range(window))

    def take(self, metric: Any, names: Sequence[str] = ()) -> float:
        """Read the record (one device read) and clear it; 0 inside ``forward()``.

        ``names``: the states to read instead of the record itself (the copies a
        wrapper keeps). In a synced ``compute()`` the local copies are cleared
        too, so the record stays cleared after the states are unsynced.
        """
        if not explicit_compute(metric):
            return 0.0
        names = list(names) or [self.name]
        values = [getattr(metric, name, None) for name in names]
        present = [(n, v) for n, v in zip(names, values) if v is not None]
        if not present:
            return 0.0
        total = present[0][1]
        for _, value in present[1:]:
            total = total + value
        setattr(total, AUDIT_TAG, True)  # a simulated read (tmpatch.audit) returns 0 for it
        amount = float(total)  # the one device read
        if amount:
            import torch

            cache = getattr(metric, "_cache", None) if getattr(metric, "_is_synced", False) else None
            for name, value in present:
                setattr(metric, name, torch.zeros_like(value))
                if cache is not None and name in cache:
                    cache[name] = torch.zeros_like(cache[name])
            log.debug("tmpatch: %s of %s reported at compute: %g", self.key, type(metric).__name__, amount)
        return amount
