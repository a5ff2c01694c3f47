"""logits_check: binary/multilabel stat-score formatters choose sigmoid on the device (before 1.6.1)."""
from __future__ import annotations

import sys

import pytest
import torch
from hypothesis import given, settings, strategies as st

import tmpatch
from tests.conftest import assert_bitwise, release_in
from torchmetrics import classification as cls
import torchmetrics.functional.classification.stat_scores  # noqa: F401  (the module, not the function)

NEEDED = release_in("<1.6.1")
pytestmark = pytest.mark.skipif(not NEEDED, reason="fixed upstream in 1.6.1 (the patch reports not-needed)")
fmt = sys.modules["torchmetrics.functional.classification.stat_scores"]
NAN, INF = float("nan"), float("inf")
VALUES = [0.0, 1.0, 0.5, 0.25, 0.75, -0.0, -0.5, 1.5, 3.0, -2.0, NAN, INF, -INF, 1e-8]
DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


def _apply(expected: str = "applied") -> None:
    row = next(r for r in tmpatch.apply(["logits_check"]) if r.name == "logits_check")
    assert row.state == expected, row


def test_state_on_this_release():
    _apply()


@st.composite
def _case(draw, multilabel: bool):
    dtype = draw(st.sampled_from(DTYPES))
    rows = draw(st.integers(0, 4))
    cols = draw(st.integers(0, 3))
    pool = draw(st.sampled_from([VALUES[:6], VALUES]))  # probabilities only, or anything
    values = draw(st.lists(st.sampled_from(pool), min_size=rows * cols, max_size=rows * cols))
    preds = torch.tensor(values, dtype=torch.float64).reshape(rows, cols).to(dtype)
    target = torch.tensor(draw(st.lists(st.sampled_from([0, 1, -1, 2]), min_size=rows * cols, max_size=rows * cols)))
    return preds, target.reshape(rows, cols)


@settings(max_examples=120, deadline=None)
@given(st.booleans(), st.data(), st.sampled_from([None, -1, 2]), st.sampled_from([0.5, 0.3]))
def test_formatters_are_bitwise_the_releases(multilabel, data, ignore_index, threshold):
    preds, target = data.draw(_case(multilabel))
    if multilabel:
        call = lambda f: f(preds, target, preds.shape[1] if preds.ndim > 1 else 1, threshold, ignore_index)  # noqa: E731
        name = "_multilabel_stat_scores_format"
    else:
        call = lambda f: f(preds, target, threshold, ignore_index)  # noqa: E731
        name = "_binary_stat_scores_format"
    try:
        expected = call(tmpatch.get_original(getattr(fmt, name)))
    except RuntimeError as exc:  # e.g. an empty batch: reshape(0, -1) fails upstream; the same patched
        _apply()
        with pytest.raises(type(exc)):
            call(getattr(fmt, name))
        return
    _apply()
    got = call(getattr(fmt, name))
    for a, b in zip(got, expected):
        assert_bitwise(a, b)


@pytest.mark.parametrize(
    "preds, sigmoid",
    [([0.2, 0.9], False), ([0.2, 1.5], True), ([-3.0, 0.1], True), ([0.2, NAN], True), ([], False)],
)
def test_all_or_nothing_as_the_release(preds, sigmoid):
    x = torch.tensor(preds).reshape(-1, 1) if preds else torch.empty(2, 0)
    _apply()
    got, _ = fmt._binary_stat_scores_format(x, torch.zeros_like(x, dtype=torch.long), 0.5)
    assert torch.equal(got, (x.sigmoid() if sigmoid else x) > 0.5)


METRICS = [cls.BinaryAccuracy, cls.BinaryPrecision, cls.BinaryRecall, cls.BinaryF1Score, cls.BinaryStatScores]
ML_METRICS = [cls.MultilabelAccuracy, cls.MultilabelPrecision, cls.MultilabelRecall, cls.MultilabelF1Score,
              cls.MultilabelStatScores]


@pytest.mark.parametrize("metric", METRICS + ML_METRICS, ids=lambda m: m.__name__)
def test_update_is_sync_free_on_simulated_cuda(metric):
    from tmpatch.audit import audit

    kwargs = {"num_labels": 3} if metric in ML_METRICS else {}
    preds, target = torch.randn(8, 3), torch.randint(0, 2, (8, 3))
    unpatched = audit(metric(validate_args=False, **kwargs).update, preds, target)
    assert unpatched.count >= 1 and any("stat_scores.py" in p.location for p in unpatched.sync_points)
    _apply()
    patched = audit(metric(validate_args=False, **kwargs).update, preds, target)
    assert patched.count == 0, str(patched)


@pytest.mark.parametrize("metric", METRICS + ML_METRICS, ids=lambda m: m.__name__)
def test_metric_results_equal_the_releases(metric):
    torch.manual_seed(1)
    kwargs = {"num_labels": 3} if metric in ML_METRICS else {}
    batches = [(torch.rand(6, 3), torch.randint(0, 2, (6, 3))), (torch.randn(5, 3) * 3, torch.randint(0, 2, (5, 3)))]
    reference = metric(validate_args=False, **kwargs)
    for p, t in batches:
        reference.update(p, t)
    _apply()
    patched = metric(validate_args=False, **kwargs)
    for p, t in batches:
        patched.update(p, t)
    assert_bitwise(patched.compute(), reference.compute())
