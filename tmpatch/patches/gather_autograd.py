"""gather_autograd: the local rank's own tensor in the gathered list, graph intact.

Defect: ``_simple_gather_all_tensors`` and the uneven-shape path of
``gather_all_tensors`` return the all-gathered *copies* for every rank,
including the calling one, so a metric used as a loss with
``dist_sync_on_step=True`` loses its autograd graph (upstream issue #2745).
Fixed upstream in 1.6.0 (PR #2754: ``gathered[get_rank(group)] = result``).

Releases: 0.10.0-1.5.2 patched; 1.6.0 onwards not needed. The gathered values
are the release's own; only the local entry is the caller's tensor (as 1.6.0
does), at its rank within ``group``.
``gather_all_tensors`` is also held as the default of
``Metric._sync_dist(dist_sync_fn=...)``: the engine rebinds it there too.
"""
from __future__ import annotations

from types import ModuleType
from typing import Any, Callable, List

from tmpatch.spec import Patch, Target, Variant, since, span


def _build_simple(module: ModuleType) -> Callable[..., Any]:
    import torch

    def _simple_gather_all_tensors(original: Callable, result: Any, group: Any, world_size: int) -> List[Any]:
        with torch.no_grad():
            gathered = [torch.zeros_like(result) for _ in range(world_size)]
            torch.distributed.all_gather(gathered, result, group)
        rank = torch.distributed.get_rank(group)
        if 0 <= rank < len(gathered):  # -1 on a rank outside ``group``: keep the release's answer
            gathered[rank] = result
        return gathered

    return _simple_gather_all_tensors


def _build_gather(module: ModuleType) -> Callable[..., Any]:
    import torch

    def gather_all_tensors(original: Callable, result: Any, group: Any = None) -> List[Any]:
        gathered = original(result, group)
        rank = torch.distributed.get_rank(torch.distributed.group.WORLD if group is None else group)
        if 0 <= rank < len(gathered):  # -1 on a rank outside ``group``: keep the release's answer
            gathered[rank] = result.contiguous()  # the tensor the release gathered, with its graph
        return gathered

    return gather_all_tensors


PATCH = Patch(
    name="gather_autograd",
    summary="gathered metric states keep the local rank's autograd graph",
    known=since("0.10.0"),
    upstream="#2745; fixed in 1.6.0 by PR #2754",
    changes=("a metric used as a loss with dist_sync_on_step=True keeps this rank's autograd graph, so backward() "
             "works as on 1.6.0+ (was: RuntimeError, no grad); values are the release's"),
    targets=(
        Target(
            module="torchmetrics.utilities.distributed",
            qualname="_simple_gather_all_tensors",
            variants=(
                Variant(span("0.10.0", "1.5.2"), "94db0822ce7563d9", _build_simple),
                Variant(span("1.6.0", "1.9.0"), "811ba447d8bd721b"),
            ),
        ),
        Target(
            module="torchmetrics.utilities.distributed",
            qualname="gather_all_tensors",
            variants=(
                Variant(span("0.10.0", "1.5.2"), "d303e452a82b0edc", _build_gather),
                Variant(span("1.6.0", "1.8.2"), "c677f69bb6977523"),
                Variant(span("1.9.0"), "bc3f9f86e5dc4800"),
            ),
        ),
    ),
)
