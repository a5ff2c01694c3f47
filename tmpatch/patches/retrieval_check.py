"""retrieval_check: the retrieval metrics' binary-target check without a device read.

Defect: ``torchmetrics.utilities.checks._check_retrieval_target_and_prediction_types``
runs ``if not allow_non_binary_target and (target.max() > 1 or target.min() < 0):
raise ValueError(...)`` on every ``update()`` of RetrievalMAP, RetrievalMRR,
RetrievalPrecision, RetrievalRecall, RetrievalFallOut, RetrievalHitRate,
RetrievalRPrecision, RetrievalAUROC, RetrievalPrecisionRecallCurve and
RetrievalRecallAtFixedPrecision (every retrieval metric but RetrievalNormalizedDCG):
one or two device reads per step, with no argument to turn it off. Not fixed
upstream (1.9.0 included).

Repair: the class ``update`` of ``RetrievalMetric`` and of
``RetrievalPrecisionRecallCurve`` (every retrieval metric inherits one of them) marks
the update with the metric it runs for (a context variable, when the metric has a
deferred-report book: built while ``deferred_reports`` is applied). Inside such an
update on a device the check runs as the release's own function with the value check
turned off (its dtype checks and conversions unchanged), and the release's condition,
evaluated on the same tensor (``max > 1 or min < 0``, NaN included as the release reads
it), is added on the device to the metric's book; the release's ``ValueError`` (its
message first, tmpatch's note after it) is raised once, from a later update, ``compute()``
or the next settle point (a ``reset()`` resets first, then raises). On the CPU, where the
read costs nothing, the release's function runs as it is: its error from that update,
before the batch is appended. Boolean targets cannot fail the check and skip it.

Deliberate difference (on a device only): a batch with a non-binary target is kept in the
metric's states (upstream, ``update()`` raised before appending it); the report says so,
and ``reset()`` discards it. Not covered (the release's code runs): the functional API,
metrics built before ``apply()``. The ``ignore_index`` removal in
``_check_retrieval_inputs`` stays: the states keep the values that remain.

Policy ``checks`` (``TMPATCH_CHECKS``): ``eager`` leaves the update unmarked, so the release's
code runs, its error raised in ``update()`` with its syncs.

Releases: 0.10.0-1.9.0 (two implementations of the check, differing in an annotation;
one of each class ``update``).
"""
from __future__ import annotations

from types import ModuleType
from typing import Any, Callable, List, Tuple

from tmpatch.runtime import deferred, host
from tmpatch.runtime.compiled import compiling
from tmpatch.runtime.deferred.marking import Marker
from tmpatch.spec import INHERENT, PATCHED, Label, Patch, Target, Together, Variant, gated, since, span

#: the release's message (the same text in every release 1.0.0-1.9.0)
MESSAGE = "`target` must contain `binary` values"


def _report(top: Any, found: List[Tuple[Any, int]], all_ranks: bool) -> None:
    """On a device: the release's ValueError, once, for every update that failed the check."""
    count = sum(n for _, n in found)
    names = sorted({type(metric).__name__ for metric, _ in found if metric is not top})
    name = type(top).__name__ + (f" ({', '.join(names)} inside)" if names else "")
    where = " on some rank" if all_ranks else ""
    raise deferred.error_as_release(ValueError, MESSAGE, (
        f"tmpatch retrieval_check: {count} update(s) of {name}{where} since the last report had a "
        f"`target` with values outside [0, 1]; reported at {deferred.point()} instead of in update(). Unlike without "
        "tmpatch, those batches were added to the metric's states: reset() discards them. "
        "TMPATCH_CHECKS=eager raises it in update(), as without tmpatch"))


#: updates whose target failed the check, reported at compute
RECORD = deferred.Record("retrieval_check", _report)

#: the marked update of the metric running in this thread / task (class ``update`` below)
MARK = Marker("tmpatch_retrieval", RECORD)
build_update = MARK.build_update


def build_check(module: ModuleType) -> Callable[..., Any]:
    """``_check_retrieval_target_and_prediction_types``: inside a marked update, the
    release's function without its value check, and the check counted on the device."""
    import torch

    bool_, Tensor = torch.bool, torch.Tensor
    aminmax = getattr(torch, "aminmax", None)  # torch >= 1.11; else max and min

    def bounds(target: Any) -> Tuple[Any, Any]:
        if aminmax is not None:
            try:
                low, high = aminmax(target)
                return low, high
            except RuntimeError:  # float16 on the CPU before torch 2.2: min and max give the same
                pass
        return target.min(), target.max()

    @gated(MARK.slot)
    def check(original: Callable, preds: Any, target: Any, allow_non_binary_target: bool = False) -> Any:
        metric = MARK.get()
        if (metric is None or allow_non_binary_target or not isinstance(target, Tensor)
                or (host.on_host(target) and not compiling())):
            # the release's function: on the CPU its check is read at once, its error raised before the append
            return original(preds, target, allow_non_binary_target)
        out = original(preds, target, True)  # the release's dtype checks and conversions; raises as it does
        if target.dtype is bool_:  # max <= 1 and min >= 0: the check cannot fail
            return out
        low, high = bounds(target)
        RECORD.add(metric, (high > 1) | (low < 0))
        return out

    return check


_CHECKS = "torchmetrics.utilities.checks"

PATCH = Patch(
    name="retrieval_check",
    summary="every retrieval metric but NDCG reads target.max() and target.min() on each update() to check "
            "for binary targets; the check is counted on the device and reported later, once, without a sync",
    known=since("0.10.0"),
    upstream="not fixed upstream (no argument turns the check off)",
    changes="on a GPU a non-binary retrieval target raises the release's ValueError once "
            "(from a later update(), or compute()), and that batch is in the states "
            "(upstream and on the CPU: raised in that update(), batch not added)",
    requires=("deferred_reports",),
    labels=(
        Label(PATCHED, "retrieval metrics check for binary targets with target.max() > 1 or target.min() < 0 "
              "(device reads); the retrieval_check patch counts it on the device and reports it later, once",
              function="_check_retrieval_target_and_prediction_types", op="aten._local_scalar_dense"),
        Label(INHERENT, "ignore_index: retrieval metrics remove the ignored positions before appending the values "
              "to their list states (the states hold the kept values)",
              function="_check_retrieval_inputs", op="aten.index", patch="retrieval_check"),
    ),
    together=(Together("they mark the update for the check, which defers only in a marked update",
                       targets=("RetrievalMetric.update", "RetrievalPrecisionRecallCurve.update"),
                       on=("_check_retrieval_target_and_prediction_types",)),),
    targets=(
        Target(
            module=_CHECKS,
            qualname="_check_retrieval_target_and_prediction_types",
            variants=(
                Variant(span("0.10.0", "1.5.2"), "097673780a9872d6", build_check),
                Variant(span("1.6.0", "1.9.0"), "3fd183315c42c5ee", build_check),  # annotation only
            ),
        ),
        Target(
            module="torchmetrics.retrieval.base",
            qualname="RetrievalMetric.update",
            variants=(Variant(span("0.10.0", "1.9.0"), "104945510509e2fe", build_update),),
        ),
        Target(
            module="torchmetrics.retrieval.precision_recall_curve",
            qualname="RetrievalPrecisionRecallCurve.update",
            variants=(Variant(span("0.10.0", "1.9.0"), "104945510509e2fe", build_update),),
        ),
    ),
)
