"""logits_check: the classification formatters that test for logits, without a device read.

Defect: before 1.6.1, seven formatters and one update decide whether ``preds`` are logits with
``if not torch.all((preds >= 0) * (preds <= 1)): preds = preds.sigmoid()``
(``preds.softmax(1)`` for the multiclass curve): a Python ``if`` on a device
value, one sync on every ``update()`` with float ``preds`` of the metrics built
on them. Stat scores (``_binary_stat_scores_format``,
``_multilabel_stat_scores_format``): binary/multilabel Accuracy, Precision,
Recall, F1, FBeta, Specificity, HammingDistance, StatScores. Confusion matrices
(``_binary_confusion_matrix_format``, ``_multilabel_confusion_matrix_format``):
ConfusionMatrix, CohenKappa, JaccardIndex, MatthewsCorrCoef, the multilabel
ranking metrics, binary calibration error and hinge loss. Precision-recall curves
(``_{binary,multiclass,multilabel}_precision_recall_curve_format``):
PrecisionRecallCurve, ROC, AUROC, AveragePrecision and the ``*At*`` metrics.
``_multiclass_calibration_error_update`` (softmax): MulticlassCalibrationError.
Not covered: ``_multiclass_hinge_loss_update`` makes the same check, but its
update also selects with boolean masks (``preds[target]``, a sync each), so the
metric would sync anyway. Fixed upstream in 1.6.1 (``normalize_logits_if_needed``, ``torch.where`` on the
device; PR #2845).

Repair: the release's own function, with that one ``if`` replaced (an edit of its
code, :mod:`tmpatch.engine.rewrite`; nothing else of it is copied or changed) by a
device-side selection of the whole tensor, ``torch.where(all_in_0_1, preds,
preds.sigmoid())`` (``preds.softmax(1)``): all-or-nothing, as upstream. On CUDA
(float32/64, outside deterministic mode and torch.compile) ``all_in_0_1`` is whether
``torch.histc(preds, bins=1, min=0, max=1)`` counts every element (NaN and infinities
are outside its range; its float count is exact up to 2**24 elements in float32): the
whole selection takes the release's four kernels (the test itself two). Results are
those of the release's own function for every input: a tensor holding a NaN is not
all in [0, 1], so it is normalised as the release does; an empty tensor is all in
[0, 1] and left alone. The normalisation is computed on every call where the release
computed it only for logits, and ``preds`` comes back as a new tensor where the
release could return the caller's. Integer ``preds`` (whose result's dtype depends on
the values) keep the release's read.

Releases: 0.10.0-1.6.0 patched (three to five fingerprints per target, differing
in annotations and, for the multiclass curve, the ``average`` argument of
1.3.0+; 0.10-0.11 spell the test ``(0 <= preds)``, the same values); 1.6.1+ not needed.
"""
from __future__ import annotations

from types import ModuleType
from typing import Any, Callable, Dict

from tmpatch.runtime.compiled import compiling
from tmpatch.spec import UPSTREAM, Edit, Label, Patch, Rewrite, Target, Variant, since, span

_CHECK = "if not torch.all((preds >= 0) * (preds <= 1)):\n    preds = preds.{}\n"
#: 0.10-0.11 spell the same test ``(0 <= preds)``
_CHECK_0 = "if not torch.all((0 <= preds) * (preds <= 1)):\n    preds = preds.{}\n"


