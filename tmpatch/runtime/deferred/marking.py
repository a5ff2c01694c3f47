"""Marked updates: the release code below a metric's ``update()`` learns which metric runs.

A patch that defers a check wraps the class ``update`` with :meth:`Marker.build_update`
and asks :meth:`Marker.get` in the release function that holds the check: the value
set for the update running in this thread / task (by default the metric), or None
outside one (the functional API, a metric built before ``apply()``, which has no
book). The slot is a :class:`tmpatch.runtime.compiled.ContextSlot`, so compiled updates see it
too.

Policy ``checks`` (``TMPATCH_CHECKS``; :mod:`tmpatch.control.settings`) is read at every update:
``eager`` leaves every marked update unmarked, so the release's code runs there, its checks
raising in ``update()`` with their syncs, as without tmpatch. One policy for the checks of all
these patches: each defers an error the release raises from ``update()``, and where an error
comes from is a choice about the program (a ``try``/``except`` around ``update()`` that skips a
bad batch wants every one of them there), not about one patch.
"""
from __future__ import annotations

from types import ModuleType
from typing import Any, Callable, Optional

from tmpatch.runtime import policies
from tmpatch.runtime.compiled import ContextSlot
from tmpatch.spec import inline

#: the policy that says where the marked updates' checks raise: ``deferred`` or ``eager``
POLICY = "checks"


def waits(record: Any, metric: Any) -> bool:
    """Whether the checks in ``metric``'s update wait for ``compute()``: policy ``checks`` is
    ``deferred`` and the metric has a book for ``record``."""
    return policies.current.get(POLICY, "deferred") == "deferred" and record.deferred(metric)


class Marker:
    """The marked update of one patch: ``Marker(name, record)``; ``make(metric)`` gives
    the value the update's callees see (the metric when not given)."""

    __slots__ = ("slot", "record", "make")

    def __init__(self, name: str, record: Any, make: Optional[Callable[[Any], Any]] = None) -> None:
        self.slot = ContextSlot(name)
        self.record = record
        self.make = make

    def get(self) -> Any:
        """The value of the marked update running here, or None."""
        return self.slot.get()

    def waits(self, metric: Any) -> bool:
        """Whether ``metric``'s update is marked (:func:`waits`)."""
        return waits(self.record, metric)

    def build_update(self, module: ModuleType) -> Callable[..., Any]:
        """The class ``update`` replacement: the release's update, marked when the metric
        has a deferred-report book (and policy ``checks`` is ``deferred``)."""
        recorded, slot, make = self.waits, self.slot, self.make

        def update(original: Callable, self: Any, *args: Any, **kwargs: Any) -> Any:
            if not recorded(self):
                return original(self, *args, **kwargs)
            token = slot.set(self if make is None else make(self))
            try:
                return original(self, *args, **kwargs)
            finally:
                slot.reset(token)

        return update

    def build_pair_update(self, module: ModuleType) -> Callable[..., Any]:
        """As :meth:`build_update`, for a class ``update(self, preds, target)``: installed itself
        (``spec.inline``: no wrapper's frame around every update)."""
        recorded, slot, make = self.waits, self.slot, self.make

        def update(self: Any, preds: Any, target: Any, *, _tmpatch_route: Any) -> Any:
            original = _tmpatch_route.original
            if not _tmpatch_route.on or not recorded(self):
                return original(self, preds, target)
            token = slot.set(self if make is None else make(self))
            try:
                return original(self, preds, target)
            finally:
                slot.reset(token)

        return inline(update)
