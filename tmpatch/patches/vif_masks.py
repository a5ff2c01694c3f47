"""vif_masks: VisualInformationFidelity's variance corrections without boolean-mask indexing.

Defect: ``torchmetrics.functional.image.vif._vif_per_channel`` corrects the local
variances at each of its four scales with ``sigma_v_sq[mask] = sigma_preds_sq[mask]``,
twice (where the target's variance is below ``eps``, and where the gain ``g`` is
negative): on CUDA a boolean index and an assignment of a tensor through one read the
mask back to the host, four syncs per scale and channel, 16 per update of a
single-channel VisualInformationFidelity (the assignments of ``0`` through the same masks
become ``masked_fill`` on the device and do not sync). Not fixed upstream (1.9.0
included).

Repair: those two statements of the release's function (edits, :mod:`tmpatch.engine.rewrite`;
the rest runs as released) become ``torch.where(mask, sigma_preds_sq, sigma_v_sq)``: the
same values at the same positions, so the score is the release's bit for bit. (Backward
through the release's function fails: it edits in place tensors that autograd saved, and
still does.) Applies to the functional API too. The ``torch.tensor(eps)`` and ``torch.tensor(sigma_n_sq)`` copies at
the top of the function (host values made device tensors) are not this patch's.

Releases: 1.1.0-1.9.0, where VisualInformationFidelity exists (two implementations of
``_vif_per_channel``: per-image sums since 1.8.1).
"""
from __future__ import annotations

from types import ModuleType
from typing import Any, Dict

from tmpatch.spec import PATCHED, Decline, Edit, Label, Patch, Rewrite, Target, Variant, since, span


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

    return {"_tmpatch_take": take}


_FIRST = "sigma_v_sq[mask] = sigma_preds_sq[mask]\nsigma_target_sq[mask] = 0\n"
_SECOND = "mask = g < 0\nsigma_v_sq[mask] = sigma_preds_sq[mask]\n"
_TAKE = "sigma_v_sq = _tmpatch_take(mask, sigma_preds_sq, sigma_v_sq)\n"

EDITS = Rewrite(
    (Edit(_FIRST, _TAKE + "sigma_target_sq[mask] = 0\n"), Edit(_SECOND, "mask = g < 0\n" + _TAKE)),
    _helpers,
)

PATCH = Patch(
    name="vif_masks",
    summary="VisualInformationFidelity copies variances through boolean masks, 16 syncs per update and "
            "channel on CUDA; selected on the device instead",
    known=since("0.10.0"),
    declines=(Decline(span("0.10.0", "0.11.4"),
                      "nothing to repair: VisualInformationFidelity came in 1.1.0",
                      needed=False),),
    upstream="not fixed upstream (sigma_v_sq[mask] = sigma_preds_sq[mask] in _vif_per_channel)",
    labels=(
        Label(PATCHED, "VIF copies local variances through boolean masks; the vif_masks patch selects with "
              "torch.where", function="_vif_per_channel", op=r"aten\.index|aten\.index_put_"),
    ),
    targets=(
        Target(
            module="torchmetrics.functional.image.vif",
            qualname="_vif_per_channel",
            present=since("1.1.0"),
            variants=(
                Variant(span("1.1.0", "1.8.0"), "6930c39db95c9d8e", EDITS),
                Variant(span("1.8.1", "1.9.0"), "d123312e1a8fbb11", EDITS),  # per-image sums
            ),
        ),
    ),
)
