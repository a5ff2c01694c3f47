"""What every rank runs in the multi-process ``coalesced_sync`` tests.

Started by :func:`distributed.ddp_launch.spawn` (``run_rank``, ``run_mixed``,
``run_releases``). Every rank runs the same cases in the same order, once per
*mode*: ``unpatched`` (``tmpatch.revert()``), ``coalesced``
(``apply("coalesced_sync")``), ``both`` (``apply(["gather_autograd",
"coalesced_sync"])``). Each case records what ``compute()``/``forward()`` gave
and the ``torch.distributed`` collectives it made (every public collective of
``torch.distributed`` is counted in the worker). The parent compares the modes.
Imports torch, never torchmetrics, at import time.
"""
from __future__ import annotations

import math
import os
import sys
import time
import zlib
from typing import Any, Callable, Dict, List, Sequence

import torch

from .ddp_workers import PG_TIMEOUT, _finish, _watchdog, save

#: every collective of torch.distributed a sync could make
COLLECTIVES = (
    "barrier", "all_gather", "all_gather_object", "all_gather_into_tensor", "broadcast", "broadcast_object_list",
    "all_reduce", "reduce", "gather", "scatter", "reduce_scatter", "all_to_all", "send", "recv", "isend", "irecv",
)
MODES = ("unpatched", "coalesced", "both")
NUM_CLASSES = 3
STEPS = 2


class Counter:
    """Counts calls of the public collectives of ``torch.distributed`` in this process."""

    def __init__(self) -> None:
        import torch.distributed as dist

        self.calls: List[str] = []
        for name in COLLECTIVES:
            original = getattr(dist, name, None)
            if callable(original):
                setattr(dist, name, self._counted(name, original))

    def _counted(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return original(*args, **kwargs)

        return counted

    def take(self) -> List[str]:
        calls, self.calls = self.calls, []
        return calls


def generator(*key: Any) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32("/".join(map(str, key)).encode()))


def _any(x: torch.Tensor) -> torch.Tensor:
    """A custom reduction (a callable of the user's): any over ranks."""
    return x.any(dim=0)