def _helpers(module: ModuleType) -> Dict[str, Callable[[Any], Any]]:
    """The device-side selections that replace the release's ``if``."""
    import torch

    where, torch_all, histc = torch.where, torch.all, torch.histc
    deterministic = getattr(torch._C, "_get_deterministic_algorithms", torch.are_deterministic_algorithms_enabled)
    #: histc counts in the input's dtype: exact up to 2**24 elements in float32, 2**53 in float64
    exact = {torch.float32: 1 << 24, torch.float64: 1 << 53}

    def choose(normalise: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def probabilities(preds: Any) -> Any:
            # integers: the result's dtype depends on the values; the CPU outside torch.compile:
            # reading costs no sync (and float16 has no CPU softmax before torch 2.2): read, as the release
            if not preds.is_floating_point() or (preds.is_cpu and not compiling()):
                return preds if torch_all((preds >= 0) * (preds <= 1)) else normalise(preds)
            if preds.is_cuda and preds.numel() <= exact.get(preds.dtype, -1) and not deterministic() \
                    and not compiling():
                # the elements in [0, 1] (NaN and infinities left out), counted in one kernel: all of them?
                # Two kernels where the release's test takes four, as the release's read costs
                inside = histc(preds, bins=1, min=0, max=1)[0] == preds.numel()
            else:
                inside = ((preds >= 0) & (preds <= 1)).all()  # 0-d, stays on the device
            return where(inside, preds, normalise(preds))

        return probabilities

    return {
        "_tmpatch_sigmoid_if_logits": choose(lambda preds: preds.sigmoid()),
        "_tmpatch_softmax_if_logits": choose(lambda preds: preds.softmax(1)),
    }


#: the release's ``if not torch.all(...)``, as a device-side selection of the whole tensor
SIGMOID = Rewrite((Edit(_CHECK.format("sigmoid()"), "preds = _tmpatch_sigmoid_if_logits(preds)"),), _helpers)
SOFTMAX = Rewrite((Edit(_CHECK.format("softmax(1)"), "preds = _tmpatch_softmax_if_logits(preds)"),), _helpers)
SIGMOID_0 = Rewrite((Edit(_CHECK_0.format("sigmoid()"), "preds = _tmpatch_sigmoid_if_logits(preds)"),), _helpers)
SOFTMAX_0 = Rewrite((Edit(_CHECK_0.format("softmax(1)"), "preds = _tmpatch_softmax_if_logits(preds)"),), _helpers)

_CALIBRATION = "torchmetrics.functional.classification.calibration_error"
_STAT = "torchmetrics.functional.classification.stat_scores"
_CONFUSION = "torchmetrics.functional.classification.confusion_matrix"
_CURVE = "torchmetrics.functional.classification.precision_recall_curve"

PATCH = Patch(
    name="logits_check",
    summary="stat-score, confusion-matrix, precision-recall-curve formatters and the multiclass "
            "calibration update pick sigmoid/softmax on the device, without a sync",
    known=since("0.10.0"),
    upstream="fixed upstream in 1.6.1 (normalize_logits_if_needed, PR #2845)",
    changes="nothing but the sync: the results are the release's for every input",
    labels=(
        Label(UPSTREAM, "the release's formatter reads the values to decide on a sigmoid or softmax (fixed upstream "
              "in 1.6.1); see the logits_check patch",
              function=r"_(binary|multilabel)_\w*format\w*|_multiclass_precision_recall_curve_format"
                       r"|_multiclass_calibration_error_update",
              op="aten._local_scalar_dense"),
    ),
    targets=(
        Target(
            module=_STAT,
            qualname="_binary_stat_scores_format",
            variants=(
                Variant(span("0.10.0", "0.11.4"), "261301317f173d5b", SIGMOID_0),
                Variant(span("1.0.0", "1.5.2"), "37857f745517cc21", SIGMOID),
                Variant(span("1.6.0"), "92601426b43ef741", SIGMOID),  # ``tuple`` annotation only
                Variant(span("1.6.1", "1.9.0"), "a297ae208bd0bc69"),
            ),
        ),
        Target(
            module=_STAT,
            qualname="_multilabel_stat_scores_format",
            variants=(
                Variant(span("0.10.0", "0.11.4"), "546b875d6142a3c1", SIGMOID_0),
                Variant(span("1.0.0", "1.5.2"), "ffe5389c9ea8765a", SIGMOID),
                Variant(span("1.6.0"), "77b460a96404f312", SIGMOID),
                Variant(span("1.6.1", "1.9.0"), "6f4c86c84bfb6e29"),
            ),
        ),
        Target(
            module=_CONFUSION,
            qualname="_binary_confusion_matrix_format",
            variants=(
                Variant(span("0.10.0", "0.11.4"), "896740cf48f4bf7a", SIGMOID_0),
                Variant(span("1.0.0", "1.5.2"), "af734a55585421c7", SIGMOID),
                Variant(span("1.6.0"), "b7af5997d4875998", SIGMOID),  # annotation only
                Variant(span("1.6.1", "1.9.0"), "bf379e83297ca7a2"),
            ),
        ),
        Target(
            module=_CONFUSION,
            qualname="_multilabel_confusion_matrix_format",
            variants=(
                Variant(span("0.10.0", "0.10.3"), "121b438ea498c452", SIGMOID_0),  # ``_movedim``
                Variant(span("0.11.0", "0.11.4"), "a5e1cd5a2ddb48ab", SIGMOID_0),
                Variant(span("1.0.0", "1.5.2"), "e33b78794afdec7e", SIGMOID),
                Variant(span("1.6.0"), "d925b7f6b6970778", SIGMOID),  # annotation only
                Variant(span("1.6.1", "1.9.0"), "cf5cba04842a2f56"),
            ),
        ),
        Target(
            module=_CURVE,
            qualname="_binary_precision_recall_curve_format",
            variants=(
                Variant(span("0.10.0", "0.11.4"), "2dc49c3a43576242", SIGMOID_0),
                Variant(span("1.0.0", "1.5.2"), "d99368eaf7778d5e", SIGMOID),
                Variant(span("1.6.0"), "1f4443f231459b23", SIGMOID),  # annotation only
                Variant(span("1.6.1", "1.8.0"), "9f54bb81bb7cf5f9"),
                Variant(span("1.8.1", "1.9.0"), "c45424650b499165"),  # adds ``normalization``
            ),
        ),
        Target(
            module=_CURVE,
            qualname="_multiclass_precision_recall_curve_format",
            variants=(
                Variant(span("0.10.0", "0.11.4"), "63fd914eefdd8ab2", SOFTMAX_0),
                Variant(span("1.0.0", "1.2.1"), "98924752dc1c3649", SOFTMAX),
                Variant(span("1.3.0.post0", "1.5.2"), "25f9956419d1a656", SOFTMAX),
                Variant(span("1.6.0"), "337b4951bfd9a238", SOFTMAX),  # annotation
                Variant(span("1.6.1", "1.9.0"), "c5e8c0f7be88df8e"),
            ),
        ),
        Target(
            module=_CURVE,
            qualname="_multilabel_precision_recall_curve_format",
            variants=(
                Variant(span("0.10.0", "0.11.4"), "b05c767024468d6d", SIGMOID_0),
                Variant(span("1.0.0", "1.5.2"), "5980e6dd69a6c76d", SIGMOID),
                Variant(span("1.6.0"), "27b1312b274223df", SIGMOID),  # annotation only
                Variant(span("1.6.1", "1.9.0"), "b8a3cc1fc193f5aa"),
            ),
        ),
        Target(
            module=_CALIBRATION,
            qualname="_multiclass_calibration_error_update",
            variants=(
                Variant(span("0.10.0", "0.11.4"), "b328782ffa724849", SOFTMAX_0),  # annotation too
                Variant(span("1.0.0", "1.5.2"), "21b3a3e216134a63", SOFTMAX),
                Variant(span("1.6.0"), "0d8e9b5338493252", SOFTMAX),
                Variant(span("1.6.1", "1.9.0"), "abff5124c3c9ccb7"),
            ),
        ),
    ),
)
