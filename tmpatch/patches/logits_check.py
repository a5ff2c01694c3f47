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

Replacement: the release's formatter with the ``if`` replaced by a device-side
selection of the whole tensor, ``torch.where(all_in_0_1, preds, preds.sigmoid())``
(``preds.softmax(1)``): all-or-nothing, as upstream. Results are those of the
release's own formatter for every input: a tensor holding a NaN is not all in
[0, 1], so it is normalised as the release does (1.6.1's own
``normalize_logits_if_needed`` tests ``any(x < 0 or x > 1)`` off the CPU, which
NaN fails: 1.6.1+ do *not* normalise it on a GPU; the patch keeps each release's
own answer); an empty tensor is all in [0, 1] and left alone. The normalisation
is computed on every call where the release computed it only for logits, and
``preds`` comes back as a new tensor where the release could return a view of
the caller's. Everything else is the release's code, the boolean removal of
ignored entries (``preds[idx]``, a sync of its own) included, except: the
stat-score formatters' ``target[idx] = -1`` becomes the equivalent
``masked_fill``; the curve formatters, which also run the check on integer
``preds`` (the result's dtype then depends on the values), and the calibration
update (softmax of an integer tensor raises), call the release's own code for
``preds`` that are not floating point.

Releases: 1.0.0-1.6.0 patched (two or three fingerprints per target, differing
in annotations and, for the multiclass curve, the ``average`` argument of
1.3.0+); 1.6.1+ not needed.
"""
from __future__ import annotations

import logging
from types import ModuleType
from typing import Any, Callable, List, Optional, Tuple, Union

from tmpatch.spec import Builder, Label, Patch, Target, UPSTREAM, Variant, since, span

log = logging.getLogger("tmpatch")

Thresholds = Optional[Union[int, List[float], Any]]  # ``Any``: a tensor


def _selector(softmax_dim: Optional[int] = None) -> Callable[[Any], Any]:
    """``probabilities(preds)``: ``preds`` if all are in [0, 1] (an empty tensor is),
    else ``preds.sigmoid()``, or ``preds.softmax(softmax_dim)`` when that is given."""
    import torch

    where = torch.where

    if softmax_dim is None:
        def normalise(preds: Any) -> Any:
            return preds.sigmoid()
    else:
        def normalise(preds: Any) -> Any:
            return preds.softmax(softmax_dim)

    def probabilities(preds: Any) -> Any:
        inside = ((preds >= 0) & (preds <= 1)).all()  # 0-d, stays on the device
        return where(inside, preds, normalise(preds))

    return probabilities


# --- stat scores -------------------------------------------------------------------------------


def _build_binary(module: ModuleType) -> Callable[..., Any]:
    """``_binary_stat_scores_format`` of 1.0.0-1.6.0."""
    probabilities = _selector()

    def _binary_stat_scores_format(
        original: Callable, preds: Any, target: Any, threshold: float = 0.5, ignore_index: Optional[int] = None
    ) -> Tuple[Any, Any]:
        if preds.is_floating_point():
            preds = probabilities(preds) > threshold
        preds = preds.reshape(preds.shape[0], -1)
        target = target.reshape(target.shape[0], -1)
        if ignore_index is not None:
            target = target.masked_fill(target == ignore_index, -1)
        return preds, target

    return _binary_stat_scores_format


def _build_multilabel(module: ModuleType) -> Callable[..., Any]:
    """``_multilabel_stat_scores_format`` of 1.0.0-1.6.0."""
    probabilities = _selector()

    def _multilabel_stat_scores_format(
        original: Callable,
        preds: Any,
        target: Any,
        num_labels: int,
        threshold: float = 0.5,
        ignore_index: Optional[int] = None,
    ) -> Tuple[Any, Any]:
        if preds.is_floating_point():
            preds = probabilities(preds) > threshold
        preds = preds.reshape(*preds.shape[:2], -1)
        target = target.reshape(*target.shape[:2], -1)
        if ignore_index is not None:
            target = target.masked_fill(target == ignore_index, -1)
        return preds, target

    return _multilabel_stat_scores_format


# --- confusion matrices ------------------------------------------------------------------------


def _build_binary_confusion(module: ModuleType) -> Callable[..., Any]:
    """``_binary_confusion_matrix_format`` of 1.0.0-1.6.0."""
    probabilities = _selector()

    def _binary_confusion_matrix_format(
        original: Callable,
        preds: Any,
        target: Any,
        threshold: float = 0.5,
        ignore_index: Optional[int] = None,
        convert_to_labels: bool = True,
    ) -> Tuple[Any, Any]:
        preds = preds.flatten()
        target = target.flatten()
        if ignore_index is not None:
            idx = target != ignore_index
            preds = preds[idx]
            target = target[idx]
        if preds.is_floating_point():
            preds = probabilities(preds)
            if convert_to_labels:
                preds = preds > threshold
        return preds, target

    return _binary_confusion_matrix_format


def _build_multilabel_confusion(module: ModuleType) -> Callable[..., Any]:
    """``_multilabel_confusion_matrix_format`` of 1.0.0-1.6.0."""
    import torch

    movedim = torch.movedim
    probabilities = _selector()

    def _multilabel_confusion_matrix_format(
        original: Callable,
        preds: Any,
        target: Any,
        num_labels: int,
        threshold: float = 0.5,
        ignore_index: Optional[int] = None,
        should_threshold: bool = True,
    ) -> Tuple[Any, Any]:
        if preds.is_floating_point():
            preds = probabilities(preds)
            if should_threshold:
                preds = preds > threshold
        preds = movedim(preds, 1, -1).reshape(-1, num_labels)
        target = movedim(target, 1, -1).reshape(-1, num_labels)
        if ignore_index is not None:
            preds = preds.clone()
            target = target.clone()
            idx = target == ignore_index
            preds[idx] = -4 * num_labels  # a masked fill (scalar value): no sync
            target[idx] = -4 * num_labels
        return preds, target

    return _multilabel_confusion_matrix_format


# --- precision-recall curves -------------------------------------------------------------------


def _build_binary_curve(module: ModuleType) -> Callable[..., Any]:
    """``_binary_precision_recall_curve_format`` of 1.0.0-1.6.0."""
    probabilities = _selector()

    def _binary_precision_recall_curve_format(
        original: Callable, preds: Any, target: Any, thresholds: Thresholds = None, ignore_index: Optional[int] = None
    ) -> Tuple[Any, Any, Any]:
        if not preds.is_floating_point():
            return original(preds, target, thresholds, ignore_index)
        preds = preds.flatten()
        target = target.flatten()
        if ignore_index is not None:
            idx = target != ignore_index
            preds = preds[idx]
            target = target[idx]
        preds = probabilities(preds)
        thresholds = module._adjust_threshold_arg(thresholds, preds.device)
        return preds, target, thresholds

    return _binary_precision_recall_curve_format


def _multiclass_curve_builder(has_average: bool) -> Builder:
    """``_multiclass_precision_recall_curve_format`` of 1.0.0-1.2.1 and, with
    ``average`` (``"micro"`` flattens and one-hot encodes), of 1.3.0-1.6.0."""

    def build(module: ModuleType) -> Callable[..., Any]:
        import torch

        one_hot = torch.nn.functional.one_hot
        probabilities = _selector(softmax_dim=1)

        def _multiclass_precision_recall_curve_format(
            original: Callable,
            preds: Any,
            target: Any,
            num_classes: int,
            thresholds: Thresholds = None,
            ignore_index: Optional[int] = None,
            average: Optional[str] = None,
        ) -> Tuple[Any, Any, Any]:
            if not preds.is_floating_point():
                extra = (average,) if has_average else ()
                return original(preds, target, num_classes, thresholds, ignore_index, *extra)
            preds = preds.transpose(0, 1).reshape(num_classes, -1).T
            target = target.flatten()
            if ignore_index is not None:
                idx = target != ignore_index
                preds = preds[idx]
                target = target[idx]
            preds = probabilities(preds)
            if average == "micro":
                preds = preds.flatten()
                target = one_hot(target, num_classes=num_classes).flatten()
            thresholds = module._adjust_threshold_arg(thresholds, preds.device)
            return preds, target, thresholds

        if has_average:
            return _multiclass_precision_recall_curve_format

        def _multiclass_precision_recall_curve_format_1_0(
            original: Callable,
            preds: Any,
            target: Any,
            num_classes: int,
            thresholds: Thresholds = None,
            ignore_index: Optional[int] = None,
        ) -> Tuple[Any, Any, Any]:
            return _multiclass_precision_recall_curve_format(
                original, preds, target, num_classes, thresholds, ignore_index
            )

        return _multiclass_precision_recall_curve_format_1_0

    return build


def _build_multilabel_curve(module: ModuleType) -> Callable[..., Any]:
    """``_multilabel_precision_recall_curve_format`` of 1.0.0-1.6.0."""
    probabilities = _selector()

    def _multilabel_precision_recall_curve_format(
        original: Callable,
        preds: Any,
        target: Any,
        num_labels: int,
        thresholds: Thresholds = None,
        ignore_index: Optional[int] = None,
    ) -> Tuple[Any, Any, Any]:
        if not preds.is_floating_point():
            return original(preds, target, num_labels, thresholds, ignore_index)
        preds = preds.transpose(0, 1).reshape(num_labels, -1).T
        target = target.transpose(0, 1).reshape(num_labels, -1).T
        preds = probabilities(preds)  # a new tensor: upstream's ``preds.clone()`` is not needed
        thresholds = module._adjust_threshold_arg(thresholds, preds.device)
        if ignore_index is not None and thresholds is not None:
            target = target.clone()
            idx = target == ignore_index
            fill = -4 * num_labels * len(thresholds)
            preds[idx] = fill  # masked fills (scalar value): no sync
            target[idx] = fill
        return preds, target, thresholds

    return _multilabel_precision_recall_curve_format


# --- calibration error ---------------------------------------------------------------------------


def _build_multiclass_calibration(module: ModuleType) -> Callable[..., Any]:
    """``_multiclass_calibration_error_update`` of 1.0.0-1.6.0 (softmax over the classes)."""
    probabilities = _selector(softmax_dim=1)

    def _multiclass_calibration_error_update(original: Callable, preds: Any, target: Any) -> Tuple[Any, Any]:
        if not preds.is_floating_point():  # softmax of an integer tensor raises: the release decides
            return original(preds, target)
        confidences, predictions = probabilities(preds).max(dim=1)
        accuracies = predictions.eq(target)
        return confidences.float(), accuracies.float()

    return _multiclass_calibration_error_update


_CALIBRATION = "torchmetrics.functional.classification.calibration_error"
_STAT = "torchmetrics.functional.classification.stat_scores"
_CONFUSION = "torchmetrics.functional.classification.confusion_matrix"
_CURVE = "torchmetrics.functional.classification.precision_recall_curve"

PATCH = Patch(
    name="logits_check",
    summary="stat-score, confusion-matrix, precision-recall-curve formatters and the multiclass "
            "calibration update pick sigmoid/softmax on the device, without a sync",
    known=since("1.0.0"),
    upstream="fixed upstream in 1.6.1 (normalize_logits_if_needed, PR #2845)",
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
                Variant(span("1.0.0", "1.5.2"), "37857f745517cc21", _build_binary),
                Variant(span("1.6.0"), "92601426b43ef741", _build_binary),  # ``tuple`` annotation only
                Variant(span("1.6.1", "1.9.0"), "a297ae208bd0bc69"),
            ),
        ),
        Target(
            module=_STAT,
            qualname="_multilabel_stat_scores_format",
            variants=(
                Variant(span("1.0.0", "1.5.2"), "ffe5389c9ea8765a", _build_multilabel),
                Variant(span("1.6.0"), "77b460a96404f312", _build_multilabel),
                Variant(span("1.6.1", "1.9.0"), "6f4c86c84bfb6e29"),
            ),
        ),
        Target(
            module=_CONFUSION,
            qualname="_binary_confusion_matrix_format",
            variants=(
                Variant(span("1.0.0", "1.5.2"), "af734a55585421c7", _build_binary_confusion),
                Variant(span("1.6.0"), "b7af5997d4875998", _build_binary_confusion),  # annotation only
                Variant(span("1.6.1", "1.9.0"), "bf379e83297ca7a2"),
            ),
        ),
        Target(
            module=_CONFUSION,
            qualname="_multilabel_confusion_matrix_format",
            variants=(
                Variant(span("1.0.0", "1.5.2"), "e33b78794afdec7e", _build_multilabel_confusion),
                Variant(span("1.6.0"), "d925b7f6b6970778", _build_multilabel_confusion),  # annotation only
                Variant(span("1.6.1", "1.9.0"), "cf5cba04842a2f56"),
            ),
        ),
        Target(
            module=_CURVE,
            qualname="_binary_precision_recall_curve_format",
            variants=(
                Variant(span("1.0.0", "1.5.2"), "d99368eaf7778d5e", _build_binary_curve),
                Variant(span("1.6.0"), "1f4443f231459b23", _build_binary_curve),  # annotation only
                Variant(span("1.6.1", "1.8.0"), "9f54bb81bb7cf5f9"),
                Variant(span("1.8.1", "1.9.0"), "c45424650b499165"),  # adds ``normalization``
            ),
        ),
        Target(
            module=_CURVE,
            qualname="_multiclass_precision_recall_curve_format",
            variants=(
                Variant(span("1.0.0", "1.2.1"), "98924752dc1c3649", _multiclass_curve_builder(has_average=False)),
                Variant(span("1.3.0.post0", "1.5.2"), "25f9956419d1a656", _multiclass_curve_builder(has_average=True)),
                Variant(span("1.6.0"), "337b4951bfd9a238", _multiclass_curve_builder(has_average=True)),  # annotation
                Variant(span("1.6.1", "1.9.0"), "c5e8c0f7be88df8e"),
            ),
        ),
        Target(
            module=_CURVE,
            qualname="_multilabel_precision_recall_curve_format",
            variants=(
                Variant(span("1.0.0", "1.5.2"), "5980e6dd69a6c76d", _build_multilabel_curve),
                Variant(span("1.6.0"), "27b1312b274223df", _build_multilabel_curve),  # annotation only
                Variant(span("1.6.1", "1.9.0"), "b8a3cc1fc193f5aa"),
            ),
        ),
        Target(
            module=_CALIBRATION,
            qualname="_multiclass_calibration_error_update",
            variants=(
                Variant(span("1.0.0", "1.5.2"), "21b3a3e216134a63", _build_multiclass_calibration),
                Variant(span("1.6.0"), "0d8e9b5338493252", _build_multiclass_calibration),
                Variant(span("1.6.1", "1.9.0"), "abff5124c3c9ccb7"),
            ),
        ),
    ),
)
