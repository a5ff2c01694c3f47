"""bincount: ``torchmetrics.utilities.data._bincount`` without a device read, in updates.

Defect: on CUDA, ``torch.bincount`` reads the input's minimum and maximum back
to the host to size its output (ATen ``_bincount_cuda_template``): two syncs on
every call, and ``_bincount`` runs on every ``update()`` of a multiclass
stat-scores metric (Accuracy, Precision, Recall, F1, FBeta, Specificity,
HammingDistance, NegativePredictiveValue, StatScores) with ``top_k=1``,
``multidim_average="global"`` and ``average`` other than ``"micro"``. In
deterministic mode upstream falls back to a for-loop (1.0.0-1.2.0, one
device write per class) or to an N x minlength mesh (1.2.1-1.9.0), which is
O(N * minlength) in time and memory. Not fixed upstream (1.9.0 included); see
DESIGN.md §3.

Replacement: when ``minlength`` is given and the call happens inside the
``update()`` of a metric carrying the record (every ``MulticlassStatScores``
subclass built after ``apply()``), counts go into a fixed-size int64 tensor
on the input's device with ``scatter_add_``: no host read, no mesh,
deterministic (integer sums; ``scatter_add_`` of a CUDA tensor is on
torch's deterministic list). Counts are bit-identical to ``torch.bincount``
for input in ``[0, minlength)``. On the CPU, where reading a value is no
sync, in-range input goes to ``torch.bincount`` itself (faster than the
scatter, and deterministic there); only out-of-range input takes the scatter.

Values outside ``[0, minlength)`` are not counted; their number is added to a
device-side :class:`tmpatch.deferred.Record` (metric state ``_tmpatch_bincount``)
and ``compute()`` raises a ``RuntimeError`` saying so, once, at the user's
next explicit ``compute()`` (the record is read in ``Metric.sync_context``,
after the states are synced across ranks). Upstream instead raises in
``update()``: ``torch.bincount`` refuses negatives ("bincount only supports
1-d non-negative integral inputs."), and a value >= minlength makes the output
longer, so the caller's ``bins.reshape(num_classes, num_classes)`` fails with
"shape '[C, C]' is invalid for input of size ...". Upstream's input
validation (``validate_args=True``, itself a sync) counts unique values but
does not check their range, so such input reaches ``_bincount`` with either
setting.

``ignore_index``: in the same updates (``top_k=1``, ``multidim_average="global"``),
``_multiclass_stat_scores_update`` first drops the positions where ``target ==
ignore_index`` with a boolean index (``preds[idx]``, ``target[idx]``: a
data-dependent shape, one sync each on CUDA), for ``average="micro"`` too.
Since the result only feeds counts, the patch masks those positions out of the
counts instead (same counts, same dtypes, bit for bit); kept values outside the
range go to the same record. The one-hot branches (``top_k > 1`` or
``"samplewise"``) already mask without a sync and stay the release's.

Everywhere else the release's own function runs: ``minlength=None``; a
non-integral or non-1-d input; outside a recorded metric's ``update()``
(functional API, compute-time callers such as AUROC's weights, confusion
matrices, Kendall); and under ``tmpatch.settings.policy["bincount"] == "eager"``
(``TMPATCH_BINCOUNT=eager``), which keeps upstream's behaviour exactly.

Deliberate differences: out-of-range values are reported at ``compute()``
rather than in ``update()``; in deterministic mode upstream's mesh/loop
silently dropped them, the patch reports them.

Releases: 1.0.0-1.9.0 (four upstream implementations of ``_bincount``, four of
``_multiclass_stat_scores_update`` whose counting branches are the same).
"""
from __future__ import annotations

import contextlib
import contextvars
import logging
from types import ModuleType
from typing import Any, Callable, Iterator, Optional, Tuple

from tmpatch import deferred, settings
from tmpatch.spec import Patch, Target, Variant

log = logging.getLogger("tmpatch")

#: the record of values outside ``[0, minlength)`` seen by ``_bincount`` in updates
RECORD = deferred.Record("bincount")

#: the metric whose ``update()`` is running (in this thread / task), if it carries the record
_current: "contextvars.ContextVar[Any]" = contextvars.ContextVar("tmpatch_bincount_metric", default=None)

#: on the CPU, send in-range input to torch.bincount (tests turn it off to check the scatter)
CPU_SHORTCUT = True

