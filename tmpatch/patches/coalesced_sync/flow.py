"""The two entry points: one metric's ``_sync_dist``, and ``MetricCollection.compute``.

* :func:`sync_dist` (wraps ``Metric._sync_dist``): plan the calls the release
  will make, exchange every tensor in one coalesced step (:mod:`.wire`), then
  run the release's own ``_sync_dist`` with a :class:`.plan.Replay` as its
  ``dist_sync_fn``: the release stacks, flattens and reduces as it always does.
* :func:`collection_compute` (wraps ``MetricCollection.compute``): before the
  members compute, exchange the states of every member that is about to sync
  (one exchange per process group and device, shared states sent once); each
  member's ``_sync_dist`` then replays its part.

A user-supplied ``dist_sync_fn``, an uninitialised ``torch.distributed``, a rank
outside the group, or states of a kind the plan does not know (see
:func:`.plan.plan`) keep the release's own path. Each of those is the same on
every rank that runs the same program, so every rank takes the same path.
"""
from __future__ import annotations

import contextvars
import logging
import sys
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple, Type

from tmpatch.patches.coalesced_sync import wire
from tmpatch.patches.coalesced_sync.plan import Entry, Replay, Rules, device_of, plan, records_api, signature

log = logging.getLogger("tmpatch")


@dataclass
class Prefetched:
    """One member's share of a collection's exchange."""

    metric: Any
    group: Any
    signature: Tuple[Any, ...]
    entries: List[Entry]
    values: List[List[Any]]
    totals: Dict[str, Any]
    rank: int


#: id(metric) -> Prefetched, while a patched MetricCollection.compute runs
_PREFETCHED: contextvars.ContextVar[Optional[Dict[int, Prefetched]]] = contextvars.ContextVar(
    "tmpatch_coalesced_prefetched", default=None
)


