"""logits_check: the binary and multilabel stat-score formatters without a device read.

Defect: before 1.6.1, ``_binary_stat_scores_format`` and
``_multilabel_stat_scores_format`` decide whether ``preds`` are logits with
``if not torch.all((preds >= 0) * (preds <= 1)): preds = preds.sigmoid()``:
a Python ``if`` on a device value, one sync on every ``update()`` of a binary
or multilabel Accuracy, Precision, Recall, F1, FBeta, Specificity,
HammingDistance or StatScores with float ``preds``. Fixed upstream in 1.6.1
(``normalize_logits_if_needed``, ``torch.where`` on the device; PR #2845).

Replacement: the same formatter with the ``if`` replaced by a device-side
selection of the whole tensor, ``torch.where(all_in_0_1, preds, preds.sigmoid())``:
all-or-nothing, as upstream. Results are those of the release's own formatter
for every input: a tensor holding a NaN is not all in [0, 1], so it is passed
through ``sigmoid`` as the release does (1.6.1's own ``normalize_logits_if_needed``
tests ``any(x < 0 or x > 1)``, which NaN fails: 1.6.1+ do *not* apply
``sigmoid`` then; the patch keeps each release's own answer); an empty tensor
is all in [0, 1] and left alone. ``target[idx] = -1`` becomes the equivalent
``masked_fill``. The ``sigmoid`` is computed on every call (a cheap elementwise
op) where the release computed it only for logits.

Releases: 1.0.0-1.6.0 patched (two fingerprints each, differing in an annotation);
1.6.1+ not needed. The confusion-matrix and precision-recall-curve formatters,
which share the check, are not covered yet.
"""
from __future__ import annotations

import logging
from types import ModuleType
from typing import Any, Callable, Optional, Tuple

from tmpatch.spec import Patch, Target, Variant

log = logging.getLogger("tmpatch")


def _selector() -> Callable[[Any], Any]:
    import torch

    where = torch.where

    def probabilities(preds: Any) -> Any:
        """``preds`` if all are in [0, 1] (an empty tensor is), else ``preds.sigmoid()``."""
        inside = ((preds >= 0) & (preds <= 1)).all()  # 0-d, stays on the device
        return where(inside, preds, preds.sigmoid())

    return probabilities


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


_STAT = "torchmetrics.functional.classification.stat_scores"

PATCH = Patch(
    name="logits_check",
    summary="binary/multilabel stat-score formatters pick sigmoid on the device, without a sync",
    known=">=1.0.0",
    upstream="fixed upstream in 1.6.1 (normalize_logits_if_needed)",
    targets=(
        Target(
            module=_STAT,
            qualname="_binary_stat_scores_format",
            variants=(
                Variant("1.0.0-1.5.2", "37857f745517cc21", _build_binary),
                Variant("1.6.0", "92601426b43ef741", _build_binary),  # ``tuple`` annotation only
                Variant("1.6.1-1.9.0", "a297ae208bd0bc69"),
            ),
        ),
        Target(
            module=_STAT,
            qualname="_multilabel_stat_scores_format",
            variants=(
                Variant("1.0.0-1.5.2", "ffe5389c9ea8765a", _build_multilabel),
                Variant("1.6.0", "77b460a96404f312", _build_multilabel),
                Variant("1.6.1-1.9.0", "6f4c86c84bfb6e29"),
            ),
        ),
    ),
)
