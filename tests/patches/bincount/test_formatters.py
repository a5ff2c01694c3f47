"""bincount's formatter edits: the release's removal of ignored positions, kept in place
during recorded updates only; joined with logits_check's edit of the same formatters
(before 1.6.1), each removable alone."""
from __future__ import annotations

import importlib

import pytest
import torch
from torchmetrics import classification as cls

import tmpatch
from tests.conftest import assert_bitwise, release_in
from tests.patches.bincount import cases

CONFUSION_FN = "torchmetrics.functional.classification.confusion_matrix"
CURVE_FN = "torchmetrics.functional.classification.precision_recall_curve"


@pytest.mark.parametrize("module, name, args", [
    (CONFUSION_FN, "_binary_confusion_matrix_format", (torch.tensor([0.2, 3.0, 0.7]), torch.tensor([0, -1, 1]),
                                                       0.5, -1)),
    (CONFUSION_FN, "_multiclass_confusion_matrix_format", (torch.randn(3, 4), torch.tensor([0, -1, 3]), -1)),
    (CURVE_FN, "_binary_precision_recall_curve_format", (torch.tensor([0.2, 3.0, 0.7]), torch.tensor([0, -1, 1]),
                                                         4, -1)),
    (CURVE_FN, "_multiclass_precision_recall_curve_format", (torch.rand(3, 4), torch.tensor([0, -1, 3]), 4, 3,
                                                             -1)),
])
def test_outside_a_recorded_update_the_formatters_are_the_releases(module, name, args):
    """The functional API (and compute-time callers) get the release's removal."""
    function = getattr(importlib.import_module(module), name)
    cases.apply()
    edited = getattr(importlib.import_module(module), name)
    assert edited is not function and tmpatch.is_patched(edited)
    got, want = edited(*args), tmpatch.get_original(edited)(*args)
    for g, w in zip(got, want):
        if isinstance(w, torch.Tensor):
            assert_bitwise(g, w)
        else:
            assert g == w


def _syncs(make, preds, target):
    from tmpatch.audit import audit

    report = audit(make().update, preds, target, real=False)
    return {(p.function, p.op) for p in report.sync_points}


@pytest.mark.skipif(release_in(">=1.6.1"), reason="logits_check is not needed from 1.6.1")
def test_joined_edits_of_one_formatter_come_off_one_at_a_time():
    preds, target = torch.rand(16), torch.randint(0, 2, (16,))
    target[::3] = -1

    def make():
        return cls.BinaryConfusionMatrix(ignore_index=-1, validate_args=False)

    removal = ("_binary_confusion_matrix_format", "aten.index")
    logits = ("_binary_confusion_matrix_format", "aten._local_scalar_dense")
    assert {removal, logits} <= _syncs(make, preds, target)
    states = tmpatch.apply(["bincount", "logits_check"]).states()
    assert states["bincount"] == states["logits_check"] == "applied"
    assert _syncs(make, preds, target) == set()
    tmpatch.revert("logits_check")
    assert _syncs(make, preds, target) == {logits}  # bincount's edit stays
    tmpatch.apply("logits_check")
    tmpatch.revert("bincount")
    left = _syncs(make, preds, target)
    assert removal in left and logits not in left  # logits_check's edit stays
    tmpatch.revert()
    assert {removal, logits} <= _syncs(make, preds, target)


def test_an_ignored_logit_does_not_decide_for_the_kept_values():
    """The release decides "logits or probabilities" after removing ignored positions; the
    edit sets ignored float preds to 0 so the decision is the same."""
    preds, target = torch.tensor([0.2, -5.0, 0.7, 0.9]), torch.tensor([0, -1, 1, 1])

    def make():
        return cls.BinaryPrecisionRecallCurve(thresholds=3, ignore_index=-1, validate_args=False)

    metric, expected = cases.pair(make, [(preds, target)])
    cases.assert_same(metric, expected)
