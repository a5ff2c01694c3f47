"""vif_masks: VisualInformationFidelity's variance corrections select on the device, as the release."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

import tmpatch
from tests.conftest import assert_bitwise, examples, release_in

pytestmark = pytest.mark.skipif(release_in("<1.1.0"), reason="VisualInformationFidelity arrived in 1.1.0")


def _apply() -> None:
    row = next(r for r in tmpatch.apply(["vif_masks"]) if r.name == "vif_masks")
    assert row.state == "applied", row


def _metric():
    from torchmetrics.image import VisualInformationFidelity

    return VisualInformationFidelity()


def _images(seed: int, channels: int = 1, n: int = 2):
    """Noise with flat blocks (target variance below eps) and anti-correlated patches (gain < 0)."""
    g = torch.Generator().manual_seed(seed)
    target = torch.rand(n, channels, 44, 42, generator=g)
    target[:, :, :20, :20] = 0.5
    preds = target + 0.1 * torch.randn(n, channels, 44, 42, generator=g)
    preds[:, :, 24:, 20:] = 1 - target[:, :, 24:, 20:]
    preds[:, :, 30:, :10] = 0.25
    return preds, target


# -- sync ---------------------------------------------------------------------------------------
def test_update_and_forward_have_no_mask_sync_on_simulated_cuda():
    """Unpatched: four boolean indexes/assignments per scale. Patched: none; what is left is the
    release's torch.tensor(eps) and torch.tensor(sigma_n_sq) copies (host values made tensors)."""
    from tmpatch.audit import audit

    preds, target = _images(0)
    unpatched = audit(_metric().update, preds, target, real=False)
    assert [p.op for p in unpatched.sync_points].count("aten.index_put_") == 8, str(unpatched)
    _apply()
    for call in (_metric().update, _metric()):
        report = audit(call, preds, target, real=False)
        assert report.error is None and all(p.kind.value == "host-to-device copy" for p in report.sync_points), \
            str(report)


# -- same results ---------------------------------------------------------------------------------
def _run(cases, forward: bool):
    out = []
    for seed, channels, dtype in cases:
        preds, target = (t.to(dtype) for t in _images(seed, channels))
        metric = _metric()
        (metric if forward else metric.update)(preds, target)
        out.append(metric.compute())
    return out


@settings(max_examples=examples(3), deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**16), st.integers(1, 2), st.sampled_from([torch.float32, torch.float64])),
                min_size=1, max_size=3), st.booleans())
def test_scores_equal_the_releases(cases, forward):
    """(The release's backward through VIF fails: it edits tensors in place that autograd saved.)"""
    tmpatch.revert()
    want = _run(cases, forward)
    _apply()
    for score, score0 in zip(_run(cases, forward), want):
        assert_bitwise(score, score0)


def test_functional_api_and_the_release_when_excluded():
    from torchmetrics.functional.image import vif

    preds, target = _images(3, 3)
    want = vif.visual_information_fidelity(preds, target)
    _apply()
    assert tmpatch.is_patched(vif._vif_per_channel)
    assert_bitwise(vif.visual_information_fidelity(preds, target), want)
    tmpatch.revert()
    tmpatch.apply(exclude=["vif_masks", "image_constants"])  # image_constants edits it too
    assert not tmpatch.is_patched(vif._vif_per_channel)
