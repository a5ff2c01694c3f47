"""bincount: counting updates without ``torch.bincount``'s device read or boolean removals.

Defect: on CUDA, ``torch.bincount`` reads the input's minimum and maximum back
to the host to size its output (ATen ``_bincount_cuda_template``): two syncs on
every call, and ``torchmetrics.utilities.data._bincount`` runs on every
``update()`` of

* multiclass stat scores (Accuracy, Precision, Recall, F1, FBeta, Specificity,
  HammingDistance, NegativePredictiveValue, StatScores) with ``top_k=1``,
  ``multidim_average="global"`` and ``average`` other than ``"micro"``;
* binary, multiclass and multilabel confusion matrices, and the metrics that
  inherit their ``update`` (CohenKappa, JaccardIndex, MatthewsCorrCoef);
* binned precision-recall curves (``thresholds`` given), binary, multiclass and
  multilabel, and the metrics that inherit their ``update`` (AUROC,
  AveragePrecision, ROC, EER, LogAUC, PrecisionAtFixedRecall,
  RecallAtFixedPrecision, SensitivityAtSpecificity, SpecificityAtSensitivity).

In deterministic mode upstream falls back to a for-loop (1.0.0-1.2.0, one
device write per class) or to an N x minlength mesh (1.2.1-1.9.0), which is
O(N * minlength) in time and memory. Not fixed upstream (1.9.0 included); see
DESIGN.md §3. The same updates remove entries with a boolean index (a
data-dependent shape: one sync each on CUDA): ignored targets in the multiclass
stat-score update and in the binary/multiclass confusion-matrix and curve
formatters (with ``ignore_index``), and the negative codes in the multilabel
confusion-matrix and binned multilabel curve updates (with or without
``ignore_index``).

Replacement: when ``minlength`` is given and the call happens inside the
``update()`` of a metric carrying the record (one of the metrics above built
after ``apply()``; a curve only when binned), counts go into a fixed-size
int64 tensor on the input's device with ``scatter_add_``: no host read, no
mesh, deterministic (integer sums; ``scatter_add_`` of a CUDA tensor is on
torch's deterministic list). Counts are bit-identical to ``torch.bincount``
for input in ``[0, minlength)``. On the CPU, where reading a value is no
sync, in-range input goes to ``torch.bincount`` itself (faster than the
scatter, and deterministic there); only out-of-range input takes the scatter.

Removals become masks: the removed entries are left out of the counts instead
(same counts, same dtypes, bit for bit).

* ``_multiclass_stat_scores_update`` (``top_k=1``, ``"global"``, ``"micro"``
  included): ``target == ignore_index`` masked. The one-hot branches
  (``top_k > 1`` or ``"samplewise"``) already mask without a sync.
* ``_multilabel_confusion_matrix_update`` and the binned
  ``_multilabel_precision_recall_curve_update``: the negative codes masked.
* ``ignore_index`` of ``BinaryConfusionMatrix``, ``MulticlassConfusionMatrix``
  and binned ``Binary/MulticlassPrecisionRecallCurve``: upstream removes in the
  formatter and counts in the update function, so the class's ``update`` takes a
  masked path: the release's formatter (looked up at call time, so another
  patch's layer on it runs) gets every position with ``ignore_index=None``, with
  ignored ``preds`` set to 0 (and ignored multiclass-curve targets to class 0, for
  the one-hot), and the counts leave the ignored positions out. Setting ignored ``preds`` to a value in ``[0, 1]``
  keeps the formatter's "all in [0, 1]?" logits decision to the kept values, as
  upstream; sigmoid, softmax (per row), argmax and thresholds are per element or
  row, so kept values are the same bits. Argument forms other than
  ``update(preds, target)``, shapes the formatter would reject, and
  ``BinaryPrecisionRecallCurve(normalization="softmax")`` keep the release's path.

Values outside ``[0, minlength)`` (among the kept ones) are not counted; their
number is added to a device-side :class:`tmpatch.deferred.Record` (metric state
``_tmpatch_bincount``) and ``compute()`` raises a ``RuntimeError`` saying so,
once, at the user's next explicit ``compute()`` (the record is read in
``Metric.sync_context``, after the states are synced across ranks). Upstream
instead raises in ``update()``: ``torch.bincount`` refuses negatives ("bincount
only supports 1-d non-negative integral inputs."), and a value >= minlength
makes the output longer, so the caller's ``bins.reshape(...)`` fails with
"shape '[C, C]' is invalid for input of size ...". Upstream's input validation
(``validate_args=True``, itself a sync) counts unique values but does not check
their range, so such input reaches ``_bincount`` with either setting.

Everywhere else the release's own code runs: ``minlength=None``; a non-integral
or non-1-d input; outside a recorded metric's ``update()`` (functional API,
compute-time callers such as AUROC's weights, calibration errors, Kendall;
unbinned curves, whose states must follow the data anyway); metrics built
before ``apply()``; and under ``tmpatch.settings.policy["bincount"] == "eager"``
(``TMPATCH_BINCOUNT=eager``), which keeps upstream's behaviour exactly.

Deliberate differences: out-of-range values are reported at ``compute()``
rather than in ``update()``; in deterministic mode upstream's mesh/loop
silently dropped them, the patch reports them. Binned binary and multiclass
curves choose between the vectorised count and the per-threshold loop (over
50,000 values, resp. 10^6 values x classes) on the batch size before the
ignored positions are left out, upstream after they are removed: the counts are
the same integers for valid targets; a binary target outside {0, 1, ignore_index}
is recorded by the vectorised count and taken as negative by the loop, as
upstream's two paths do.

Releases: 1.0.0-1.9.0 (four upstream implementations of ``_bincount``, four of
``_multiclass_stat_scores_update`` whose counting branches are the same; one to
three per confusion-matrix and curve ``__init__``/``update``, fingerprinted in
the table below). The formatters' logits check before 1.6.1 is patch
``logits_check``'s.
"""
from __future__ import annotations

