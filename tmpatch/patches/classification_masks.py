"""classification_masks: the hinge losses and the coverage error without boolean-mask indexing.

Defect: on every ``update()``, BinaryHingeLoss and MulticlassHingeLoss
(``multiclass_mode="one-vs-all"``) build their margin with ``margin[target] =
preds[target]; margin[~target] = -preds[~target]``; MulticlassHingeLoss
(``"crammer-singer"``, the default) takes ``preds[target]`` and
``preds[~target].view(...)``; MultilabelCoverageError writes a device value through a
mask, ``offset[target == 0] = preds.min().abs() + 10``. On CUDA a boolean index (and an
assignment of a tensor through one) reads the mask back to the host to size its
result: four syncs per hinge update, one per coverage update, although every shape is
fixed. Before 1.6.1 ``_multiclass_hinge_loss_update`` also decides on a softmax with
``if not torch.all((preds >= 0) * (preds <= 1))`` (one more read; the logits_check patch
leaves this function to this one). Not fixed upstream (1.9.0 included).

Repair: edits of those statements in the release's own functions (:mod:`tmpatch.engine.rewrite`;
the rest of each function runs as released):

* ``margin[target] = preds[target]; margin[~target] = -preds[~target]`` becomes
  ``torch.where(target, preds, -preds)`` (every position is written by one of the two);
* crammer-singer: ``preds[target]`` (one True per one-hot row) becomes a ``gather`` at
  the row's True position, and the maximum over ``preds[~target]`` the maximum of
  ``preds`` with the target position set to ``-inf`` (it can only lower the maximum to a
  value the release's maximum also has, NaN included);
* ``offset[target == 0] = value`` becomes ``torch.where(target == 0, value, offset)``;
* before 1.6.1, the softmax ``if`` becomes logits_check's device-side selection.

Each is an exact copy or a maximum of the same values: results and gradients are the
release's bit for bit, except that before 1.6.1 the softmax (and, in logits_check, the
binary sigmoid) selection passes gradients through both branches, so a zero gradient may
come back as +0.0 where the release gives -0.0. Inputs the edits do not cover take the release's statements:
mask and values of different shapes (the release raises), non-float or empty ``preds``
for crammer-singer, a value of another dtype or device for the coverage offset.
``ignore_index`` still removes the ignored positions in the formatter (a boolean index
whose result sets the state's count: inherent as written upstream).

Releases: 0.10.0-1.9.0 (two implementations of ``_binary_hinge_loss_update`` and of
``_multilabel_coverage_error_update``, four of ``_multiclass_hinge_loss_update``;
annotations, and the softmax check before 1.6.1, spelled ``(0 <= preds)`` in 0.10-0.11).
"""
from __future__ import annotations

from types import ModuleType
from typing import Any, Dict, Optional

from tmpatch.patches import logits_check
from tmpatch.spec import PATCHED, Edit, Label, Patch, Rewrite, Target, Variant, since, span


def _helpers(module: ModuleType) -> Dict[str, Any]:
    import torch

    where, Tensor, inf = torch.where, torch.Tensor, float("inf")

    def signed(preds: Any, target: Any) -> Optional[Any]:
        """``preds`` where ``target``, ``-preds`` elsewhere, as the sum of two selections (the second
        negated, NaN signs as the release's): the gradient is the release's bit for bit (``0 + g``: a
        zero gradient comes back as +0.0, as from the release's accumulating index backward); a zero
        margin may differ in sign, which ``1 - margin`` does not show. None (the release's
        statements) for other shapes or dtypes."""
        if (not isinstance(preds, Tensor) or preds.dtype is torch.bool or target.dtype is not torch.bool
                or target.shape != preds.shape):
            return None
        return where(target, preds, 0) + where(target, 0, preds).neg()

    def crammer_singer(preds: Any, target: Any) -> Optional[Any]:
        """``preds[target] - max(preds[~target] per row)`` for a one-hot boolean ``target``."""
        if (not isinstance(preds, Tensor) or not preds.is_floating_point() or target.dtype is not torch.bool
                or preds.dim() != 2 or target.shape != preds.shape or preds.shape[0] == 0):
            return None
        own = preds.gather(1, target.to(torch.uint8).argmax(1, keepdim=True)).squeeze(1)
        own -= torch.max(preds.masked_fill(target, -inf), dim=1)[0]
        return own

    def fill_where(dest: Any, mask: Any, value: Any) -> Any:
        """``dest[mask] = value`` for a 0-d ``value``, as a selection on the device."""
        if (isinstance(value, Tensor) and value.dim() == 0 and value.dtype == dest.dtype
                and value.device == dest.device and mask.dtype is torch.bool and mask.shape == dest.shape):
            return where(mask, value, dest)
        dest[mask] = value
        return dest

    return {"_tmpatch_signed": signed, "_tmpatch_crammer_singer": crammer_singer, "_tmpatch_fill_where": fill_where}


