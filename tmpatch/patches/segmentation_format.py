"""segmentation_format: MeanIoU and GeneralizedDiceScore (1.4.x) tell their input format without reading boolean inputs.

Defect: in 1.4.0-1.4.3, ``_mean_iou_update`` and ``_generalized_dice_update`` decide whether
``preds`` and ``target`` are class indices (made one-hot) or already one-hot by reading
their values: ``if (preds.bool() != preds).any():`` and the same for ``target``, two reads
on every ``update()`` of MeanIoU and GeneralizedDiceScore. Fixed upstream in 1.5.0 (an
``input_format`` argument).

Repair: the two ``if`` conditions come from one helper (an edit of the two statements,
:mod:`tmpatch.engine.rewrite`; the one-hot conversions are the release's): for a boolean tensor
``t.bool() != t`` is all False, so its answer is known without a read. That is the
documented one-hot format; MeanIoU and GeneralizedDiceScore updates with boolean inputs
then read nothing. For other dtypes the format decides the shape of what follows, so it
must be read: both conditions are read in one transfer instead of two. Results are the
release's: the conditions are its own.

Releases: 1.4.0-1.4.3 patched (one implementation of each function); 1.5.0+ not needed;
before 1.4.0 the functions do not exist.
"""
from __future__ import annotations

import textwrap
from types import ModuleType
from typing import Any, Dict, Tuple

from tmpatch.spec import INHERENT, UPSTREAM, Decline, Edit, Label, Patch, Rewrite, Target, Variant, since, span


def _names(module: ModuleType) -> Dict[str, Any]:
    import torch

    bool_, stack = torch.bool, torch.stack

    def index_formats(preds: Any, target: Any) -> Tuple[bool, bool]:
        """The release's ``(preds.bool() != preds).any()`` and the same of ``target``, as host bools:
        known for boolean tensors, else read together."""
        unknown = [t for t in (preds, target) if t.dtype is not bool_]
        if not unknown:
            return False, False
        flags = [(t.bool() != t).any() for t in unknown]
        read = iter(stack(flags).tolist() if len({f.device for f in flags}) == 1 else [bool(f) for f in flags])
        first, second = (False if t.dtype is bool_ else bool(next(read)) for t in (preds, target))
        return first, second

    return {"_tmpatch_index_formats": index_formats}


_ONE_HOT = "{0} = torch.nn.functional.one_hot({0}, num_classes=num_classes).movedim(-1, 1)"
_FIND = "".join(f"if ({name}.bool() != {name}).any():\n    {_ONE_HOT.format(name)}\n" for name in ("preds", "target"))
FORMATS = Rewrite((Edit(_FIND, "_tmpatch_index = _tmpatch_index_formats(preds, target)\n" + "".join(
    f"if _tmpatch_index[{i}]:\n{textwrap.indent(_ONE_HOT.format(name), '    ')}\n"
    for i, name in enumerate(("preds", "target")))),), _names)

_SEG = "torchmetrics.functional.segmentation"

PATCH = Patch(
    name="segmentation_format",
    summary="MeanIoU and GeneralizedDiceScore (1.4.x) read preds and target to detect their format on each "
            "update(); known without a read for boolean (one-hot) inputs, one read instead of two otherwise",
    known=since("0.10.0"),
    declines=(Decline(span("0.10.0", "0.11.4"),
                      "nothing to repair: the segmentation MeanIoU and GeneralizedDiceScore came in 1.4.0",
                      needed=False),),
    upstream="fixed upstream in 1.5.0 (input_format argument)",
    labels=(
        Label(UPSTREAM, "MeanIoU/GeneralizedDiceScore 1.4.x read the inputs to detect index or one-hot format (fixed "
              "upstream in 1.5.0); the segmentation_format patch reads nothing for boolean inputs",
              function=r"_mean_iou_update|_generalized_dice_update", op="aten._local_scalar_dense"),
        Label(INHERENT, "MeanIoU/GeneralizedDiceScore 1.4.x with non-boolean inputs: the values decide the format, "
              "so the shape of what follows (one read for both inputs with the segmentation_format patch)",
              function="index_formats", patch="segmentation_format"),
    ),
    targets=(
        Target(module=f"{_SEG}.mean_iou", qualname="_mean_iou_update", present=since("1.4.0"), variants=(
            Variant(span("1.4.0", "1.4.3"), "301c647051a4f618", FORMATS),
            Variant(span("1.5.0", "1.5.2"), "b07a5d1fefe8da31"),  # input_format
            Variant(span("1.6.0", "1.6.3"), "a88524b73611283c"),
            Variant(span("1.7.0"), "c7e0864553041b59"),
            Variant(span("1.7.1", "1.7.4"), "f0f25de1c97b1095"),
            Variant(span("1.8.0"), "cdd9fbb4762471d6"),
            Variant(span("1.8.1", "1.9.0"), "b484997d7e9c0741"),
        )),
        Target(module=f"{_SEG}.generalized_dice", qualname="_generalized_dice_update", present=since("1.4.0"),
               variants=(
            Variant(span("1.4.0", "1.4.3"), "607e0e1b4728f41d", FORMATS),
            Variant(span("1.5.0", "1.5.2"), "b65753ba80b45cdf"),  # input_format
            Variant(span("1.6.0", "1.7.4"), "6603d03581a765de"),
            Variant(span("1.8.0"), "21507f0d3425b7b1"),
            Variant(span("1.8.1", "1.9.0"), "e08d8b03b30ead5b"),
        )),
    ),
)
