"""dice_weights: GeneralizedDiceScore's infinite-weight replacement without boolean-mask indexing.

Defect: ``torchmetrics.functional.segmentation.generalized_dice._generalized_dice_update``
replaces the infinite class weights (classes absent from a sample's target) with
``weights_flatten[infs] = w_max[infs]``: on CUDA a boolean index and an assignment of a
tensor through one read the mask back to the host, two syncs on every ``update()`` of
GeneralizedDiceScore (the ``weights_flatten[infs] = 0`` before it becomes ``masked_fill``
and does not sync). Not fixed upstream (1.9.0 included).

Repair: that statement of the release's function (an edit, :mod:`tmpatch.engine.rewrite`; the
rest runs as released) becomes ``torch.where(infs, w_max, weights_flatten)``: the same
values at the same positions (the release's pairing of ``w_max``'s and the weights'
flattened orders included), so scores are the release's bit for bit. Applies to the
functional API too. In 1.4.x the function also decides whether ``preds`` and ``target``
are index tensors by reading ``(x.bool() != x).any()``: the answer sets the shapes that
follow (one-hot or not), so those two reads are inherent to that code (1.5.0 made it an
``input_format`` argument).

Releases: 1.4.0-1.9.0, where GeneralizedDiceScore exists (five implementations of the
function; the statement is the same in all).
"""
from __future__ import annotations

from types import ModuleType
from typing import Any, Dict

from tmpatch.spec import INHERENT, PATCHED, Decline, Edit, Label, Patch, Rewrite, Target, Variant, since, span


def _helpers(module: ModuleType) -> Dict[str, Any]:
    import torch

    where, Tensor = torch.where, torch.Tensor

    def take(mask: Any, source: Any, dest: Any) -> Any:
        """``dest[mask] = source[mask]`` as a selection on the device (the release's assignment
        for shapes, dtypes or devices that differ)."""
        if (isinstance(source, Tensor) and isinstance(dest, Tensor) and mask.dtype is torch.bool
                and mask.shape == source.shape == dest.shape and source.dtype == dest.dtype
                and source.device == dest.device == mask.device):
            return where(mask, source, dest)
        dest[mask] = source[mask]
        return dest

    return {"_tmpatch_take_weights": take}


EDITS = Rewrite(
    (Edit("weights_flatten[infs] = w_max[infs]",
          "weights_flatten = _tmpatch_take_weights(infs, w_max, weights_flatten)"),),
    _helpers,
)

PATCH = Patch(
    name="dice_weights",
    summary="GeneralizedDiceScore replaces infinite class weights through a boolean mask (two syncs per "
            "update on CUDA); selected on the device instead",
    known=since("0.10.0"),
    declines=(Decline(span("0.10.0", "0.11.4"),
                      "nothing to repair: the segmentation GeneralizedDiceScore came in 1.4.0",
                      needed=False),),
    requires=("safe_divide",),  # the update divides with _safe_divide (a host copy before 1.9.0)
    upstream="not fixed upstream (weights_flatten[infs] = w_max[infs] in _generalized_dice_update)",
    labels=(
        Label(PATCHED, "generalized dice replaces infinite weights through a boolean mask; the dice_weights patch "
              "selects with torch.where", function="_generalized_dice_update", op=r"aten\.index|aten\.index_put_"),
        Label(INHERENT, "generalized dice (1.4.x) reads whether preds/target are index tensors: the answer sets "
              "the shapes (one-hot or not); 1.5.0 made it the input_format argument",
              function="_generalized_dice_update", op="aten._local_scalar_dense", patch="dice_weights"),
    ),
    targets=(
        Target(
            module="torchmetrics.functional.segmentation.generalized_dice",
            qualname="_generalized_dice_update",
            present=since("1.4.0"),
            variants=(
                Variant(span("1.4.0", "1.4.3"), "607e0e1b4728f41d", EDITS),
                Variant(span("1.5.0", "1.5.2"), "b65753ba80b45cdf", EDITS),  # input_format
                Variant(span("1.6.0", "1.7.4"), "6603d03581a765de", EDITS),  # the rank check after one_hot
                Variant(span("1.8.0"), "21507f0d3425b7b1", EDITS),  # input_format "mixed"
                Variant(span("1.8.1", "1.9.0"), "e08d8b03b30ead5b", EDITS),  # _segmentation_inputs_format
            ),
        ),
    ),
)
