"""What the release's ``Metric._sync_dist`` hands its ``dist_sync_fn``, and the
replay that answers those calls from one coalesced exchange.

``_sync_dist`` (every release 1.0.0-1.9.0) builds ``{attr: state}`` in the order
of ``_reductions``, replaces a list state reduced by ``dim_zero_cat`` with more
than one element by ``[dim_zero_cat(list)]`` (and, from 1.4.0 on torch >= 2.1,
an empty one by ``[torch.tensor([], device=self.device, dtype=self.dtype)]``),
then calls ``dist_sync_fn(tensor, group=...)`` once per tensor, dicts and lists
in order (``apply_to_collection``). :func:`plan` lists those tensors before the
release runs; :class:`Replay` is the ``dist_sync_fn`` the release then gets.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple, cast

from tmpatch.runtime import deferred, wrappers

log = logging.getLogger("tmpatch")

STATE, CONCAT, EMPTY = "state", "concat", "empty"


@dataclass
class Rules:
    """What one implementation of ``_sync_dist`` does, and how to tell its default
    ``dist_sync_fn``: ``cat`` is the release's ``dim_zero_cat``; ``empty(metric)``
    whether an empty ``cat`` list becomes an empty tensor; ``raw`` the release's own
    ``gather_all_tensors``; ``keeps_graph`` whether it returns the caller's tensor
    for the local rank (1.6.0+)."""

    cat: Callable[[Any], Any]
    empty: Callable[[Any], bool]
    raw: Callable[..., Any]
    keeps_graph: bool

    def is_default(self, fn: Any) -> bool:
        """``fn`` is torchmetrics' ``gather_all_tensors``, bare or under tmpatch's
        ``gather_autograd`` layer (another tool's wrapper is the user's: not default)."""
        if fn is self.raw:
            return True
        return wrappers.is_patched(fn) and wrappers.get_original(fn) is self.raw

    def local_graph(self, fn: Any) -> bool:
        """Whether the local rank's entry is the caller's tensor (its graph kept)."""
        return self.keeps_graph or fn is not self.raw


@dataclass
class Entry:
    """One call the release will make: ``key`` (``attr`` or ``attr[i]``), the tensor
    exchanged for it, and what it came from (for matching the call)."""

    key: str
    tensor: Any
    kind: str
    source: Any = None

    def dedupe_key(self) -> Optional[Tuple[Any, ...]]:
        if self.kind == STATE:
            return (STATE, id(self.source))
        if self.kind == CONCAT:
            return (CONCAT, id(self.source), tuple(id(item) for item in self.source))
        return None

    def matches(self, tensor: Any) -> bool:
        if self.kind == STATE:
            return tensor is self.source
        mine = self.tensor
        return (tensor.shape == mine.shape and tensor.dtype == mine.dtype and tensor.device == mine.device)


def _plain(tensor: Any) -> bool:
    import torch

    return (
        isinstance(tensor, torch.Tensor) and type(tensor) in (torch.Tensor, torch.nn.Parameter)
        and tensor.layout == torch.strided and not tensor.is_quantized and tensor.device.type != "meta"
    )


def plan(metric: Any, rules: Rules, concats: Optional[Dict[Tuple[Any, ...], Any]] = None) -> Optional[List[Entry]]:
    """The tensors ``metric._sync_dist`` will hand ``dist_sync_fn``, in order; None when a
    state is of a kind the release path should keep (not a tensor or a list of tensors,
    a sparse or quantized tensor, a tensor subclass). ``concats``: pre-concatenations
    already made, by list identity (members of a compute group share their lists)."""
    import torch

    entries: List[Entry] = []
    for attr, reduction in metric._reductions.items():
        value = getattr(metric, attr)
        if isinstance(value, torch.Tensor):
            if not _plain(value):
                return None
            entries.append(Entry(attr, value, STATE, value))
        elif isinstance(value, list):
            if not all(_plain(item) for item in value):
                return None
            if reduction == rules.cat and len(value) > 1:
                entry = Entry(attr, None, CONCAT, value)
                key = cast(Tuple[Any, ...], entry.dedupe_key())  # a concatenation's: never None
                made = concats.get(key) if concats is not None else None
                entry.tensor = made if made is not None else rules.cat(value)
                if concats is not None:
                    concats[key] = entry.tensor
                entries.append(entry)
            elif reduction == rules.cat and len(value) == 1:  # one tensor whatever the length: one key
                entries.append(Entry(attr, value[0], STATE, value[0]))
            elif reduction == rules.cat and not value and rules.empty(metric):
                entries.append(Entry(attr, torch.tensor([], device=metric.device, dtype=metric.dtype), EMPTY))
            else:
                entries.extend(Entry(f"{attr}[{i}]", item, STATE, item) for i, item in enumerate(value))
        else:
            return None
    return entries


def device_of(entries: List[Entry], metric: Any) -> Any:
    """The one device every tensor of the plan is on (the metric's for none); None if several."""
    devices = {entry.tensor.device for entry in entries}
    if len(devices) > 1:
        return None
    return devices.pop() if devices else metric.device


def signature(metric: Any) -> Tuple[Any, ...]:
    """Identity of every state object (lists: the list and its items)."""
    parts: List[Any] = []
    for attr in metric._reductions:
        value = getattr(metric, attr)
        parts.append(id(value))
        if isinstance(value, list):
            parts.append(tuple(id(item) for item in value))
    return tuple(parts)


@dataclass
class Replay:
    """The ``dist_sync_fn`` handed to the release: answers the planned calls, in order,
    with the gathered values (``values[i][rank]``); the local entry is the caller's own
    tensor where the release keeps the graph. A call it did not plan for goes to
    ``fallback`` (the release's gather), so no result is ever made up."""

    entries: List[Entry]
    values: List[List[Any]]
    rank: int
    local_graph: bool
    fallback: Callable[..., Any]
    position: int = 0
    missed: List[str] = field(default_factory=list)

    def __call__(self, result: Any, group: Any = None) -> List[Any]:
        if self.position < len(self.entries) and self.entries[self.position].matches(result):
            gathered = list(self.values[self.position])
            self.position += 1
            if self.local_graph:
                gathered[self.rank] = result.contiguous()
            return gathered
        self.missed.append(f"{tuple(result.shape)} {result.dtype}")
        return self.fallback(result, group=group)

    def check(self, metric: Any) -> None:
        if self.missed or self.position != len(self.entries):
            log.warning(
                "tmpatch coalesced_sync: %s._sync_dist made calls the plan did not foresee (%d of %d used; "
                "unforeseen: %s); those went through torchmetrics' gather",
                type(metric).__name__, self.position, len(self.entries), ", ".join(self.missed) or "none",
            )


def records_api() -> Tuple[Optional[Callable[[Any], Dict[str, Any]]], Optional[Callable[[Any, Dict[str, Any]], None]]]:
    """``(local_records, set_synced)`` of :mod:`tmpatch.runtime.deferred` (None, None before it has them)."""
    return getattr(deferred, "local_records", None), getattr(deferred, "set_synced", None)
