"""bincount on valid input: states, compute() and forward() values bit for bit the release's.

Every covered update (multiclass stat scores in every average, the three confusion
matrices, the three binned precision-recall curves with the metrics built on them), with
and without ``ignore_index``, ``validate_args`` both ways, through ``update()`` and
``forward()``; the reference is built unpatched in each example. Large batches take the
release's loop paths (over 50,000 values for binary curves, over 10^6 values x classes for
multiclass ones).
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from torchmetrics import classification as cls

from tests.conftest import assert_bitwise, examples
from tests.patches.bincount import cases
from tests.patches.bincount.cases import AVERAGES, CONFUSION, CURVES, MULTICLASS_CURVE_AVERAGE, STAT_SCORES

SETTINGS = settings(max_examples=examples(25), deadline=None, suppress_health_check=list(HealthCheck))


@SETTINGS
@given(st.data(), st.sampled_from(STAT_SCORES), st.sampled_from(AVERAGES), st.booleans(), st.booleans())
def test_multiclass_stat_scores_equal_the_releases(data, metric_cls, average, validate, forward):
    size, ignore, batches = data.draw(cases.classification_batches("multiclass", labels_allowed=True))

    def make():
        return metric_cls(num_classes=size, average=average, ignore_index=ignore, validate_args=validate)

    metric, expected = cases.pair(make, batches, forward)
    cases.assert_same(metric, expected)


@SETTINGS
@given(st.data(), st.sampled_from(sorted(CONFUSION)), st.booleans(), st.booleans())
def test_confusion_matrices_equal_the_releases(data, kind, validate, forward):
    metric_cls = data.draw(st.sampled_from(CONFUSION[kind]))
    size, ignore, batches = data.draw(cases.classification_batches(kind, labels_allowed=True))

    def make():
        return cases.build(kind, metric_cls, size, ignore_index=ignore, validate_args=validate)

    metric, expected = cases.pair(make, batches, forward)
    cases.assert_same(metric, expected)


@SETTINGS
@given(st.data(), st.sampled_from(sorted(CURVES)), st.booleans(), st.booleans())
def test_binned_curves_equal_the_releases(data, kind, validate, forward):
    metric_cls = data.draw(st.sampled_from(CURVES[kind]))
    size, ignore, batches = data.draw(cases.classification_batches(kind, labels_allowed=False))
    kwargs = cases.curve_kwargs(data.draw, kind, metric_cls, validate)

    def make():
        return cases.build(kind, metric_cls, size, ignore_index=ignore, validate_args=validate, **kwargs)

    metric, expected = cases.pair(make, batches, forward)
    cases.assert_same(metric, expected)


@pytest.mark.skipif(not MULTICLASS_CURVE_AVERAGE, reason="no ``average`` before 1.3.0")
@pytest.mark.parametrize("classes, thresholds", [(3, [0.4]), (2, 2)])
@pytest.mark.parametrize("ignore", [None, -1])
def test_binned_micro_curves_equal_the_releases(classes, thresholds, ignore):
    """Binned ``average="micro"`` runs upstream only where its (T, 2, 2) counts broadcast onto
    the (T, C, 2, 2) state: one threshold, or T == C == 2 (else both fail alike)."""
    torch.manual_seed(1)
    target = torch.randint(0, classes, (40,))
    if ignore is not None:
        target[::3] = ignore
    batches = [(torch.rand(40, classes), target), (torch.randn(7, classes), torch.tensor([0, 1, 1, 0, 1, 0, 0]))]

    def make():
        return cls.MulticlassPrecisionRecallCurve(classes, thresholds=thresholds, average="micro", ignore_index=ignore)

    metric, expected = cases.pair(make, batches)
    cases.assert_same(metric, expected)
    wrong, _ = cases.pair(lambda: cls.MulticlassPrecisionRecallCurve(3, thresholds=4, average="micro"),
                          [(torch.rand(4, 3), torch.tensor([0, 1, 2, 1]))])  # the release's failure, kept


# -- the release's loop paths ----------------------------------------------------------------------
@pytest.mark.parametrize("n, ignore_every", [(52_000, 8), (120_000, None)])
def test_large_binary_curves_equal_the_release(n, ignore_every):
    """Over 50,000 values upstream counts one threshold at a time. With ignored values it
    decides on the size left after removing them (52,000 -> 45,500: vectorised); the patch
    removes nothing and takes the loop: the counts are the same integers."""
    torch.manual_seed(2)
    target = torch.randint(0, 2, (n,))
    if ignore_every:
        target[::ignore_every] = -1
    preds = torch.rand(n)

    def make():
        return cls.BinaryPrecisionRecallCurve(thresholds=torch.tensor([0.0, 0.3, 0.5, 0.9, 1.0]),
                                              ignore_index=-1 if ignore_every else None, validate_args=False)

    metric, expected = cases.pair(make, [(preds, target)])
    assert_bitwise(metric.confmat, expected.confmat)


@pytest.mark.parametrize("ignore", [None, 255])
def test_large_multiclass_curves_equal_the_release(ignore):
    """Over 10^6 values x classes (50,000 x 5 x 5) upstream loops over thresholds."""
    torch.manual_seed(3)
    target = torch.randint(0, 5, (50_000,))
    if ignore is not None:
        target[::4] = ignore
    preds = torch.randn(50_000, 5)  # logits: softmax, as upstream

    def make():
        return cls.MulticlassPrecisionRecallCurve(5, thresholds=7, ignore_index=ignore, validate_args=False)

    metric, expected = cases.pair(make, [(preds, target)])
    assert_bitwise(metric.confmat, expected.confmat)


@pytest.mark.skipif(not MULTICLASS_CURVE_AVERAGE, reason="no ``average`` before 1.3.0")
def test_large_micro_curve_equals_the_release():
    """micro: flattened (N x C values), counted by the binary update (its loop here)."""
    torch.manual_seed(4)
    target = torch.randint(0, 2, (30_000,))
    target[::5] = -1

    def make():
        return cls.MulticlassPrecisionRecallCurve(2, thresholds=2, average="micro", ignore_index=-1,
                                                  validate_args=False)

    metric, expected = cases.pair(make, [(torch.rand(30_000, 2), target)])
    assert_bitwise(metric.confmat, expected.confmat)


@pytest.mark.parametrize("kind", sorted(CONFUSION))
def test_keyword_arguments_reach_the_same_counts(kind):
    torch.manual_seed(5)
    if kind == "binary":
        batches = [(torch.randn(9), torch.tensor([0, 1, -1, 1, 0, -1, 1, 1, 0]))]
    elif kind == "multiclass":
        batches = [(torch.randn(6, 3), torch.tensor([0, 2, -1, 1, -1, 2])),
                   (torch.tensor([2, 0]), torch.tensor([2, -1]))]
    else:
        batches = [(torch.randn(4, 3), torch.tensor([[0, 1, -1], [1, 1, 0], [-1, -1, 0], [0, 0, 1]]))]
    metric, expected = cases.pair(lambda: cases.build(kind, CONFUSION[kind][0], 3, ignore_index=-1), batches)
    metric.reset()
    for p, t in batches:
        metric.update(preds=p, target=t)
    cases.assert_same(metric, expected)
