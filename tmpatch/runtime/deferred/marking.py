"""Marked updates: the release code below a metric's ``update()`` learns which metric runs.

A patch that defers a check wraps the class ``update`` with :meth:`Marker.build_update`
and asks :meth:`Marker.get` in the release function that holds the check: the value
set for the update running in this thread / task (by default the metric), or None
outside one (the functional API, a metric built before ``apply()``, which has no
book). The slot is a :class:`tmpatch.runtime.compiled.ContextSlot`, so compiled updates see it
too.
"""
from __future__ import annotations

from types import ModuleType
from typing import Any, Callable, Optional

from tmpatch.runtime.compiled import ContextSlot
from tmpatch.spec import inline


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

    def build_update(self, module: ModuleType) -> Callable[..., Any]:
        """The class ``update`` replacement: the release's update, marked when the metric
        has a deferred-report book."""
        recorded, slot, make = self.record.deferred, self.slot, self.make

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
        recorded, slot, make = self.record.deferred, self.slot, self.make

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