MESSAGE = (
    "tmpatch (bincount): {count} value(s) passed to `_bincount` by `update()` since the last `compute()` "
    "were outside [0, minlength) and were not counted. Without tmpatch `update()` would have raised "
    "(`torch.bincount` rejects negative values; a value >= minlength makes the confusion matrix the wrong "
    "size). Check that `preds` and `target` hold class indices in [0, num_classes) (values equal to "
    "`ignore_index` excepted); TMPATCH_BINCOUNT=eager restores upstream's error in the offending `update()`."
)


def _deferred() -> bool:
    return settings.policy.get("bincount", "deferred") == "deferred"


# -- counting -------------------------------------------------------------------------
def _counter() -> Callable[..., Any]:
    """``count(x, minlength, metric, keep=None)``: the counts of ``x`` in ``[0, minlength)``
    as int64 on ``x``'s device, leaving out positions where ``keep`` is False; in-range
    values not kept are not counted, and the kept values outside the range are added
    to the metric's record. No host read."""
    import torch

    zeros, where, int64 = torch.zeros, torch.where, torch.int64
    aminmax, bincount = torch.aminmax, torch.bincount
    states = "__dict__"
    name = RECORD.name

    def count(x: Any, minlength: int, metric: Any, keep: Any = None) -> Any:
        size = x.numel()
        if keep is None and size and CPU_SHORTCUT and x.device.type == "cpu":
            low, high = aminmax(x)  # on the CPU a read is no sync: keep torch.bincount's speed
            if low >= 0 and high < minlength:
                return bincount(x, minlength=minlength)  # deterministic on the CPU
        if minlength == 0:
            bad: Any = size if keep is None else keep.sum()
            out = zeros(0, dtype=int64, device=x.device)
        else:
            inside = (x >= 0) & (x < minlength)
            if keep is not None:
                inside &= keep
                size = keep.sum()  # the number of values that should have been counted
            index = where(inside, x, 0).to(int64)
            out = zeros(minlength, dtype=int64, device=x.device).scatter_add_(0, index, inside.to(int64))
            bad = size - out.sum() if x.numel() else 0  # counted values never exceed size: no overflow
        if x.numel():
            found = getattr(metric, states)
            found[name] = found[name] + bad  # RECORD.add, inlined
        return out

    return count


# -- _bincount -------------------------------------------------------------------
def _build_bincount(module: ModuleType) -> Callable[..., Any]:
    """Every release: the four implementations differ only in their fallbacks
    (loop or mesh) and in when they take them; the in-range counts are the same."""
    import torch

    integral = {torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64}
    count = _counter()

    def _bincount(original: Callable, x: Any, minlength: Optional[int] = None) -> Any:
        metric = _current.get()
        if (
            metric is None
            or minlength is None
            or type(minlength) is not int
            or minlength < 0
            or x.dtype not in integral
            or x.dim() != 1
            or not _deferred()
        ):
            return original(x, minlength=minlength)
        return count(x, minlength, metric)

    return _bincount


# -- ignore_index ----------------------------------------------------------------
def _build_stat_scores_update(module: ModuleType) -> Callable[..., Any]:
    """``_multiclass_stat_scores_update``, every release: its ``top_k=1``, ``"global"``
    branches drop ``target == ignore_index`` with a boolean index (``preds[idx]``, a
    data-dependent shape: a sync each) before counting. Here the ignored positions
    are masked out of the counts instead; the one-hot branches (``top_k > 1`` or
    ``"samplewise"``), which mask without a sync already, stay the release's."""
    import torch

    int64 = torch.int64
    count = _counter()

    def _multiclass_stat_scores_update(
        original: Callable,
        preds: Any,
        target: Any,
        num_classes: int,
        top_k: int = 1,
        average: Optional[str] = "macro",
        multidim_average: str = "global",
        ignore_index: Optional[int] = None,
    ) -> Tuple[Any, Any, Any, Any]:
        metric = _current.get()
        if (
            ignore_index is None
            or metric is None
            or multidim_average == "samplewise"
            or top_k != 1
            or not _deferred()
        ):
            return original(preds, target, num_classes, top_k, average, multidim_average, ignore_index)
        preds = preds.flatten()
        target = target.flatten()
        keep = target != ignore_index
        if average == "micro":
            hit = preds == target
            tp = (hit & keep).sum()
            fp = (~hit & keep).sum()
            fn = (~hit & keep).sum()
            tn = num_classes * keep.sum() - (fp + fn + tp)
            return tp, fp, tn, fn
        mapping = target.to(int64) * num_classes + preds.to(int64)
        confmat = count(mapping, num_classes**2, metric, keep).reshape(num_classes, num_classes)
        tp = confmat.diag()
        fp = confmat.sum(0) - tp
        fn = confmat.sum(1) - tp
        tn = confmat.sum() - (fp + fn + tp)
        return tp, fp, tn, fn

    return _multiclass_stat_scores_update