def _rank_in(group: Any) -> int:
    """This process's rank in ``group`` (None: the world); -1 outside it or without a process group."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return -1
    try:
        return dist.get_rank(group)
    except (RuntimeError, ValueError):  # not a member (older torch raises)
        return -1


def _release() -> str:
    return str(getattr(sys.modules.get("torchmetrics"), "__version__", "?"))


def _request(kind: int, members: List[Tuple[str, Any, List[Entry]]]) -> wire.Request:
    """One request for ``members`` ``(name, metric, entries)``; a tensor shared by several
    entries (compute groups) is sent once."""
    local_records, _ = records_api()
    request = wire.Request(kind, release=_release())
    blocks: Dict[Any, int] = {}
    for owner, (name, metric, entries) in enumerate(members):
        request.owners.append(name)
        for entry in entries:
            key = entry.dedupe_key()
            index = blocks.get(key) if key is not None else None
            if index is None:
                request.blocks.append(entry.tensor)
                index = len(request.blocks) - 1
                if key is not None:
                    blocks[key] = index
            request.entries.append((owner, entry.key, index))
        if local_records is not None:
            for record, value in sorted((local_records(metric) or {}).items()):
                request.records.append((owner, str(record), value))
    return request


def _finish(original: Callable[..., Any], metric: Any, replay: Replay, process_group: Any,
            totals: Dict[str, Any]) -> None:
    original(metric, replay, process_group=process_group)
    replay.check(metric)
    _, set_synced = records_api()
    if set_synced is not None:
        set_synced(metric, totals)


def sync_dist(rules: Rules, original: Callable[..., Any], metric: Any, *args: Any, **kwargs: Any) -> None:
    """Replacement of ``Metric._sync_dist(self, dist_sync_fn=gather_all_tensors, process_group=None)``."""
    fn = args[0] if args else kwargs.get("dist_sync_fn", (original.__defaults__ or (None,))[0])
    process_group = args[1] if len(args) > 1 else kwargs.get("process_group")
    if len(args) > 2 or set(kwargs) - {"dist_sync_fn", "process_group"} or not rules.is_default(fn):
        return original(metric, *args, **kwargs)
    group = process_group or metric.process_group
    rank = _rank_in(group)
    if rank < 0:
        return original(metric, *args, **kwargs)
    local_graph = rules.local_graph(fn)
    store = _PREFETCHED.get()
    found = store.pop(id(metric), None) if store else None
    if found is not None and found.metric is metric and found.group is group:
        if found.signature == signature(metric):
            replay = Replay(found.entries, found.values, found.rank, local_graph, fn)
            return _finish(original, metric, replay, process_group, found.totals)
        log.warning("tmpatch coalesced_sync: the states of %s changed between the collection's exchange and "
                    "its sync; it syncs on its own", type(metric).__name__)
    entries = plan(metric, rules)
    device = device_of(entries, metric) if entries is not None else None
    if entries is None or device is None:
        return original(metric, *args, **kwargs)
    result = wire.exchange(_request(wire.METRIC, [(type(metric).__name__, metric, entries)]), group, device)
    replay = Replay(entries, result.values, rank, local_graph, fn)
    return _finish(original, metric, replay, process_group, result.totals.get(0, {}))


def will_sync(metric: Any, rules: Rules, metric_class: Type[Any], default_fn: Any, default_available: Any) -> bool:
    """Whether ``metric.compute()`` is about to sync through the patched ``_sync_dist``
    with the default gather (as ``Metric._wrap_compute`` and ``Metric.sync`` decide;
    ``default_available``: ``Metric.sync``'s own test, for 0.10, whose metrics hold none)."""
    if not isinstance(metric, metric_class) or not metric._reductions:
        return False
    owner = next((cls for cls in type(metric).__mro__ if "_sync_dist" in vars(cls)), None)
    if owner is not metric_class:
        return False
    if metric._computed is not None or not metric._to_sync or metric._is_synced:
        return False
    if not rules.is_default(metric.dist_sync_fn or default_fn):
        return False
    available = vars(metric).get("distributed_available_fn", default_available)
    return bool(callable(available) and available())


def collection_compute(rules: Rules, metric_class: type, metric_module: Any,
                       original: Callable[..., Any], collection: Any) -> Any:
    """Replacement of ``MetricCollection.compute(self)``."""
    if _PREFETCHED.get() is not None or _rank_in(None) < 0:
        return original(collection)
    buckets: Dict[Tuple[Any, ...], Tuple[Any, Any, List[Tuple[str, Any, List[Entry]]]]] = {}
    concats: Dict[Tuple[Any, ...], Any] = {}
    default_fn = metric_module.gather_all_tensors
    default_available = getattr(metric_module, "jit_distributed_available", None)
    for name, metric in collection.items(keep_base=True, copy_state=False):  # what compute() itself calls first
        if not will_sync(metric, rules, metric_class, default_fn, default_available) \
                or _rank_in(metric.process_group) < 0:
            continue
        entries = plan(metric, rules, concats)
        device = device_of(entries, metric) if entries is not None else None
        if entries is None or device is None:
            continue
        group = metric.process_group
        key = (id(group), str(device))
        buckets.setdefault(key, (group, device, []))[2].append((str(name), metric, entries))
    if sum(len(members) for _, _, members in buckets.values()) < 2:
        return original(collection)
    store: Dict[int, Prefetched] = {}
    for group, device, members in buckets.values():
        result = wire.exchange(_request(wire.COLLECTION, members), group, device)
        position = 0
        for owner, (_, metric, entries) in enumerate(members):
            values = result.values[position:position + len(entries)]
            position += len(entries)
            store[id(metric)] = Prefetched(metric, group, signature(metric), entries, values,
                                           result.totals.get(owner, {}), result.rank)
    token = _PREFETCHED.set(store)
    try:
        return original(collection)
    finally:
        _PREFETCHED.reset(token)
