"""dice_weights: GeneralizedDiceScore's infinite weights replaced on the device, as the release."""
from __future__ import annotations

import inspect

import pytest
import torch
from hypothesis import given, settings, strategies as st

import tmpatch
from tests.conftest import assert_bitwise, examples, release_in

pytestmark = pytest.mark.skipif(release_in("<1.4.0"), reason="GeneralizedDiceScore arrived in 1.4.0")
K = 4


def _apply() -> None:
    row = next(r for r in tmpatch.apply(["dice_weights"]) if r.name == "dice_weights")
    assert row.state == "applied", row


def _metric(**kwargs):
    from torchmetrics.segmentation import GeneralizedDiceScore

    if "input_format" not in inspect.signature(GeneralizedDiceScore.__init__).parameters:
        kwargs.pop("input_format", None)  # 1.4.x tells index tensors from one-hot ones by their values
    return GeneralizedDiceScore(num_classes=K, **kwargs)


def _one_hot(labels: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.one_hot(labels, K).movedim(-1, 1)


# -- sync ---------------------------------------------------------------------------------------
def test_update_and_forward_have_no_mask_sync_on_simulated_cuda():
    """Unpatched: the boolean index and the assignment through it. Patched: none (1.4.x keeps its
    reads of whether the inputs are index tensors: they set the shapes)."""
    from tmpatch.audit import audit

    labels = torch.zeros(2, 6, 6, dtype=torch.long)  # class 3 absent from the target: infinite weights
    labels[:, :3] = 1
    labels[1, :, :2] = 2
    preds, target = _one_hot(labels.roll(1, 1)), _one_hot(labels)
    unpatched = audit(_metric().update, preds, target, real=False)
    assert {p.op for p in unpatched.sync_points if p.function == "_generalized_dice_update"} >= \
        {"aten.index", "aten.index_put_"}, str(unpatched)
    _apply()
    for call in (_metric().update, _metric()):
        report = audit(call, preds, target, real=False)
        left = [p for p in report.sync_points if not (release_in("<1.5.0") and p.op == "aten._local_scalar_dense")]
        assert report.error is None and not left, str(report)


# -- same results ---------------------------------------------------------------------------------
@st.composite
def _cases(draw):
    n, h, w = draw(st.integers(1, 3)), draw(st.integers(1, 4)), draw(st.integers(1, 4))
    labels = [torch.tensor(draw(st.lists(st.integers(0, K - 1), min_size=n * h * w, max_size=n * h * w))).view(n, h, w)
              for _ in range(2)]
    options = dict(weight_type=draw(st.sampled_from(["square", "simple", "linear"])),
                   include_background=draw(st.booleans()), per_class=draw(st.booleans()),
                   input_format=draw(st.sampled_from(["one-hot", "index"])))
    return labels, options, draw(st.booleans())


def _run(case):
    (preds, target), options, forward = case
    metric = _metric(**options)
    if options["input_format"] == "one-hot" or release_in("<1.5.0"):
        preds, target = _one_hot(preds), _one_hot(target)
    values = [(metric if forward else metric.update)(preds, target)] if forward else []
    if not forward:
        metric.update(preds, target)
    return values + [metric.score, metric.samples, metric.compute()]


@settings(max_examples=examples(6), deadline=None)
@given(st.lists(_cases(), min_size=1, max_size=6))
def test_states_and_scores_equal_the_releases(cases):
    tmpatch.revert()
    want = [_run(case) for case in cases]
    _apply()
    for case, expected in zip(cases, want):
        for got, exp in zip(_run(case), expected):
            assert_bitwise(got, exp)


def test_excluded_the_release_runs():
    from torchmetrics.functional.segmentation import generalized_dice

    tmpatch.apply(exclude=["dice_weights", "segmentation_format"])  # segmentation_format edits it too (1.4.x)
    assert not tmpatch.is_patched(generalized_dice._generalized_dice_update)