# -- the metrics ------------------------------------------------------------------
def _build_init(module: ModuleType) -> Callable[..., Any]:
    """``MulticlassStatScores.__init__``: attach the record."""

    def __init__(original: Callable, self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        RECORD.attach(self)

    return __init__


def _build_update(module: ModuleType) -> Callable[..., Any]:
    """``MulticlassStatScores.update``: make the metric the one ``_bincount`` records into."""
    defaults = "_defaults"
    name = RECORD.name

    def update(original: Callable, self: Any, *args: Any, **kwargs: Any) -> Any:
        if name not in getattr(self, defaults, ()):  # built before apply(): upstream behaviour
            return original(self, *args, **kwargs)
        token = _current.set(self)
        try:
            return original(self, *args, **kwargs)
        finally:
            _current.reset(token)

    return update


def _build_sync_context(module: ModuleType) -> Callable[..., Any]:
    """``Metric.sync_context``: every release's ``compute()`` wrapper enters it
    around the user's ``compute``; once states are synced, report the record."""
    name = RECORD.name

    @contextlib.contextmanager
    def sync_context(original: Callable, self: Any, *args: Any, **kwargs: Any) -> Iterator[None]:
        with original(self, *args, **kwargs):
            if name in getattr(self, "_defaults", ()):
                count = RECORD.take(self)
                if count:
                    deferred.fail(self, RuntimeError(MESSAGE.format(count=int(count))))
            yield

    return sync_context


_DATA = "torchmetrics.utilities.data"
_STAT = "torchmetrics.classification.stat_scores"
_STAT_FN = "torchmetrics.functional.classification.stat_scores"

PATCH = Patch(
    name="bincount",
    summary=(
        "multiclass stat-score updates count without torch.bincount's device read or the ignore_index "
        "removal; range errors at compute()"
    ),
    known=">=1.0.0",
    upstream="not fixed upstream (DESIGN.md §3)",
    targets=(
        Target(
            module=_DATA,
            qualname="_bincount",
            variants=(
                Variant("1.0.0-1.2.0", "4d98ca107ae254e1", _build_bincount),
                Variant("1.2.1-1.5.2", "92377986ae8ac6c4", _build_bincount),
                Variant("1.6.0", "3b01983d96015e74", _build_bincount),
                Variant("1.6.1-1.9.0", "844aca9a5b9bef1c", _build_bincount),
            ),
        ),
        Target(
            module=_STAT_FN,
            qualname="_multiclass_stat_scores_update",
            variants=(
                Variant("1.0.0-1.0.2", "8f90619f8a069199", _build_stat_scores_update),
                Variant("1.0.3-1.5.2", "cc69b1446ba8ac1d", _build_stat_scores_update),  # ``.long()`` in one-hot
                Variant("1.6.0", "802f14a7fbdad54a", _build_stat_scores_update),
                Variant("1.6.1-1.9.0", "3ea2f317da52f574", _build_stat_scores_update),  # top-k refinement
            ),
        ),
        Target(
            module=_STAT,
            qualname="MulticlassStatScores.__init__",
            variants=(
                Variant("1.0.0-1.3.2", "ead29a8f403e378d", _build_init),
                Variant("1.4.0-1.6.1", "d60c1e8678fee1e9", _build_init),
                Variant("1.6.2-1.9.0", "c59cc4df5e8d0d72", _build_init),
            ),
        ),
        Target(
            module=_STAT,
            qualname="MulticlassStatScores.update",
            variants=(
                Variant("1.0.0-1.6.1", "e1900853e6588990", _build_update),
                Variant("1.6.2-1.9.0", "ef20a94ad2300515", _build_update),
            ),
        ),
        Target(
            module="torchmetrics.metric",
            qualname="Metric.sync_context",
            # fingerprinted at run time with its ``@contextmanager`` line (tools/fingerprints.py,
            # which reads the ``def`` alone, shows 7148261789f9b169 for the same code)
            variants=(Variant("1.0.0-1.9.0", "b1daa5d513bb285c", _build_sync_context),),
        ),
    ),
)