import contextlib
import contextvars
import logging
from types import ModuleType
from typing import Any, Callable, Dict, Iterator, Optional, Tuple

from tmpatch import deferred, settings
from tmpatch.spec import INHERENT, Label, PATCHED, Patch, Target, Variant, since, span

log = logging.getLogger("tmpatch")

#: the record of values outside ``[0, minlength)`` seen by ``_bincount`` in updates
def _report(top: Any, found: Any, all_ranks: bool) -> None:
    count = sum(n for _, n in found)
    raise RuntimeError(MESSAGE.format(count=count))


RECORD = deferred.Record("bincount", _report)

#: the metric whose ``update()`` is running (in this thread / task), if it carries the record
_current: "contextvars.ContextVar[Any]" = contextvars.ContextVar("tmpatch_bincount_metric", default=None)

#: on the CPU, send in-range input to torch.bincount (tests turn it off to check the scatter)
CPU_SHORTCUT = True

MESSAGE = (
    "tmpatch (bincount): {count} value(s) that `update()` would have passed to `_bincount` since the last "
    "`compute()` were outside [0, minlength) and were not counted. Without tmpatch `update()` would have raised "
    "(`torch.bincount` rejects negative values; a value >= minlength makes the counts the wrong size for the "
    "metric's confusion matrix). Check that `target` and label `preds` hold valid classes: [0, num_classes) "
    "for multiclass metrics, 0 or 1 for binary and multilabel ones (values equal to `ignore_index` excepted); "
    "TMPATCH_BINCOUNT=eager restores upstream's error in the offending `update()`."
)


def _deferred() -> bool:
    return settings.policy.get("bincount", "deferred") == "deferred"


def _integral() -> "frozenset[Any]":
    """The dtypes ``torch.bincount`` takes."""
    import torch

    return frozenset({torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64})