def _names(module: ModuleType) -> Dict[str, Any]:
    return {**_helpers(module), **logits_check._helpers(module)}


_MARGIN = "margin[target] = preds[target]\nmargin[~target] = -preds[~target]\n"
SIGNED = Edit(_MARGIN, "_tmpatch_margin = _tmpatch_signed(preds, target)\n"
                       "if _tmpatch_margin is None:\n" + "".join(f"    {line}\n" for line in _MARGIN.splitlines())
              + "else:\n    margin = _tmpatch_margin\n")
_CS = "margin = preds[target]\nmargin -= torch.max(preds[~target].view(preds.shape[0], -1), dim=1)[0]\n"
CRAMMER_SINGER = Edit(_CS, "margin = _tmpatch_crammer_singer(preds, target)\n"
                           "if margin is None:\n" + "".join(f"    {line}\n" for line in _CS.splitlines()))
_OFFSET = "offset[target == 0] = preds.min().abs() + 10"
OFFSET = Edit(_OFFSET, "offset = _tmpatch_fill_where(offset, target == 0, preds.min().abs() + 10)")

BINARY = Rewrite((SIGNED,), _helpers)
MULTICLASS = Rewrite((CRAMMER_SINGER, SIGNED), _helpers)
MULTICLASS_SOFTMAX = Rewrite(logits_check.SOFTMAX.edits + (CRAMMER_SINGER, SIGNED), _names)  # before 1.6.1
MULTICLASS_SOFTMAX_0 = Rewrite(logits_check.SOFTMAX_0.edits + (CRAMMER_SINGER, SIGNED), _names)  # 0.10-0.11
COVERAGE = Rewrite((OFFSET,), _helpers)

_HINGE = "torchmetrics.functional.classification.hinge"

PATCH = Patch(
    name="classification_masks",
    summary="the hinge losses and MultilabelCoverageError select and assign through boolean masks on every "
            "update() (a sync each on CUDA); selections on the device instead",
    known=since("0.10.0"),
    requires=("logits_check",),  # before 1.6.1 the binary and multilabel formatters read the values too
    upstream="not fixed upstream (boolean indexing in _binary/_multiclass_hinge_loss_update and "
             "_multilabel_coverage_error_update)",
    labels=(
        Label(PATCHED, "hinge loss margin built with boolean-mask indexing and assignment; the "
              "classification_masks patch selects with torch.where / gather",
              function=r"_(binary|multiclass)_hinge_loss_update", op=r"aten\.index|aten\.index_put_"),
        Label(PATCHED, "multiclass hinge loss reads whether preds are probabilities to pick a softmax (before "
              "1.6.1); the classification_masks patch selects on the device",
              function="_multiclass_hinge_loss_update", op="aten._local_scalar_dense"),
        Label(PATCHED, "coverage error writes a device value through a boolean mask; the classification_masks "
              "patch selects with torch.where", function="_multilabel_coverage_error_update", op="aten.index_put_"),
    ),
    targets=(
        Target(
            module=_HINGE,
            qualname="_binary_hinge_loss_update",
            variants=(
                Variant(span("0.10.0", "1.5.2"), "2bc2c5cb531c3ebe", BINARY),
                Variant(span("1.6.0", "1.9.0"), "57173fb842f5317e", BINARY),  # annotation only
            ),
        ),
        Target(
            module=_HINGE,
            qualname="_multiclass_hinge_loss_update",
            variants=(
                Variant(span("0.10.0", "0.11.4"), "b541019da8727504", MULTICLASS_SOFTMAX_0),  # ``(0 <= preds)``
                Variant(span("1.0.0", "1.5.2"), "33c74dc57b3e4076", MULTICLASS_SOFTMAX),
                Variant(span("1.6.0"), "95aff742e3e21d24", MULTICLASS_SOFTMAX),  # annotation only
                Variant(span("1.6.1", "1.9.0"), "c997d47e3a34048f", MULTICLASS),  # normalize_logits_if_needed
            ),
        ),
        Target(
            module="torchmetrics.functional.classification.ranking",
            qualname="_multilabel_coverage_error_update",
            variants=(
                Variant(span("0.10.0", "1.5.2"), "9424ed499da22d7f", COVERAGE),
                Variant(span("1.6.0", "1.9.0"), "7199984e0c053bc0", COVERAGE),  # annotation only
            ),
        ),
    ),
)
