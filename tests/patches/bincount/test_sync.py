"""bincount on simulated CUDA: every covered update, with and without ``ignore_index``, makes
no host-device sync patched, where the release makes one in ``torch.bincount`` (min and max
read back) and one per boolean removal of ignored positions.

Before 1.6.1 the formatters also read ``torch.all(0 <= preds <= 1)`` (``logits_check``'s
defect): applied with it, no sync is left on any release.
"""
from __future__ import annotations

import pytest
import torch
from torchmetrics import classification as cls

import tmpatch
from tests.conftest import release_in
from tests.patches.bincount import cases
from tmpatch.runtime import policies


def _inputs(kind, ignore):
    torch.manual_seed(5)
    if kind == "binary":
        preds, target = torch.rand(16), torch.randint(0, 2, (16,))
    elif kind.startswith("multiclass"):  # "multiclass2": two classes
        classes = 2 if kind == "multiclass2" else 4
        preds, target = torch.randn(16, classes), torch.randint(0, classes, (16,))
    else:
        preds, target = torch.rand(16, 3), torch.randint(0, 2, (16, 3))
    if ignore is not None:
        target[::3] = ignore
    return preds, target


CASES = {
    "MulticlassStatScores-macro": ("multiclass", lambda ii: cls.MulticlassStatScores(
        4, average="macro", ignore_index=ii, validate_args=False)),
    "MulticlassAccuracy-micro": ("multiclass", lambda ii: cls.MulticlassAccuracy(
        4, average="micro", ignore_index=ii, validate_args=False)),
    "MulticlassF1Score-none": ("multiclass", lambda ii: cls.MulticlassF1Score(
        4, average="none", ignore_index=ii, validate_args=False)),
    "MulticlassPrecision-weighted": ("multiclass", lambda ii: cls.MulticlassPrecision(
        4, average="weighted", ignore_index=ii, validate_args=False)),
    "BinaryConfusionMatrix": ("binary", lambda ii: cls.BinaryConfusionMatrix(ignore_index=ii, validate_args=False)),
    "MulticlassConfusionMatrix": ("multiclass", lambda ii: cls.MulticlassConfusionMatrix(
        4, ignore_index=ii, validate_args=False)),
    "MultilabelConfusionMatrix": ("multilabel", lambda ii: cls.MultilabelConfusionMatrix(
        3, ignore_index=ii, validate_args=False)),
    "MulticlassJaccardIndex": ("multiclass", lambda ii: cls.MulticlassJaccardIndex(
        4, ignore_index=ii, validate_args=False)),
    "BinaryPrecisionRecallCurve": ("binary", lambda ii: cls.BinaryPrecisionRecallCurve(
        thresholds=5, ignore_index=ii, validate_args=False)),
    "MulticlassPrecisionRecallCurve": ("multiclass", lambda ii: cls.MulticlassPrecisionRecallCurve(
        4, thresholds=[0.1, 0.5, 0.7], ignore_index=ii, validate_args=False)),
    "MultilabelPrecisionRecallCurve": ("multilabel", lambda ii: cls.MultilabelPrecisionRecallCurve(
        3, thresholds=torch.linspace(0, 1, 4), ignore_index=ii, validate_args=False)),
    "BinaryAUROC": ("binary", lambda ii: cls.BinaryAUROC(thresholds=5, ignore_index=ii, validate_args=False)),
    "MulticlassAveragePrecision": ("multiclass", lambda ii: cls.MulticlassAveragePrecision(
        4, thresholds=5, ignore_index=ii, validate_args=False)),
}
if cases.MULTICLASS_CURVE_AVERAGE:
    # upstream's binned micro update runs only where its counts broadcast onto the state (T == C == 2)
    CASES["MulticlassPrecisionRecallCurve-micro"] = ("multiclass2", lambda ii: cls.MulticlassPrecisionRecallCurve(
        2, thresholds=2, average="micro", ignore_index=ii, validate_args=False))


def _logits_check(point) -> bool:
    """The formatters' ``torch.all(0 <= preds <= 1)`` read before 1.6.1 (``logits_check``)."""
    return point.function.endswith("_format") and point.op == "aten._local_scalar_dense"


def _ignore_removal(point) -> bool:
    return point.op == "aten.index" and point.function.endswith(("_format", "_update"))


@pytest.mark.parametrize("ignore", [None, -1])
@pytest.mark.parametrize("name", sorted(CASES))
def test_covered_updates_are_sync_free_on_simulated_cuda(name, ignore):
    from tmpatch.audit import audit

    kind, make = CASES[name]
    preds, target = _inputs(kind, ignore)
    unpatched = audit(make(ignore).update, preds, target, real=False)
    ops = {(p.function, p.op) for p in unpatched.sync_points}
    micro = name.endswith("micro")
    if not micro and not cases.INDEX_ADD:  # the release counts with _bincount (micro stat scores and micro
        assert ("_bincount", "aten.bincount") in ops, str(unpatched)  # curves count otherwise)
    if ignore is not None or kind == "multilabel":  # boolean removals (multilabel: of negative codes, always)
        assert any(_ignore_removal(p) for p in unpatched.sync_points), str(unpatched)
    cases.apply()
    patched = audit(make(ignore).update, preds, target, real=False)
    assert [p for p in patched.sync_points if not _logits_check(p)] == [], str(patched)
    if release_in(">=1.6.1"):
        assert patched.count == 0, str(patched)


@pytest.mark.parametrize("name", sorted(CASES))
def test_with_logits_check_no_sync_is_left_on_any_release(name):
    """Both patches edit the same formatters before 1.6.1 (joined edits): no sync left, and
    the counts are the release's (logits at the ignored positions only: the sigmoid
    decision is taken on the kept values, as upstream after its removal)."""
    from tmpatch.audit import audit

    kind, make = CASES[name]
    preds, target = _inputs(kind, -1)
    ignored = (target == -1).unsqueeze(1) if kind.startswith("multiclass") else target == -1
    preds = torch.where(ignored.expand_as(preds), torch.full_like(preds, -7.0), preds)
    cases.unpatched()
    expected = make(-1)
    failed = cases.updates(expected, [(preds, target)])
    states = tmpatch.apply(["bincount", "logits_check"]).states()
    assert states["bincount"] == "applied" and states["logits_check"] in ("applied", "not-needed"), states
    metric = make(-1)
    assert cases.updates(metric, [(preds, target)]) == failed
    if failed is None:
        cases.assert_same(metric, expected)
    patched = audit(make(-1).update, preds, target, real=False)
    assert patched.count == 0, str(patched)


def test_unpatched_metrics_still_sync():
    """The audit sees the syncs these tests remove (so the patched zero means something)."""
    from tmpatch.audit import audit

    ignore = -1 if cases.INDEX_ADD else None  # 0.10.0-0.10.1 count without a read: the ignore_index removal
    preds, target = _inputs("multiclass", ignore)
    make = lambda: cls.MulticlassAccuracy(4, ignore_index=ignore, validate_args=False)  # noqa: E731
    assert audit(make().update, preds, target, real=False).count >= 1
    cases.apply()
    early = make()
    policies.current["bincount"] = "eager"
    try:
        assert audit(early.update, preds, target, real=False).count >= 1  # eager: the release's update
    finally:
        policies.current["bincount"] = "deferred"
