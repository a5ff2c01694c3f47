"""bincount: multiclass stat-score updates count without a device read; range errors at compute()."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

import tmpatch
from tests.conftest import assert_bitwise
from tmpatch import settings as tm_settings
from tmpatch.patches import bincount as patch
from torchmetrics import classification as cls
from torchmetrics.utilities import data

DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]
STAT_SCORES = {
    "accuracy": cls.MulticlassAccuracy,
    "precision": cls.MulticlassPrecision,
    "recall": cls.MulticlassRecall,
    "f1": cls.MulticlassF1Score,
    "stat_scores": cls.MulticlassStatScores,
}


@pytest.fixture(autouse=True)
def _policy():
    tm_settings.policy["bincount"] = "deferred"
    yield
    tm_settings.policy["bincount"] = "deferred"
    torch.use_deterministic_algorithms(False)


def _apply() -> None:
    """Apply the patch (after building the unpatched reference with :func:`_unpatched`)."""
    row = next(r for r in tmpatch.apply(["bincount"]) if r.name == "bincount")
    assert row.state == "applied", row


def _unpatched() -> None:
    """Revert before building a reference metric: the conftest fixture reverts once per
    test, and a hypothesis test runs many examples in it."""
    tmpatch.revert()


def _original():
    return tmpatch.get_original(data._bincount)


def _in_update(metric, x, minlength):
    """Call ``_bincount`` as the update of ``metric`` does."""
    token = patch._current.set(metric)
    try:
        return data._bincount(x, minlength=minlength)
    finally:
        patch._current.reset(token)


@st.composite
def _inputs(draw):
    minlength = draw(st.integers(0, 40))
    dtype = draw(st.sampled_from(DTYPES))
    top = min(minlength, 128 if dtype == torch.int8 else minlength)
    size = draw(st.integers(0, 60))
    values = draw(st.lists(st.integers(0, max(top - 1, 0)), min_size=size, max_size=size)) if top else []
    return torch.tensor(values, dtype=torch.int64).to(dtype), minlength


@settings(max_examples=80, deadline=None)
@given(_inputs(), st.booleans(), st.booleans())
def test_in_range_counts_are_bitwise_torch_bincount_and_the_releases(case, deterministic, shortcut):
    x, minlength = case
    expected = torch.bincount(x, minlength=minlength)
    torch.use_deterministic_algorithms(deterministic)  # upstream: loop (1.0-1.2.0) or mesh (1.2.1+)
    upstream = _original()(x, minlength=minlength)
    _apply()
    metric = cls.MulticlassStatScores(num_classes=3, validate_args=False)
    patch.CPU_SHORTCUT = shortcut  # False: the scatter used on CUDA
    try:
        got = _in_update(metric, x, minlength)  # no error in deterministic mode either
    finally:
        patch.CPU_SHORTCUT = True
    assert_bitwise(got, expected)
    assert_bitwise(got, upstream)
    assert int(metric._tmpatch_bincount) == 0


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(-30, 60), max_size=40), st.integers(0, 30))
def test_out_of_range_values_are_recorded_not_counted(values, minlength):
    x = torch.tensor(values, dtype=torch.int64)
    _apply()
    metric = cls.MulticlassStatScores(num_classes=3, validate_args=False)
    got = _in_update(metric, x, minlength)
    inside = [v for v in values if 0 <= v < minlength]
    assert_bitwise(got, torch.bincount(torch.tensor(inside, dtype=torch.int64), minlength=minlength))
    assert int(metric._tmpatch_bincount) == len(values) - len(inside)


def test_outside_an_update_and_without_minlength_the_release_runs():
    _apply()
    with pytest.raises(RuntimeError, match="non-negative"):
        data._bincount(torch.tensor([0, -1]), minlength=3)  # functional path: upstream behaviour
    metric = cls.MulticlassStatScores(num_classes=3, validate_args=False)
    x = torch.tensor([0, 2, 2])  # minlength=None: the release's own (unique-based) path
    assert_bitwise(_in_update(metric, x, None), _original()(x))


@pytest.mark.parametrize("name", sorted(STAT_SCORES))
@pytest.mark.parametrize("average", ["macro", "none", "micro"])
def test_metric_results_equal_the_releases(name, average):
    torch.manual_seed(0)
    batches = [(torch.randn(n, 5), torch.randint(0, 5, (n,))) for n in (1, 17, 64)]
    batches.append((torch.randint(0, 5, (33,)), torch.randint(0, 5, (33,))))
    expected_metric = STAT_SCORES[name](num_classes=5, average=average, validate_args=False)
    for p, t in batches:
        expected_metric.update(p, t)
    expected = expected_metric.compute()
    _apply()
    metric = STAT_SCORES[name](num_classes=5, average=average, validate_args=False)
    values = [metric(p, t) for p, t in batches]  # forward too
    metric.reset()
    for p, t in batches:
        metric.update(p, t)
    assert_bitwise(metric.compute(), expected)
    assert all(v.dtype == expected.dtype for v in values)


def test_out_of_range_is_reported_at_the_next_compute_once():
    _apply()
    metric = cls.MulticlassAccuracy(num_classes=5, validate_args=False)
    preds = torch.tensor([0, 1, 2, 3, 4, 0])
    metric.update(preds, torch.tensor([0, 1, 2, 3, 5, -1]))  # upstream raises here
    metric.update(preds, torch.tensor([0, 1, 2, 3, 4, 0]))
    with pytest.raises(RuntimeError, match=r"2 value\(s\) .* outside \[0, minlength\)"):
        metric.compute()
    assert not metric._is_synced
    value = metric.compute()  # reported once; the in-range values were counted
    assert value.item() == pytest.approx(10 / 10)
    metric.update(preds, torch.tensor([9, 1, 2, 3, 4, 0]))
    metric.reset()  # the record is a state: reset clears it
    metric.update(preds, torch.tensor([0, 1, 2, 3, 4, 0]))
    assert metric.compute().item() == 1.0


def test_forward_keeps_the_record_until_the_users_compute():
    _apply()
    metric = cls.MulticlassRecall(num_classes=4, validate_args=False)
    metric(torch.tensor([0, 1]), torch.tensor([7, 1]))  # forward: its internal compute does not report
    metric(torch.tensor([0, 1]), torch.tensor([0, 1]))
    with pytest.raises(RuntimeError, match="tmpatch \\(bincount\\)"):
        metric.compute()


def test_eager_policy_and_metrics_built_before_apply_keep_upstream_errors():
    early = cls.MulticlassAccuracy(num_classes=5, validate_args=False)
    _apply()
    tm_settings.policy["bincount"] = "eager"
    late = cls.MulticlassAccuracy(num_classes=5, validate_args=False)
    for metric in (early, late):
        with pytest.raises(RuntimeError, match="non-negative"):
            metric.update(torch.tensor([0, 1]), torch.tensor([0, -1]))
        with pytest.raises(RuntimeError, match="invalid for input of size"):
            metric.update(torch.tensor([0, 1]), torch.tensor([0, 5]))
    tm_settings.policy["bincount"] = "deferred"
    early.reset()
    early.update(torch.tensor([0, 1]), torch.tensor([0, 1]))
    assert early.compute().item() == 1.0


def test_validate_args_does_not_check_the_range_so_the_record_also_serves_it():
    """Upstream's validation counts unique values only: [0, 7] with 5 classes passes it,
    and upstream then fails in the reshape after ``torch.bincount``."""
    with pytest.raises(RuntimeError, match="invalid for input of size"):
        cls.MulticlassAccuracy(num_classes=5).update(torch.tensor([0, 1]), torch.tensor([0, 7]))
    _apply()
    metric = cls.MulticlassAccuracy(num_classes=5)
    metric.update(torch.tensor([0, 1]), torch.tensor([0, 7]))
    with pytest.raises(RuntimeError, match=r"1 value\(s\)"):
        metric.compute()


def test_deterministic_mode_raises_nothing_and_makes_no_mesh():
    _apply()
    torch.use_deterministic_algorithms(True)
    metric = cls.MulticlassF1Score(num_classes=1000, average=None, validate_args=False)
    preds, target = torch.randint(0, 1000, (4096,)), torch.randint(0, 1000, (4096,))
    metric.update(preds, target)  # upstream: a 4096 x 10^6 mesh (32 GB); patched: 8 MB
    torch.use_deterministic_algorithms(False)
    reference = cls.MulticlassF1Score(num_classes=1000, average=None, validate_args=False)
    reference.update(preds, target)
    assert_bitwise(metric.compute(), reference.compute())


@pytest.mark.parametrize("name", sorted(STAT_SCORES))
def test_update_is_sync_free_on_simulated_cuda(name):
    from tmpatch.audit import audit

    preds, target = torch.randn(16, 5), torch.randint(0, 5, (16,))
    unpatched = audit(STAT_SCORES[name](num_classes=5, validate_args=False).update, preds, target)
    assert any("bincount" in p.op for p in unpatched.sync_points), str(unpatched)
    _apply()
    for average in ("macro", "none"):
        metric = STAT_SCORES[name](num_classes=5, average=average, validate_args=False)
        patched = audit(metric.update, preds, target)
        assert patched.count == 0, str(patched)


# -- ignore_index ------------------------------------------------------------------------------
AVERAGES = ["micro", "macro", "weighted", "none"]


@st.composite
def _ignore_batches(draw):
    classes = draw(st.integers(2, 6))
    ignore = draw(st.sampled_from([0, classes - 1, -1, 255, -100]))
    batches = []
    for _ in range(draw(st.integers(1, 3))):
        n = draw(st.integers(1, 12))  # an empty batch fails in the release's formatter
        labels = st.integers(0, classes - 1)
        target = draw(st.lists(st.one_of(labels, st.just(ignore)), min_size=n, max_size=n))
        if draw(st.booleans()):
            preds = torch.tensor(draw(st.lists(st.floats(-5, 5, width=32), min_size=n * classes,
                                               max_size=n * classes))).reshape(n, classes)
        else:
            preds = torch.tensor(draw(st.lists(labels, min_size=n, max_size=n)), dtype=torch.int64)
        batches.append((preds, torch.tensor(target, dtype=torch.int64)))
    return classes, ignore, batches


@settings(max_examples=60, deadline=None)
@given(_ignore_batches(), st.sampled_from(AVERAGES), st.sampled_from(sorted(STAT_SCORES)))
def test_ignore_index_counts_and_results_equal_the_releases(case, average, name):
    classes, ignore, batches = case
    _unpatched()
    expected_metric = STAT_SCORES[name](num_classes=classes, average=average, ignore_index=ignore,
                                        validate_args=False)
    for p, t in batches:
        expected_metric.update(p, t)
    _apply()
    metric = STAT_SCORES[name](num_classes=classes, average=average, ignore_index=ignore, validate_args=False)
    for p, t in batches:
        metric.update(p, t)
    for state in ("tp", "fp", "tn", "fn"):
        assert_bitwise(getattr(metric, state), getattr(expected_metric, state))
    assert int(metric._tmpatch_bincount) == 0
    with torch.no_grad():
        assert_bitwise(metric.compute(), expected_metric.compute())


def test_ignore_index_keeps_reporting_out_of_range_values_and_skips_ignored_ones():
    _apply()
    metric = cls.MulticlassAccuracy(num_classes=3, ignore_index=-1, validate_args=False)
    metric.update(torch.tensor([0, 1, 2, 1]), torch.tensor([0, -1, 7, 1]))  # -1 ignored, 7 out of range
    assert int(metric._tmpatch_bincount) == 1
    with pytest.raises(RuntimeError, match=r"1 value\(s\)"):
        metric.compute()
    assert metric.compute().item() == 1.0  # the two valid positions, both right


def test_ignore_index_functional_calls_run_the_release():
    import importlib

    fn = importlib.import_module("torchmetrics.functional.classification.stat_scores")

    _apply()
    preds, target = torch.tensor([0, 1, 2]), torch.tensor([0, -1, 2])
    got = fn._multiclass_stat_scores_update(preds, target, 3, 1, "macro", "global", -1)
    want = tmpatch.get_original(fn._multiclass_stat_scores_update)(preds, target, 3, 1, "macro", "global", -1)
    for g, w in zip(got, want):
        assert_bitwise(g, w)


@pytest.mark.parametrize("average", ["micro", "macro"])
@pytest.mark.parametrize("ignore", [0, -1])
def test_ignore_index_update_is_sync_free_on_simulated_cuda(average, ignore):
    from tmpatch.audit import audit

    preds, target = torch.randn(16, 5), torch.randint(0, 5, (16,))
    target[::3] = ignore

    def build():
        return cls.MulticlassStatScores(num_classes=5, average=average, ignore_index=ignore, validate_args=False)

    unpatched = audit(build().update, preds, target)
    removal = [p for p in unpatched.sync_points if p.function == "_multiclass_stat_scores_update"]
    assert len(removal) == 2 and {p.op for p in removal} == {"aten.index"}, str(unpatched)
    _apply()
    patched = audit(build().update, preds, target)
    assert patched.count == 0, str(patched)
