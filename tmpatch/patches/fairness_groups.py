"""fairness_groups: the group-fairness metrics split a batch by group without copying group sizes to the host.

Defect: ``torchmetrics.functional.classification.group_fairness._binary_groups_stat_scores``
sorts the batch by group id, counts the rows of each group present with
``_flexible_bincount`` (``torch.unique`` and ``torch.bincount``: data-dependent sizes),
copies those counts to the host (``.cpu().tolist()``) and splits the batch with them,
then sums each part: several syncs on every ``update()`` of BinaryFairness and
BinaryGroupStatRates (``validate_args=False``; validation adds its own reads). Not
fixed upstream (1.9.0 included).

Repair: the class ``update`` of both metrics marks the update (a context variable,
when the metric has a deferred-report book: built while ``deferred_reports`` is
applied). Inside it, one statement of the release's function (the copy of the sizes;
an edit, :mod:`tmpatch.engine.rewrite`) hands the sorted batch to :func:`group_stats`, which
numbers the distinct group ids in sorted order on the device (a cumulative sum of
"id differs from the previous one") and counts true/false positives/negatives per
number with the release's comparisons, into ``num_groups`` fixed bins, which
``_update_states`` adds to the four states at once (upstream: four indexed additions
per group). The release gives the i-th *present* group's counts to slot i of the
states (a batch with groups {0, 2} adds group 2 to slot 1): so does the patch, bit
for bit; slots past the present groups get zeros, which leave the states as they were.

More distinct ids than ``num_groups`` (upstream: ``IndexError`` in ``update()``, after
the first ``num_groups`` slots were added): on the CPU the release's split runs, its
error from that update; on a device the rows of the extra groups are left out (the states
are the ones upstream leaves behind its error) and the release's ``IndexError`` (torch's
words, then tmpatch's note) is raised once, from a later update, the next ``compute()`` or
settle point. Not covered (the release's code runs): the functional
API (its result has one entry per present group), float group ids, group tensors with
more than one column, empty batches, metrics built before ``apply()``. Before 1.6.1 the
binary formatter also reads ``preds`` to choose a sigmoid: the ``logits_check`` patch,
which this one requires, removes that read.

Policy ``checks`` (``TMPATCH_CHECKS``): ``eager`` leaves the update unmarked, so the release's
code runs, its error raised in ``update()`` with its syncs.

Releases: 1.0.0-1.9.0 (two implementations of ``_binary_groups_stat_scores`` and of
``_update_states``, differing in annotations; two of each class ``update``).
"""
from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any, Callable, Dict, List, Optional, Tuple

from tmpatch.runtime import deferred, host
from tmpatch.runtime.compiled import compiling
from tmpatch.runtime.deferred.marking import Marker
from tmpatch.spec import PATCHED, Decline, Edit, Label, Patch, Rewrite, Target, Together, Variant, since, span


def _report(top: Any, found: List[Tuple[Any, int]], all_ranks: bool) -> None:
    """On a device: the release's IndexError (torch's words for slot ``num_groups``), once, for the rows left
    out since the last one."""
    import torch

    count = sum(n for _, n in found)
    groups = sorted({getattr(metric, "num_groups", "?") for metric, _ in found}, key=str)
    size = groups[0] if len(groups) == 1 and type(groups[0]) is int else 1
    try:
        torch.zeros(size)[size]  # the release's error: ``self.tp[group] += tp`` past the last slot
        message = f"index {size} is out of bounds for dimension 0 with size {size}"
    except IndexError as exc:
        message = str(exc)
    names = sorted({type(metric).__name__ for metric, _ in found if metric is not top})
    name = type(top).__name__ + (f" ({', '.join(names)} inside)" if names else "")
    where = " on some rank" if all_ranks else ""
    raise deferred.error_as_release(IndexError, message, (
        f"tmpatch fairness_groups: {count} row(s) seen by update() of {name}{where} since the last report "
        f"belonged to groups beyond num_groups={', '.join(map(str, groups))} (a batch had more distinct group "
        f"ids than num_groups) and were left out of the counts; reported at {deferred.point()} instead of in "
        "update(), where the release raises it after adding the first num_groups groups. Group ids should be "
        "0, 1, ..., num_groups - 1. TMPATCH_CHECKS=eager raises it in update(), as without tmpatch"))


#: rows of groups beyond num_groups, reported at compute
RECORD = deferred.Record("fairness_groups", _report)

#: the marked update of the metric running in this thread / task (class ``update`` below)
MARK = Marker("tmpatch_fairness", RECORD)
build_update = MARK.build_update


class GroupStats(Sequence):
    """The per-slot ``(tp, fp, tn, fn)`` of a marked update, as the release's list of
    tuples (slots ``0 .. num_groups - 1``), made from one ``(num_groups, 4)`` tensor of
    counts that :func:`build_update_states` adds to the states at once."""

    __slots__ = ("bins",)

    def __init__(self, bins: Any) -> None:
        self.bins = bins

    def __len__(self) -> int:
        return int(self.bins.shape[0])

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        return tuple(self.bins[index].unbind(0))


