"""coalesced_sync: a metric's states, and a MetricCollection's, synced in two collectives.

Defect (a cost, every release 0.10.0-1.9.0): ``Metric._sync_dist`` hands each
state to ``gather_all_tensors`` on its own, and that makes a ``barrier``, an
``all_gather`` of the local shape (not for 0-d states) and an ``all_gather`` of
the data: 2-3 collectives per state, every one a point where all ranks wait
(with NCCL also a host-device sync). ``MetricCollection.compute()`` pays that
for every member; ``forward()`` with ``dist_sync_on_step=True`` on every step.
Upstream only pre-concatenates list states (torchmetrics PR #217); no issue.

What the patch does: wraps ``Metric._sync_dist`` (3 implementations: 0.10.0-1.3.2,
1.4.0/1.4.0.post0, 1.4.1-1.9.0) so that every tensor it would gather goes in one
exchange of two ``all_gather`` calls (:mod:`.wire`), then runs the release's own
``_sync_dist`` with a ``dist_sync_fn`` that hands back the gathered tensors
(:mod:`.plan`): stacking, list flattening and every reduction (sum, mean, max,
min, cat, None, custom callables) are the release's. Wraps
``MetricCollection.compute`` (3 implementations) so that the members about to
sync exchange their states together (two ``all_gather`` per process group and
device), before they compute (:mod:`.flow`). The deferred reports' records
(:mod:`tmpatch.runtime.deferred`, when it has ``local_records``/``set_synced``) ride in
the same buffers, summed over the ranks.

Values are the release's bit for bit; the local rank's entry is the caller's
tensor where the release (1.6.0+) or tmpatch's ``gather_autograd`` keeps the
graph, a copy otherwise, as the release. A user-supplied ``dist_sync_fn`` keeps
the release's path. Ranks that do not all run this patch never pair silently:
see :mod:`.wire` and the README (a mismatch waits for the process group's
timeout, or raises :class:`.wire.CoalescedSyncError`).
"""
from __future__ import annotations

import functools
import sys
from types import ModuleType
from typing import Any, Callable

from tmpatch.patches.coalesced_sync import flow
from tmpatch.patches.coalesced_sync.plan import Rules
from tmpatch.runtime import wrappers
from tmpatch.spec import Patch, Recognised, Requirement, Target, Together, Variant, since, span, told

#: fingerprints of ``torchmetrics.utilities.distributed.gather_all_tensors`` whose
#: results this patch reproduces, and whether the local entry is the caller's tensor
GATHER = {"d303e452a82b0edc": False, "c677f69bb6977523": True, "bc3f9f86e5dc4800": True}

#: the release's ``gather_all_tensors``, whose results the exchange reproduces: known code only
GATHER_ALL = Requirement("torchmetrics.utilities.distributed", "gather_all_tensors", tuple(GATHER))

#: ``Metric._sync_dist`` implementations -> where "empty cat list becomes an empty tensor" is decided
SYNC_DIST = {"1d74f45e742cadc5": "never", "b4c07d74bf52ab7a": "module", "ea31593b2f29b2fd": "metric"}

#: the target whose implementation decides the "empty cat list" rule
SYNC_DIST_PATH = "torchmetrics.metric.Metric._sync_dist"


class TorchTooOld(RuntimeError):
    """This torch lacks what the exchange needs (byte views of any dtype, lazy views resolved)."""


def _check_torch() -> None:
    import torch

    try:
        torch.frombuffer(bytearray(16), dtype=torch.uint8).view(torch.float64).view(torch.uint8)
        torch.zeros(1).resolve_conj().resolve_neg()
    except (AttributeError, RuntimeError, TypeError) as exc:
        raise TorchTooOld(f"torch {torch.__version__} cannot view bytes as other dtypes ({exc})") from None


@functools.lru_cache(maxsize=None)
def _rules_for(where: str, keeps_graph: bool, gather: Callable[..., Any]) -> Rules:
    _check_torch()
    metric_module = sys.modules["torchmetrics.metric"]
    if where == "never":
        empty: Callable[[Any], bool] = lambda metric: False  # noqa: E731
    elif where == "module":
        empty = lambda metric: bool(getattr(metric_module, "_TORCH_GREATER_EQUAL_2_1", False))  # noqa: E731
    else:
        empty = lambda metric: bool(getattr(metric, "_TORCH_GREATER_EQUAL_2_1", False))  # noqa: E731
    return Rules(cat=metric_module.dim_zero_cat, empty=empty, raw=gather, keeps_graph=keeps_graph)


def _rules(recognised: Recognised) -> Rules:
    """The rules of the loaded release, by what the gating recognised of its ``_sync_dist``
    and ``gather_all_tensors`` (the release's own function, underneath any tmpatch layer)."""
    distributed = sys.modules["torchmetrics.utilities.distributed"]
    where = SYNC_DIST[recognised[SYNC_DIST_PATH]]  # type: ignore[index]  # recognised: a fingerprint
    keeps_graph = GATHER[recognised[GATHER_ALL.path]]  # type: ignore[index]  # recognised: a fingerprint
    return _rules_for(where, keeps_graph, wrappers.get_original(distributed.gather_all_tensors))


@told
def _build_sync_dist(module: ModuleType, recognised: Recognised) -> Callable[..., Any]:
    import torch

    if tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) < (2, 5):
        # its byte buffer fails on torch 2.1 ("Invalid scalar type"): the release's sync stays
        raise RuntimeError(f"coalesced_sync needs torch 2.5 or later (this is {torch.__version__})")

    rules = _rules(recognised)
    return functools.partial(flow.sync_dist, rules)


@told
def _build_collection_compute(module: ModuleType, recognised: Recognised) -> Callable[..., Any]:
    rules = _rules(recognised)
    metric_module = sys.modules["torchmetrics.metric"]
    metric_class = metric_module.Metric

    def compute(original: Callable[..., Any], collection: Any) -> Any:
        if not wrappers.is_patched(vars(metric_class)["_sync_dist"]):
            return original(collection)
        return flow.collection_compute(rules, metric_class, metric_module, original, collection)

    return compute


PATCH = Patch(
    name="coalesced_sync",
    summary="metric states sync across ranks in two collectives per metric or per MetricCollection",
    known=since("0.10.0"),
    upstream="none (every release gathers each state on its own; PR #217 pre-concatenates list states)",
    changes="a rank that does not run coalesced_sync makes the sync fail (timeout or a clear error), never a value",
    relies_on=(GATHER_ALL,),
    together=(Together("the collection syncs its metrics with Metric._sync_dist's exchange",
                       targets=("MetricCollection.compute",), on=("Metric._sync_dist",)),),
    targets=(
        Target(
            module="torchmetrics.metric",
            qualname="Metric._sync_dist",
            variants=(
                Variant(span("0.10.0", "1.3.2"), "1d74f45e742cadc5", _build_sync_dist),
                Variant(span("1.4.0", "1.4.0.post0"), "b4c07d74bf52ab7a", _build_sync_dist),
                Variant(span("1.4.1", "1.9.0"), "ea31593b2f29b2fd", _build_sync_dist),
            ),
        ),
        Target(
            module="torchmetrics.collections",
            qualname="MetricCollection.compute",
            variants=(
                Variant(span("0.10.0", "0.11.4"), "97cc99497c252f69", _build_collection_compute),
                Variant(span("1.0.0", "1.5.2"), "efbd8312bb0b8610", _build_collection_compute),
                Variant(span("1.6.0", "1.9.0"), "ebc04c290ed14244", _build_collection_compute),
            ),
        ),
    ),
)