# -- counting -------------------------------------------------------------------------
def _counter() -> Callable[..., Any]:
    """``count(x, minlength, metric, keep=None)``: the counts of ``x`` in ``[0, minlength)``
    as int64 on ``x``'s device, leaving out positions where ``keep`` is False; in-range
    values not kept are not counted, and the kept values outside the range are added
    to the metric's record. No host read."""
    import torch

    zeros, where, int64 = torch.zeros, torch.where, torch.int64
    bincount = torch.bincount
    add = RECORD.add

    def count(x: Any, minlength: int, metric: Any, keep: Any = None) -> Any:
        size = x.numel()
        if keep is None and size and CPU_SHORTCUT and x.device.type == "cpu":
            # on the CPU a read is no sync: torch.bincount itself (deterministic there), whose
            # CPU kernel finds min and max anyway; a negative value raises, a value >= minlength
            # makes it longer: both then take the path below
            try:
                out = bincount(x, minlength=minlength)
            except RuntimeError:
                out = None
            if out is not None and out.shape[0] == minlength:
                return out
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
            if not isinstance(bad, torch.Tensor):
                bad = torch.full((), bad, dtype=int64, device=x.device)
            add(metric, bad)
        return out

    return count


# -- _bincount -------------------------------------------------------------------
def _build_bincount(module: ModuleType) -> Callable[..., Any]:
    """Every release: the four implementations differ only in their fallbacks
    (loop or mesh) and in when they take them; the in-range counts are the same."""
    integral = _integral()
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


# -- multilabel removals -----------------------------------------------------------------
def _build_multilabel_confusion_update(module: ModuleType) -> Callable[..., Any]:
    """``_multilabel_confusion_matrix_update``, every release: it removes the negative
    codes (ignored entries, which the formatter set to ``-4 * num_labels``) with a
    boolean index before ``_bincount``, a sync even without ``ignore_index``. Inside a
    recorded update the same codes are masked out of the counts instead."""
    import torch

    arange, integral = torch.arange, _integral()
    count = _counter()

    def _multilabel_confusion_matrix_update(original: Callable, preds: Any, target: Any, num_labels: int) -> Any:
        metric = _current.get()
        if metric is None or type(num_labels) is not int or not _deferred():
            return original(preds, target, num_labels)
        codes = ((2 * target + preds) + 4 * arange(num_labels, device=preds.device)).flatten()
        if codes.dtype not in integral:  # float preds left unthresholded: the release's
            return original(preds, target, num_labels)
        return count(codes, 4 * num_labels, metric, codes >= 0).reshape(num_labels, 2, 2)

    return _multilabel_confusion_matrix_update


def _build_multilabel_curve_update(module: ModuleType) -> Callable[..., Any]:
    """``_multilabel_precision_recall_curve_update``, every release (two implementations
    differing in annotations): the binned path removes the negative codes (ignored
    entries) with a boolean index; inside a recorded update they are masked out of
    the counts instead. ``thresholds=None`` returns the inputs: the release's."""
    import torch

    arange = torch.arange
    count = _counter()

    def _multilabel_precision_recall_curve_update(
        original: Callable, preds: Any, target: Any, num_labels: int, thresholds: Any
    ) -> Any:
        metric = _current.get()
        if thresholds is None or metric is None or type(num_labels) is not int or not _deferred():
            return original(preds, target, num_labels, thresholds)
        len_t = len(thresholds)
        preds_t = (preds.unsqueeze(-1) >= thresholds.unsqueeze(0).unsqueeze(0)).long()
        codes = preds_t + 2 * target.long().unsqueeze(-1)
        codes += 4 * arange(num_labels, device=preds.device).unsqueeze(0).unsqueeze(-1)
        codes += 4 * num_labels * arange(len_t, device=preds.device)
        codes = codes.flatten()
        bins = count(codes, 4 * num_labels * len_t, metric, codes >= 0)
        return bins.reshape(len_t, num_labels, 2, 2)

    return _multilabel_precision_recall_curve_update