def _helpers(module: ModuleType) -> Dict[str, Any]:
    import torch

    integral = frozenset({torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64})
    int64, zeros, where, cat = torch.int64, torch.zeros, torch.where, torch.cat

    def group_stats(preds: Any, target: Any, indexes: Any, num_groups: Any) -> Optional[GroupStats]:
        """The per-group ``(tp, fp, tn, fn)`` of a marked update, one per slot
        ``0 .. num_groups - 1``; None (the release's split runs) elsewhere."""
        metric = MARK.get()
        if (metric is None or type(num_groups) is not int or num_groups < 1 or indexes.dim() != 1
                or indexes.dtype not in integral or not indexes.numel() or preds.dim() != 2
                or preds.shape != target.shape or preds.shape[0] != indexes.shape[0]):
            return None
        # the number of each row's group among the distinct ids, in sorted order (ids are sorted)
        rank = cat([zeros(1, dtype=int64, device=indexes.device), (indexes[1:] != indexes[:-1]).cumsum(0)])
        kept = rank < num_groups
        if host.on_host(indexes) and not compiling():
            if not bool(kept[-1]):  # a free read on the CPU: the release's split adds the first groups and raises
                return None
        else:
            RECORD.add(metric, (~kept).sum())
        # the release's comparisons (_binary_stat_scores_update): tp 0, fp 1, tn 2, fn 3
        same, positive = target == preds, target == 1
        kind = where(positive, where(same, 0, 3), where(same, 2, 1))
        counted = (positive | (target == 0)) & kept.unsqueeze(1)
        code = where(counted, rank.unsqueeze(1) * 4 + kind, 0).flatten()
        bins = zeros(num_groups * 4, dtype=int64, device=preds.device)
        bins.scatter_add_(0, code, counted.flatten().to(int64))
        return GroupStats(bins.view(num_groups, 4))

    return {"_tmpatch_group_stats": group_stats}


def build_update_states(module: ModuleType) -> Callable[..., Any]:
    """``_AbstractGroupStatScores._update_states``: the counts of a marked update added to
    the four states at once (in place, as the release's ``self.tp[group] += tp`` per
    group; slots past the present groups add zero)."""

    def _update_states(original: Callable, self: Any, group_stats: Any) -> Any:
        if type(group_stats) is not GroupStats:
            return original(self, group_stats)
        bins = group_stats.bins
        for column, name in enumerate(("tp", "fp", "tn", "fn")):
            getattr(self, name).add_(bins[:, column])
        return None

    return _update_states


_SPLIT = "split_sizes = _flexible_bincount(indexes).detach().cpu().tolist()\n"

#: the copy of the group sizes, preceded by the device-side counts in a marked update
GROUPS = Rewrite(
    (Edit(_SPLIT, "_tmpatch_stats = _tmpatch_group_stats(preds, target, indexes, num_groups)\n"
                  "if _tmpatch_stats is not None:\n"
                  "    return _tmpatch_stats\n" + _SPLIT),),
    _helpers,
)

_FAIRNESS = "torchmetrics.classification.group_fairness"

PATCH = Patch(
    name="fairness_groups",
    summary="BinaryFairness and BinaryGroupStatRates copy the group sizes to the host (torch.unique, bincount, "
            ".cpu()) to split each batch; counted per group on the device instead",
    known=since("0.10.0"),
    declines=(Decline(span("0.10.0", "0.11.4"),
                      "nothing to repair: BinaryFairness and BinaryGroupStatRates came in 1.0.0",
                      needed=False),),
    upstream="not fixed upstream (_binary_groups_stat_scores splits the batch by group on the host)",
    changes="on a GPU more distinct group ids than num_groups raise the release's IndexError once "
            "(from a later update(), or compute()), the extra groups left out "
            "(upstream and on the CPU: IndexError in that update(), after adding the first num_groups)",
    requires=("deferred_reports", "logits_check"),  # before 1.6.1 the binary formatter reads the values too
    labels=(
        Label(PATCHED, "group fairness: the group sizes are copied to the host to split the batch; the "
              "fairness_groups patch counts per group on the device",
              function="_binary_groups_stat_scores"),
        Label(PATCHED, "torch.unique of the group ids (fairness update; the fairness_groups patch removes it) or "
              "of the query ids (retrieval compute, where the query sizes set the split)",
              function="_flexible_bincount", op="aten._unique2"),
    ),
    together=(
        Together("the group counts made in the one are added to the states by the other",
                 targets=("_binary_groups_stat_scores", "_AbstractGroupStatScores._update_states")),
        Together("the update marks the group counts of those two",
                 targets=("BinaryGroupStatRates.update", "BinaryFairness.update"),
                 on=("_binary_groups_stat_scores", "_AbstractGroupStatScores._update_states")),
    ),
    targets=(
        Target(
            module="torchmetrics.functional.classification.group_fairness",
            qualname="_binary_groups_stat_scores",
            variants=(
                Variant(span("1.0.0", "1.5.2"), "738cd4996b378075", GROUPS),
                Variant(span("1.6.0", "1.9.0"), "8c024e10722ed461", GROUPS),  # annotations only
            ),
        ),
        Target(
            module=_FAIRNESS,
            qualname="_AbstractGroupStatScores._update_states",
            variants=(
                Variant(span("1.0.0", "1.5.2"), "699ef28f894ee2d7", build_update_states),
                Variant(span("1.6.0", "1.9.0"), "d1aff105fc626c48", build_update_states),  # annotation only
            ),
        ),
        Target(
            module=_FAIRNESS,
            qualname="BinaryGroupStatRates.update",
            variants=(
                Variant(span("1.0.0", "1.0.3"), "b58b88a5de05ee86", build_update),
                Variant(span("1.1.0", "1.9.0"), "7dd1b32177eab606", build_update),  # annotations only
            ),
        ),
        Target(
            module=_FAIRNESS,
            qualname="BinaryFairness.update",
            variants=(
                Variant(span("1.0.0", "1.0.3"), "cf6a1cf8905ee0b0", build_update),
                Variant(span("1.1.0", "1.9.0"), "f0695405d7276e6c", build_update),  # ``groups`` no longer Optional
            ),
        ),
    ),
)