def classes() -> Dict[str, type]:
    from torchmetrics import Metric

    class Mixed(Metric):
        """One state of every kind: tensor states reduced by sum, mean, max, min, a
        custom callable and None, in several dtypes; list states reduced by cat
        (uneven, one rank empty, one element, several) and None."""

        full_state_update = False

        def __init__(self, extra: bool = False, label_dtype: Any = torch.float32, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.label_dtype = label_dtype
            self.add_state("total", torch.zeros(3), dist_reduce_fx="sum")
            self.add_state("avg", torch.zeros((), dtype=torch.float64), dist_reduce_fx="mean")
            self.add_state("hi", torch.full((2, 2), -math.inf), dist_reduce_fx="max")
            self.add_state("lo", torch.full((4,), 2**30, dtype=torch.int32), dist_reduce_fx="min")
            self.add_state("n", torch.zeros((), dtype=torch.int64), dist_reduce_fx="sum")
            self.add_state("flag", torch.zeros(3, dtype=torch.bool), dist_reduce_fx=_any)
            self.add_state("raw", torch.zeros(2, dtype=torch.float16), dist_reduce_fx=None)
            self.add_state("preds", [], dist_reduce_fx="cat")
            self.add_state("seq", [], dist_reduce_fx=None)
            self.add_state("one", [], dist_reduce_fx="cat")
            if extra:
                self.add_state("extra", torch.zeros(1), dist_reduce_fx="sum")

        def update(self, key: str, step: int, rank: int, rows: int) -> None:
            gen = generator(key, step, rank)
            self.total = self.total + torch.randn(3, generator=gen)
            self.avg = self.avg + torch.randn((), generator=gen, dtype=torch.float64)
            self.hi = torch.maximum(self.hi, torch.randn(2, 2, generator=gen))
            self.lo = torch.minimum(self.lo, torch.randint(-50, 50, (4,), generator=gen, dtype=torch.int32))
            self.n = self.n + rows
            self.flag = self.flag | (torch.rand(3, generator=gen) > 0.8)
            self.raw = self.raw + torch.randn(2, generator=gen).half()
            for i in range(rows):  # rows 0: this rank's list stays empty (an empty state)
                self.preds.append((torch.randn(i + 1, generator=gen) * 10).to(self.label_dtype))
            if step == 0:  # None-reduced list: the same length on every rank, uneven shapes
                self.seq.append(torch.randn(rank + 1, 2, generator=gen))
                self.seq.append(torch.randn(2, generator=gen).to(torch.bfloat16))
                self.one.append(torch.randn(rank + 2, 2, generator=gen).to(torch.complex64))

        def compute(self) -> Dict[str, Any]:
            return {name: getattr(self, name) for name in self._reductions}

    return {"Mixed": Mixed}


def collection(kind: str, **kwargs: Any) -> Any:
    """``issue``: the issue's collection (8 states); ``groups``: with compute groups."""
    from torchmetrics import MeanMetric, MetricCollection, SumMetric
    from torchmetrics.classification import (
        MulticlassAccuracy,
        MulticlassConfusionMatrix,
        MulticlassPrecision,
        MulticlassRecall,
    )

    metrics = {
        "mean": MeanMetric(**kwargs), "sum": SumMetric(**kwargs),
        "acc": MulticlassAccuracy(num_classes=NUM_CLASSES, **kwargs),
        "confmat": MulticlassConfusionMatrix(num_classes=NUM_CLASSES, **kwargs),
    }
    if kind == "groups":
        metrics["prec"] = MulticlassPrecision(num_classes=NUM_CLASSES, **kwargs)
        metrics["rec"] = MulticlassRecall(num_classes=NUM_CLASSES, **kwargs)
    return MetricCollection(metrics, compute_groups=kind == "groups")


def set_mode(mode: str) -> str:
    import tmpatch

    tmpatch.revert()
    if mode == "coalesced":
        tmpatch.apply("coalesced_sync")
    elif mode == "both":
        tmpatch.apply(["gather_autograd", "coalesced_sync"])
    elif mode != "unpatched":
        raise ValueError(mode)
    return tmpatch.status()["coalesced_sync"].state


def detach(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: detach(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [detach(v) for v in value]
    return value


def attempt(fn: Callable[[], Any]) -> Dict[str, Any]:
    """``{"value": ...}`` or ``{"error": "Type: message"}``."""
    try:
        return {"value": detach(fn())}
    except Exception as exc:  # noqa: BLE001 - reported to the parent as data
        return {"error": f"{type(exc).__name__}: {exc}"}


def rows_for(rank: int, world: int, empty: bool) -> int:
    """Rows a rank feeds: uneven; rank 0 feeds none where the case has an empty rank."""
    return rank if empty else rank + 1


def _states(counter: Counter, key: str, rank: int, world: int, empty: bool, longer: bool = False,
            **kwargs: Any) -> Dict[str, Any]:
    metric = classes()["Mixed"](**kwargs)
    for step in range(STEPS):
        metric.update(key, step, rank, rows_for(rank, world, empty))
    if longer:  # a None-reduced list state one element longer on this rank
        metric.seq.append(torch.zeros(2))
    counter.take()
    out = attempt(metric.compute)
    out["calls"] = counter.take()
    out["synced_after"] = bool(metric._is_synced)
    return out


def _collection(counter: Counter, kind: str, key: str, rank: int, world: int, **kwargs: Any) -> Dict[str, Any]:
    coll = collection(kind, **kwargs)
    for step in range(STEPS):
        gen = generator(key, step, rank)
        rows = rank + 2
        coll.update(value=torch.randn(rows, generator=gen), preds=torch.randint(0, NUM_CLASSES, (rows,), generator=gen),
                    target=torch.randint(0, NUM_CLASSES, (rows,), generator=gen))
    counter.take()
    out = attempt(coll.compute)
    out["calls"] = counter.take()
    out["groups"] = {k: list(v) for k, v in getattr(coll, "_groups", {}).items()} if kind == "groups" else {}
    return out


def _forward(counter: Counter, key: str, rank: int, world: int) -> Dict[str, Any]:
    metric = classes()["Mixed"](dist_sync_on_step=True)
    steps = []
    counter.take()
    for step in range(STEPS):
        got = attempt(lambda step=step: metric(key, step, rank, rows_for(rank, world, False)))
        got["calls"] = counter.take()
        steps.append(got)
    final = attempt(metric.compute)
    final["calls"] = counter.take()
    return {"steps": steps, "compute": final}


def _user_fn(counter: Counter, rank: int, world: int) -> Dict[str, Any]:
    from torchmetrics.utilities import distributed as tmd

    def user_gather(tensor: torch.Tensor, group: Any = None) -> List[torch.Tensor]:
        return tmd.gather_all_tensors(tensor, group)

    return _states(counter, "user", rank, world, False, dist_sync_fn=user_gather)


def _records(counter: Counter, rank: int, world: int) -> Dict[str, Any]:
    """Deferred records ride in the exchange: a stand-in for ``tmpatch.runtime.deferred``'s
    ``local_records``/``set_synced`` (rank r holds ``nan`` = r + 1; rank 1 also ``range`` = 5)."""
    from tmpatch.runtime import deferred

    saved = {name: getattr(deferred, name, None) for name in ("local_records", "set_synced")}
    synced: Dict[str, List[Dict[str, int]]] = {}
    deferred.local_records = lambda metric: dict(getattr(metric, "_test_records", {}))
    deferred.set_synced = lambda metric, totals: synced.setdefault(metric._test_name, []).append(
        {name: int(value) for name, value in totals.items()})
    try:
        metric = classes()["Mixed"]()
        metric._test_name = "single"
        metric._test_records = {"nan": torch.tensor(rank + 1)}
        if rank == 1:
            metric._test_records["range"] = torch.tensor(5)
        for step in range(STEPS):
            metric.update("records", step, rank, rank + 1)
        counter.take()
        single = attempt(metric.compute)
        single["calls"] = counter.take()
        coll = collection("issue")
        coll.update(value=torch.ones(2), preds=torch.zeros(2, dtype=torch.long), target=torch.ones(2, dtype=torch.long))
        for name, member in coll.items(keep_base=True):
            member._test_name = name
            member._test_records = {"nan": torch.tensor(10 * rank + len(name))} if name != "sum" else {}
        counter.take()
        whole = attempt(coll.compute)
        whole["calls"] = counter.take()
    finally:
        for name, value in saved.items():
            if value is None:
                delattr(deferred, name)
            else:
                setattr(deferred, name, value)
    return {"single": single, "collection": whole, "synced": synced}


def _kind(counter: Counter, rank: int, world: int) -> Dict[str, Any]:
    """Rank 0 syncs a collection's members together; on the other ranks only one
    member is set to sync (``_to_sync``), so it syncs on its own."""
    coll = collection("issue")
    coll.update(value=torch.ones(2), preds=torch.zeros(2, dtype=torch.long), target=torch.ones(2, dtype=torch.long))
    if rank:
        for name, member in coll.items(keep_base=True, copy_state=False):
            member._to_sync = name == "mean"
    counter.take()
    out = attempt(coll.compute)
    out["calls"] = counter.take()
    return out


def _errors(counter: Counter, rank: int, world: int) -> Dict[str, Any]:
    """Ranks that disagree: every rank raises the same clear error, no collective left pending."""
    from tmpatch.patches.coalesced_sync import wire

    out: Dict[str, Any] = {}
    saved = wire.VERSION
    if rank == 1:
        wire.VERSION = saved + 98
    try:
        out["version"] = _states(counter, "v", rank, world, False)
    finally:
        wire.VERSION = saved
    out["structure"] = _states(counter, "s", rank, world, False, extra=rank == 0)
    out["empty-dtype"] = _states(counter, "e", rank, world, True, label_dtype=torch.int64)
    out["lengths"] = _states(counter, "l", rank, world, False, longer=rank == 0)
    out["kind"] = _kind(counter, rank, world)
    out["after"] = _states(counter, "a", rank, world, False)  # the process group is still in step
    return out


def run_all(rank: int, world: int, modes: Sequence[str], empty_ok: bool) -> Dict[str, Any]:
    import torch.distributed as dist
    import torchmetrics

    import tmpatch  # noqa: F401 - before torchmetrics, as a user would

    sub = dist.new_group([1, 2]) if world == 3 else None
    counter = Counter()
    result: Dict[str, Any] = {"release": torchmetrics.__version__, "rank": rank, "state": {}, "cases": {}}
    for mode in modes:
        result["state"][mode] = set_mode(mode)
        cases: Dict[str, Any] = {}
        cases["states"] = _states(counter, "states", rank, world, False)
        if empty_ok or mode != "unpatched":  # before 1.4.0 an empty list state makes the release's ranks diverge
            cases["states-empty"] = _states(counter, "empty", rank, world, True)
        cases["issue"] = _collection(counter, "issue", "issue", rank, world)
        cases["groups"] = _collection(counter, "groups", "groups", rank, world)
        cases["forward"] = _forward(counter, "forward", rank, world)
        cases["user-fn"] = _user_fn(counter, rank, world)
        if sub is not None and rank in (1, 2):
            cases["sub-states"] = _states(counter, "sub", rank, world, False, process_group=sub)
            cases["sub-issue"] = _collection(counter, "issue", "sub-issue", rank, world, process_group=sub)
        if mode != "unpatched":
            cases["records"] = _records(counter, rank, world)
            cases["errors"] = _errors(counter, rank, world)
        result["cases"][mode] = cases
        dist.barrier()
        counter.take()
    return result


def _init(rank: int, world: int, init_method: str, timeout: float = PG_TIMEOUT) -> None:
    from datetime import timedelta

    import torch.distributed as dist

    _watchdog()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout))


def run_rank(rank: int, world: int, init_method: str, out_dir: str, modes: Sequence[str], empty_ok: bool) -> None:
    """Entry point (``ddp_launch.spawn``): every case, every mode."""
    _init(rank, world, init_method)
    try:
        save(out_dir, rank, run_all(rank, world, modes, empty_ok))
    finally:
        _finish()


#: the process group's timeout in the mixed run (seconds): a mismatch waits this long
MIXED_TIMEOUT = 6.0


def run_mixed(rank: int, world: int, init_method: str, out_dir: str, patched: Sequence[int]) -> None:
    """Ranks in ``patched`` run coalesced_sync, the others the release: nobody gets a value."""
    _init(rank, world, init_method, MIXED_TIMEOUT)
    import tmpatch

    if rank in patched:
        tmpatch.apply("coalesced_sync")
    metric = classes()["Mixed"]()
    metric.update("mixed", 0, rank, rank + 1)
    start = time.monotonic()
    out = attempt(metric.compute)
    out["seconds"] = time.monotonic() - start
    out["state"] = tmpatch.status()["coalesced_sync"].state
    save(out_dir, rank, out)
    sys.stdout.flush()
    os._exit(0)  # the process group is broken after a timeout: do not wait in its teardown


def run_releases(rank: int, world: int, init_method: str, out_dir: str, folders: Sequence[str]) -> None:
    """Rank r imports the torchmetrics release in ``folders[r]``; every rank runs coalesced_sync."""
    sys.path.insert(0, folders[rank])
    _init(rank, world, init_method)
    try:
        import torchmetrics

        import tmpatch

        tmpatch.apply("coalesced_sync")
        counter = Counter()
        out = _collection(counter, "issue", "releases", rank, world)
        out["release"] = torchmetrics.__version__
        out["state"] = tmpatch.status()["coalesced_sync"].state
        save(out_dir, rank, out)
    finally:
        _finish()