# -- ignore_index of binary / multiclass confusion matrices and binned curves ----------------
# Upstream removes the ignored positions in the *format* function (a boolean index) and
# counts in the *update* function. The class's ``update`` is replaced here, for these
# updates only, by the same three steps with the removal turned into a mask: the release's
# own formatter (module global, so another patch's layer on it is honoured) gets every
# position with ``ignore_index=None``, and the counts leave the ignored ones out. Ignored
# ``preds`` are set to 0 first so that the formatter's "all in [0, 1]?" logits decision is
# taken on the kept values alone, as upstream; ignored targets become 0 where a one-hot
# needs a valid class. Kept positions go through the same element-wise (or row-wise, for
# softmax) operations as upstream, so their values, and the counts, are bit for bit the same.
def _preds_target(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Optional[Tuple[Any, Any]]:
    """``(preds, target)`` of an ``update(preds, target)`` call, or None for any other form."""
    if len(args) == 2 and not kwargs:
        return args[0], args[1]
    merged = dict(zip(("preds", "target"), args), **kwargs)
    if len(args) <= 2 and len(merged) == len(args) + len(kwargs) and set(merged) == {"preds", "target"}:
        return merged["preds"], merged["target"]
    return None


def _class_axis(preds: Any, target: Any) -> bool:
    """Whether ``preds`` is ``target``'s shape with a class axis at 1 (``(N, C, ...)``)."""
    return preds.dim() == target.dim() + 1 and preds.shape[:1] + preds.shape[2:] == target.shape


def _binary_curve_counts(count: Callable[..., Any], metric: Any, preds: Any, target: Any, thresholds: Any,
                         keep: Any) -> Any:
    """``_binary_precision_recall_curve_update`` (binned) counting only where ``keep``:
    the vectorised codes up to 50,000 values, else upstream's per-threshold loop."""
    import torch

    len_t = len(thresholds)
    if preds.numel() <= 50_000:
        preds_t = (preds.unsqueeze(-1) >= thresholds.unsqueeze(0)).long()
        codes = preds_t + 2 * target.long().unsqueeze(-1) + 4 * torch.arange(len_t, device=target.device)
        wide = keep.unsqueeze(-1).expand(-1, len_t)
        return count(codes.flatten(), 4 * len_t, metric, wide.flatten()).reshape(len_t, 2, 2)
    positive = target == 1
    pos, neg = positive & keep, ~positive & keep
    confmat = thresholds.new_empty((len_t, 2, 2), dtype=torch.int64)
    for i in range(len_t):
        preds_t = preds >= thresholds[i]
        confmat[i, 1, 1] = (pos & preds_t).sum()
        confmat[i, 0, 1] = (neg & preds_t).sum()
        confmat[i, 1, 0] = (pos & ~preds_t).sum()
    confmat[:, 0, 0] = keep.sum() - confmat[:, 0, 1] - confmat[:, 1, 0] - confmat[:, 1, 1]
    return confmat


def _multiclass_curve_counts(count: Callable[..., Any], metric: Any, preds: Any, target: Any, num_classes: int,
                             thresholds: Any, keep: Any) -> Any:
    """``_multiclass_precision_recall_curve_update`` (binned, not micro) counting only
    where ``keep``: vectorised codes up to 10^6 values x classes, else upstream's loop."""
    import torch

    len_t = len(thresholds)
    target_t = torch.nn.functional.one_hot(target, num_classes=num_classes)
    if preds.numel() * num_classes <= 1_000_000:
        preds_t = (preds.unsqueeze(-1) >= thresholds.unsqueeze(0).unsqueeze(0)).long()
        codes = preds_t + 2 * target_t.long().unsqueeze(-1)
        codes += 4 * torch.arange(num_classes, device=preds.device).unsqueeze(0).unsqueeze(-1)
        codes += 4 * num_classes * torch.arange(len_t, device=preds.device)
        wide = keep.reshape(-1, 1, 1).expand_as(codes)
        bins = count(codes.flatten(), 4 * num_classes * len_t, metric, wide.flatten())
        return bins.reshape(len_t, num_classes, 2, 2)
    positive = target_t.bool()
    rows = keep.unsqueeze(1)
    pos, neg = positive & rows, ~positive & rows
    confmat = thresholds.new_empty((len_t, num_classes, 2, 2), dtype=torch.int64)
    for i in range(len_t):
        preds_t = preds >= thresholds[i]
        confmat[i, :, 1, 1] = (pos & preds_t).sum(dim=0)
        confmat[i, :, 0, 1] = (neg & preds_t).sum(dim=0)
        confmat[i, :, 1, 0] = (pos & ~preds_t).sum(dim=0)
    confmat[:, :, 0, 0] = keep.sum() - confmat[:, :, 0, 1] - confmat[:, :, 1, 0] - confmat[:, :, 1, 1]
    return confmat


Masked = Callable[[Any, Any, Any], bool]


def _masked_binary_confusion(module: ModuleType) -> Masked:
    """``BinaryConfusionMatrix.update`` (every release) with ignore_index, by mask."""
    import torch

    int64 = torch.int64
    count = _counter()

    def update(self: Any, preds: Any, target: Any) -> bool:
        if preds.numel() != target.numel():
            return False
        if self.validate_args:
            module._binary_confusion_matrix_tensor_validation(preds, target, self.ignore_index)
        preds, target = preds.flatten(), target.flatten()
        keep = target != self.ignore_index
        if preds.is_floating_point():
            preds = preds.masked_fill(~keep, 0)
        preds, target = module._binary_confusion_matrix_format(preds, target, self.threshold, None)
        codes = (target * 2 + preds).to(int64)
        self.confmat += count(codes, 4, self, keep).reshape(2, 2)
        return True

    return update


def _masked_multiclass_confusion(module: ModuleType) -> Masked:
    """``MulticlassConfusionMatrix.update`` (every release) with ignore_index, by mask."""
    import torch

    int64 = torch.int64
    count = _counter()

    def update(self: Any, preds: Any, target: Any) -> bool:
        num_classes = self.num_classes
        if type(num_classes) is not int or not (preds.shape == target.shape or _class_axis(preds, target)):
            return False
        if self.validate_args:
            module._multiclass_confusion_matrix_tensor_validation(preds, target, num_classes, self.ignore_index)
        keep = (target != self.ignore_index).flatten()
        preds, target = module._multiclass_confusion_matrix_format(preds, target, None)
        codes = target.to(int64) * num_classes + preds.to(int64)
        self.confmat += count(codes, num_classes**2, self, keep).reshape(num_classes, num_classes)
        return True

    return update


def _masked_binary_curve(normalization: bool) -> Callable[[ModuleType], Masked]:
    """``BinaryPrecisionRecallCurve.update`` with ignore_index and thresholds, by mask;
    ``normalization``: the release passes ``self.normalization`` (1.8.1+)."""

    def build(module: ModuleType) -> Masked:
        count = _counter()

        def update(self: Any, preds: Any, target: Any) -> bool:
            thresholds = self.thresholds
            extra = (self.normalization,) if normalization else ()
            if thresholds is None or preds.numel() != target.numel() or extra not in ((), (None,), ("sigmoid",)):
                return False  # "softmax" over a flat vector: left to the release
            if self.validate_args:
                module._binary_precision_recall_curve_tensor_validation(preds, target, self.ignore_index)
            preds, target = preds.flatten(), target.flatten()
            keep = target != self.ignore_index
            preds = preds.masked_fill(~keep, 0)
            preds, target, _ = module._binary_precision_recall_curve_format(preds, target, thresholds, None, *extra)
            self.confmat += _binary_curve_counts(count, self, preds, target, thresholds, keep)
            return True

        return update

    return build


def _masked_multiclass_curve(average: bool) -> Callable[[ModuleType], Masked]:
    """``MulticlassPrecisionRecallCurve.update`` with ignore_index and thresholds, by
    mask; ``average``: the release passes ``self.average`` (1.3.0+, ``"micro"``
    flattens and one-hot encodes the target)."""

    def build(module: ModuleType) -> Masked:
        count = _counter()

        def update(self: Any, preds: Any, target: Any) -> bool:
            thresholds, num_classes = self.thresholds, self.num_classes
            if thresholds is None or type(num_classes) is not int or not _class_axis(preds, target):
                return False
            if self.validate_args:
                module._multiclass_precision_recall_curve_tensor_validation(
                    preds, target, num_classes, self.ignore_index
                )
            keep = target != self.ignore_index
            preds = preds.masked_fill(~keep.unsqueeze(1), 0)
            target = target.masked_fill(~keep, 0)  # a valid class for one_hot
            keep = keep.flatten()
            extra = (self.average,) if average else ()
            preds, target, _ = module._multiclass_precision_recall_curve_format(
                preds, target, num_classes, thresholds, None, *extra
            )
            if extra and extra[0] == "micro":
                wide = keep.unsqueeze(1).expand(-1, num_classes).flatten()
                counts = _binary_curve_counts(count, self, preds, target, thresholds, wide)
            else:
                counts = _multiclass_curve_counts(count, self, preds, target, num_classes, thresholds, keep)
            self.confmat += counts
            return True

        return update

    return build


# -- the metrics ------------------------------------------------------------------
def _update_builder(masked: Optional[Callable[[ModuleType], Masked]] = None) -> Callable[..., Any]:
    """A builder for a metric's ``update``: make the metric the one ``_bincount`` (and the
    counters above) record into. ``masked(module)``, if given, is the update by mask used
    when ``ignore_index`` is set; it returns False when the call is not one it handles
    (another argument form, shapes the formatter would reject)."""
    deferred_ok = RECORD.deferred

    def build(module: ModuleType) -> Callable[..., Any]:
        by_mask = masked(module) if masked is not None else None

        def update(original: Callable, self: Any, *args: Any, **kwargs: Any) -> Any:
            if not deferred_ok(self):  # built before apply(): upstream
                return original(self, *args, **kwargs)
            token = _current.set(self)
            try:
                if by_mask is not None and self.ignore_index is not None and _deferred():
                    inputs = _preds_target(args, kwargs)
                    if inputs is not None and by_mask(self, *inputs):
                        return None
                return original(self, *args, **kwargs)
            finally:
                _current.reset(token)

        return update

    return build


#: ``MulticlassStatScores.update`` and the metrics whose ignore_index needs no class-level help
_build_update = _update_builder()


_DATA = "torchmetrics.utilities.data"
_STAT = "torchmetrics.classification.stat_scores"
_STAT_FN = "torchmetrics.functional.classification.stat_scores"
_CONFUSION = "torchmetrics.classification.confusion_matrix"
_CONFUSION_FN = "torchmetrics.functional.classification.confusion_matrix"
_CURVE = "torchmetrics.classification.precision_recall_curve"
_CURVE_FN = "torchmetrics.functional.classification.precision_recall_curve"

PATCH = Patch(
    name="bincount",
    summary=(
        "multiclass stat-score, confusion-matrix and binned precision-recall-curve updates count without "
        "torch.bincount's device read or the ignore_index removals; range errors at compute()"
    ),
    known=since("1.0.0"),
    requires=("deferred_reports",),
    upstream="not fixed upstream (ATen's CUDA bincount reads min and max to size its output)",
    labels=(
        Label(PATCHED, "CUDA torch.bincount reads the input's min and max to size its output; the bincount "
              "patch counts into fixed-size bins instead", function="_bincount", op="aten.bincount"),
        Label(PATCHED, "ignore_index: ignored positions dropped by a boolean index before counting; the bincount "
              "patch masks them out of the counts",
              function=r"_multiclass_stat_scores_update|_(binary|multiclass)_confusion_matrix_format"
                       r"|_multilabel_(confusion_matrix|precision_recall_curve)_update",
              op="aten.index"),
        Label(INHERENT, "ignore_index: ignored positions dropped by a boolean index; inherent where the states keep "
              "the values (thresholds=None); the bincount patch masks them out of binned counts",
              function=r"_(binary|multiclass)_precision_recall_curve_format", op="aten.index", patch="bincount"),
    ),
    targets=(
        Target(
            module=_DATA,
            qualname="_bincount",
            variants=(
                Variant(span("1.0.0", "1.2.0"), "4d98ca107ae254e1", _build_bincount),
                Variant(span("1.2.1", "1.5.2"), "92377986ae8ac6c4", _build_bincount),
                Variant(span("1.6.0"), "3b01983d96015e74", _build_bincount),
                Variant(span("1.6.1", "1.9.0"), "844aca9a5b9bef1c", _build_bincount),
            ),
        ),
        Target(
            module=_STAT_FN,
            qualname="_multiclass_stat_scores_update",
            variants=(
                Variant(span("1.0.0", "1.0.2"), "8f90619f8a069199", _build_stat_scores_update),
                Variant(span("1.0.3", "1.5.2"), "cc69b1446ba8ac1d", _build_stat_scores_update),  # ``.long()`` in one-hot
                Variant(span("1.6.0"), "802f14a7fbdad54a", _build_stat_scores_update),
                Variant(span("1.6.1", "1.9.0"), "3ea2f317da52f574", _build_stat_scores_update),  # top-k refinement
            ),
        ),
        Target(
            module=_STAT,
            qualname="MulticlassStatScores.update",
            variants=(
                Variant(span("1.0.0", "1.6.1"), "e1900853e6588990", _build_update),
                Variant(span("1.6.2", "1.9.0"), "ef20a94ad2300515", _build_update),
            ),
        ),
        # confusion matrices (and CohenKappa, JaccardIndex, MatthewsCorrCoef, which inherit update)
        Target(
            module=_CONFUSION,
            qualname="BinaryConfusionMatrix.update",
            variants=(Variant(span("1.0.0", "1.9.0"), "b2f754606cd4e4a6", _update_builder(_masked_binary_confusion)),),
        ),
        Target(
            module=_CONFUSION,
            qualname="MulticlassConfusionMatrix.update",
            variants=(Variant(span("1.0.0", "1.9.0"), "23bef959df184b10", _update_builder(_masked_multiclass_confusion)),),
        ),
        Target(
            module=_CONFUSION,
            qualname="MultilabelConfusionMatrix.update",
            variants=(Variant(span("1.0.0", "1.9.0"), "3f3b42ba24e9f8d1", _build_update),),
        ),
        Target(
            module=_CONFUSION_FN,
            qualname="_multilabel_confusion_matrix_update",
            variants=(Variant(span("1.0.0", "1.9.0"), "4997f253d2970f13", _build_multilabel_confusion_update),),
        ),
        # precision-recall curves (and AUROC, AveragePrecision, ROC, EER, LogAUC, the X-at-fixed-Y
        # metrics, which inherit update and call this __init__)
        Target(
            module=_CURVE,
            qualname="BinaryPrecisionRecallCurve.update",
            variants=(
                Variant(span("1.0.0", "1.8.0"), "02674c77bed29aef", _update_builder(_masked_binary_curve(False))),
                Variant(span("1.8.1", "1.9.0"), "6814eb8e7e5368ef", _update_builder(_masked_binary_curve(True))),
            ),
        ),
        Target(
            module=_CURVE,
            qualname="MulticlassPrecisionRecallCurve.update",
            variants=(
                Variant(span("1.0.0", "1.2.1"), "1778e31925cf6aec", _update_builder(_masked_multiclass_curve(False))),
                Variant(span("1.3.0.post0", "1.9.0"), "cf35778178fa22b0", _update_builder(_masked_multiclass_curve(True))),
            ),
        ),
        Target(
            module=_CURVE,
            qualname="MultilabelPrecisionRecallCurve.update",
            variants=(Variant(span("1.0.0", "1.9.0"), "7c78b38bb4cbe80d", _build_update),),
        ),
        Target(
            module=_CURVE_FN,
            qualname="_multilabel_precision_recall_curve_update",
            variants=(
                Variant(span("1.0.0", "1.5.2"), "85ee9dd3d59f6bc9", _build_multilabel_curve_update),
                Variant(span("1.6.0", "1.9.0"), "5c026a2163afc4da", _build_multilabel_curve_update),  # annotation only
            ),
        ),
    ),
)
