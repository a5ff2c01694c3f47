"""bincount: multiclass stat-score updates count without a device read; range errors at compute()."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

import tmpatch
from tests.conftest import assert_bitwise, release_in
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


@settings(max_examples=25, deadline=None)
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


# -- confusion matrices and binned precision-recall curves ---------------------------------------
CONFUSION = {
    "binary": [cls.BinaryConfusionMatrix, cls.BinaryJaccardIndex, cls.BinaryMatthewsCorrCoef, cls.BinaryCohenKappa],
    "multiclass": [cls.MulticlassConfusionMatrix, cls.MulticlassJaccardIndex, cls.MulticlassMatthewsCorrCoef,
                   cls.MulticlassCohenKappa],
    "multilabel": [cls.MultilabelConfusionMatrix, cls.MultilabelJaccardIndex, cls.MultilabelMatthewsCorrCoef],
}
CURVES = {
    "binary": [cls.BinaryPrecisionRecallCurve, cls.BinaryROC, cls.BinaryAUROC, cls.BinaryAveragePrecision],
    "multiclass": [cls.MulticlassPrecisionRecallCurve, cls.MulticlassROC, cls.MulticlassAUROC,
                   cls.MulticlassAveragePrecision],
    "multilabel": [cls.MultilabelPrecisionRecallCurve, cls.MultilabelROC, cls.MultilabelAUROC,
                   cls.MultilabelAveragePrecision],
}
MULTICLASS_CURVE_AVERAGE = release_in(">=1.3.0")  # ``average`` ("micro": one-hot, flattened) from 1.3.0


def _build(kind, metric_cls, size, **kwargs):
    return metric_cls(**kwargs) if kind == "binary" else metric_cls(size, **kwargs)


def _tensors(value):
    """Every tensor of a metric result (a tensor, or nested tuples / lists of them)."""
    if isinstance(value, torch.Tensor):
        return [value]
    return [t for item in value for t in _tensors(item)]


def _outcome(metric):
    """``compute()``'s tensors, or the error it raised (class and message)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with torch.no_grad():
                return _tensors(metric.compute())
        except Exception as exc:  # noqa: BLE001 - the release's own errors are compared
            return f"{type(exc).__name__}: {exc}"


def _updates(metric, batches):
    """Run the updates; the error the release raised, if any (class and message)."""
    try:
        for p, t in batches:
            metric.update(p, t)
    except Exception as exc:  # noqa: BLE001 - the release's own errors are compared
        return f"{type(exc).__name__}: {exc}"
    return None


def _assert_same(patched, expected):
    """Same states (bitwise) and the same ``compute()`` outcome; nothing recorded."""
    assert int(patched._tmpatch_bincount) == 0
    for state in expected._defaults:
        assert_bitwise(getattr(patched, state), getattr(expected, state))
    got, want = _outcome(patched), _outcome(expected)
    assert type(got) is type(want), (got, want)
    if isinstance(want, str):
        assert got == want
    else:
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert_bitwise(g, w)


@st.composite
def _classification_batches(draw, kind, labels_allowed):
    """Valid batches for ``kind``: (size, ignore_index, [(preds, target)])."""
    size = draw(st.integers(2, 5))
    ignore = draw(st.sampled_from([None, -1, 0, 1, 255]))
    classes = 2 if kind != "multiclass" else size
    extra = draw(st.sampled_from([(), (2,)]))  # a trailing dimension (``multidim``)
    batches = []
    for _ in range(draw(st.integers(1, 3))):
        n = draw(st.integers(1, 9))
        shape = (n, size) + extra if kind == "multilabel" else (n,) + extra
        count = int(torch.Size(shape).numel())
        values = st.integers(0, classes - 1) if ignore is None else st.one_of(
            st.integers(0, classes - 1), st.just(ignore))
        target = torch.tensor(draw(st.lists(values, min_size=count, max_size=count)), dtype=torch.int64)
        target = target.reshape(shape)
        preds_shape = (n, size) + extra if kind == "multiclass" else shape
        numel = int(torch.Size(preds_shape).numel())
        form = draw(st.sampled_from(["probs", "logits", "labels"] if labels_allowed else ["probs", "logits"]))
        if form == "labels":
            preds = torch.tensor(draw(st.lists(st.integers(0, classes - 1), min_size=count, max_size=count)))
            preds = preds.reshape(shape)
        else:
            low, high = (0.0, 1.0) if form == "probs" else (-4.0, 4.0)
            floats = st.floats(low, high, width=32)
            preds = torch.tensor(draw(st.lists(floats, min_size=numel, max_size=numel))).reshape(preds_shape)
            if ignore is not None and draw(st.booleans()):  # logits at ignored positions only
                ignored = (target == ignore).unsqueeze(1) if kind == "multiclass" else target == ignore
                preds = torch.where(ignored.expand_as(preds), preds * 3 - 5, preds)
        batches.append((preds, target))
    return size, ignore, batches


def _thresholds(draw):
    form = draw(st.sampled_from(["int", "list", "tensor"]))
    if form == "int":
        return draw(st.integers(2, 7))
    values = draw(st.lists(st.floats(0, 1, width=32), min_size=1, max_size=6))
    return values if form == "list" else torch.tensor(values)


@settings(max_examples=25, deadline=None)
@given(st.data(), st.sampled_from(sorted(CONFUSION)), st.booleans())
def test_confusion_matrix_states_and_compute_equal_the_releases(data, kind, validate):
    metric_cls = data.draw(st.sampled_from(CONFUSION[kind]))
    size, ignore, batches = data.draw(_classification_batches(kind, labels_allowed=True))
    kwargs = dict(ignore_index=ignore, validate_args=validate)
    _unpatched()
    expected = _build(kind, metric_cls, size, **kwargs)
    failed = _updates(expected, batches)
    _apply()
    metric = _build(kind, metric_cls, size, **kwargs)
    assert _updates(metric, batches) == failed
    if failed is None:
        _assert_same(metric, expected)


@settings(max_examples=25, deadline=None)
@given(st.data(), st.sampled_from(sorted(CURVES)), st.booleans())
def test_binned_curve_states_and_compute_equal_the_releases(data, kind, validate):
    metric_cls = data.draw(st.sampled_from(CURVES[kind]))
    size, ignore, batches = data.draw(_classification_batches(kind, labels_allowed=False))
    thresholds = _thresholds(data.draw)
    kwargs = dict(thresholds=thresholds, ignore_index=ignore, validate_args=validate)
    if kind == "multiclass" and metric_cls is cls.MulticlassPrecisionRecallCurve and MULTICLASS_CURVE_AVERAGE:
        kwargs["average"] = data.draw(st.sampled_from([None, "micro", "macro"]))
    if isinstance(thresholds, list) and validate:
        kwargs["thresholds"] = sorted(thresholds)  # the release's validation wants them sorted
    _unpatched()
    expected = _build(kind, metric_cls, size, **kwargs)
    failed = _updates(expected, batches)
    _apply()
    metric = _build(kind, metric_cls, size, **kwargs)
    assert _updates(metric, batches) == failed
    if failed is None:
        _assert_same(metric, expected)


def _pair(build, batches, forward=False):
    """A reference built unpatched and the same metric patched, both fed ``batches``;
    with ``forward`` the patched one also returns its per-batch values (compared)."""
    _unpatched()
    expected = build()
    want = [expected(p, t) if forward else expected.update(p, t) for p, t in batches]
    _apply()
    metric = build()
    got = [metric(p, t) if forward else metric.update(p, t) for p, t in batches]
    if forward:
        for g, w in zip(got, want):
            for a, b in zip(_tensors(g), _tensors(w)):
                assert_bitwise(a, b)
    return metric, expected


@pytest.mark.skipif(not MULTICLASS_CURVE_AVERAGE, reason="no ``average`` before 1.3.0")
@pytest.mark.parametrize("classes, thresholds", [(3, [0.4]), (2, 2)])
def test_binned_micro_curve_with_ignore_index_equals_the_release(classes, thresholds):
    """Binned ``average="micro"`` only runs upstream where its (T, 2, 2) counts broadcast
    onto the (T, C, 2, 2) state (see the next test): one threshold, or T == C == 2."""
    torch.manual_seed(1)
    target = torch.randint(0, classes, (40,))
    target[::3] = -1
    batches = [(torch.rand(40, classes), target), (torch.randn(7, classes), torch.tensor([0, 1, -1, -1, 1, 0, 0]))]

    def build():
        return cls.MulticlassPrecisionRecallCurve(classes, thresholds=thresholds, average="micro", ignore_index=-1)

    metric, expected = _pair(build, batches)
    assert_bitwise(metric.confmat, expected.confmat)
    assert int(metric._tmpatch_bincount) == 0


@pytest.mark.skipif(not MULTICLASS_CURVE_AVERAGE, reason="no ``average`` before 1.3.0")
def test_binned_micro_curve_fails_as_the_release_does():
    """Upstream: the micro update returns (T, 2, 2) counts for a (T, C, 2, 2) state, so
    ``update()`` fails unless they broadcast (and ``compute()`` then fails). Kept as it is."""
    preds, target = torch.rand(4, 3), torch.tensor([0, 1, 2, -1])
    with pytest.raises(RuntimeError) as upstream:
        cls.MulticlassPrecisionRecallCurve(3, thresholds=4, average="micro", ignore_index=-1).update(preds, target)
    _apply()
    metric = cls.MulticlassPrecisionRecallCurve(3, thresholds=4, average="micro", ignore_index=-1)
    with pytest.raises(RuntimeError) as patched:
        metric.update(preds, target)
    assert str(patched.value) == str(upstream.value)


@pytest.mark.parametrize("n, ignored", [(52_000, 8), (120_000, 3)])
def test_large_binary_curves_use_the_loop_and_equal_the_release(n, ignored):
    """Over 50,000 values upstream counts per threshold. It decides on the size left after
    removing the ignored values (52,000 -> 45,500: its vectorised path); the patch, which
    removes nothing, on the full size (its loop): the counts are the same integers."""
    torch.manual_seed(2)
    target = torch.randint(0, 2, (n,))
    target[::ignored] = -1
    preds = torch.rand(n)

    def build():
        return cls.BinaryPrecisionRecallCurve(thresholds=torch.tensor([0.0, 0.3, 0.5, 0.9, 1.0]), ignore_index=-1,
                                              validate_args=False)

    metric, expected = _pair(build, [(preds, target)])
    assert_bitwise(metric.confmat, expected.confmat)


def test_large_multiclass_curves_use_the_loop_and_equal_the_release():
    torch.manual_seed(3)
    target = torch.randint(0, 5, (50_000,))
    target[::4] = 255
    preds = torch.randn(50_000, 5)  # logits: softmax, as upstream

    def build():
        return cls.MulticlassPrecisionRecallCurve(5, thresholds=7, ignore_index=255, validate_args=False)

    metric, expected = _pair(build, [(preds, target)])
    assert_bitwise(metric.confmat, expected.confmat)


@pytest.mark.parametrize("kind", sorted(CONFUSION))
def test_confusion_forward_and_keyword_updates_equal_the_release(kind):
    torch.manual_seed(4)
    if kind == "binary":
        batches = [(torch.randn(9), torch.tensor([0, 1, -1, 1, 0, -1, 1, 1, 0])),
                   (torch.rand(3), torch.tensor([0, 1, 1]))]
    elif kind == "multiclass":
        batches = [(torch.randn(6, 3), torch.tensor([0, 2, -1, 1, -1, 2])),
                   (torch.tensor([2, 0]), torch.tensor([2, -1]))]
    else:
        batches = [(torch.randn(4, 3), torch.tensor([[0, 1, -1], [1, 1, 0], [-1, -1, 0], [0, 0, 1]]))]

    def build():
        return _build(kind, CONFUSION[kind][0], 3, ignore_index=-1)

    metric, expected = _pair(build, batches, forward=True)
    _assert_same(metric, expected)
    metric.reset()
    for p, t in batches:
        metric.update(preds=p, target=t)
    _assert_same(metric, expected)


# -- sync ------------------------------------------------------------------------------------------
def _sync_inputs(kind, ignore):
    torch.manual_seed(5)
    if kind == "binary":
        preds, target = torch.rand(16), torch.randint(0, 2, (16,))
    elif kind == "multiclass":
        preds, target = torch.randn(16, 4), torch.randint(0, 4, (16,))
    else:
        preds, target = torch.rand(16, 3), torch.randint(0, 2, (16, 3))
    if ignore is not None:
        target[::3] = ignore
    return preds, target


SYNC_CASES = {
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


def _logits_check(point) -> bool:
    """The formatters' ``torch.all(0 <= preds <= 1)`` read before 1.6.1 (patch logits_check)."""
    return point.function.endswith("_format") and point.op == "aten._local_scalar_dense"


@pytest.mark.parametrize("ignore", [None, -1])
@pytest.mark.parametrize("name", sorted(SYNC_CASES))
def test_confusion_and_binned_curve_updates_are_sync_free_on_simulated_cuda(name, ignore):
    from tmpatch.audit import audit

    kind, build = SYNC_CASES[name]
    preds, target = _sync_inputs(kind, ignore)
    unpatched = audit(build(ignore).update, preds, target, real=False)
    ops = {(p.function, p.op) for p in unpatched.sync_points}
    assert ("_bincount", "aten.bincount") in ops, str(unpatched)
    removals = {p.function for p in unpatched.sync_points if p.op == "aten.index"}
    if kind == "multilabel":  # ``codes[codes >= 0]`` in the update, with or without ignore_index
        assert any(f.startswith("_multilabel_") and f.endswith("_update") for f in removals), str(unpatched)
    elif ignore is not None:  # ``preds[target != ignore_index]`` in the formatter
        assert any(f.endswith("_format") for f in removals), str(unpatched)
    _apply()
    patched = audit(build(ignore).update, preds, target, real=False)
    assert [p for p in patched.sync_points if not _logits_check(p)] == [], str(patched)
    if release_in(">=1.6.1"):
        assert patched.count == 0, str(patched)


@pytest.mark.parametrize("name", sorted(SYNC_CASES))
def test_with_logits_check_the_updates_are_sync_free_on_every_release(name):
    """The masked ignore_index path calls the formatter through its module binding, so
    ``logits_check``'s layer on it (before 1.6.1) runs too: no sync left, same counts,
    with logits at the ignored positions only (the decision stays with the kept ones)."""
    from tmpatch.audit import audit

    kind, build = SYNC_CASES[name]
    preds, target = _sync_inputs(kind, -1)
    ignored = (target == -1).unsqueeze(1) if kind == "multiclass" else target == -1
    preds = torch.where(ignored.expand_as(preds), torch.full_like(preds, -7.0), preds)
    _unpatched()
    expected = build(-1)
    expected.update(preds, target)
    rows = {r.name: r.state for r in tmpatch.apply(["bincount", "logits_check"])}
    assert rows["bincount"] == "applied" and rows["logits_check"] in ("applied", "not-needed"), rows
    metric = build(-1)
    metric.update(preds, target)
    assert_bitwise(metric.confmat, expected.confmat)
    patched = audit(build(-1).update, preds, target, real=False)
    assert patched.count == 0, str(patched)


# -- range errors, records, fall-backs ---------------------------------------------------------------
@pytest.mark.parametrize("ignore", [None, -1])
@pytest.mark.parametrize("kind", sorted(CONFUSION))
def test_confusion_matrix_out_of_range_is_reported_at_the_next_compute(kind, ignore):
    _apply()
    metric = _build(kind, CONFUSION[kind][0], 3, ignore_index=ignore, validate_args=False)
    if kind == "binary":  # upstream: bincount gives 6 bins, the reshape to (2, 2) fails
        preds, bad, good = torch.tensor([0, 1, 1, 0]), torch.tensor([0, 2, 1, 0]), torch.tensor([0, 1, 1, 0])
    elif kind == "multiclass":  # target 3 with 3 classes: code 9 + pred >= 9 bins
        preds, bad, good = torch.tensor([0, 1, 2, 0]), torch.tensor([0, 1, 3, 0]), torch.tensor([0, 1, 2, 0])
    else:  # a 2 in the last label: code >= 4 * num_labels
        preds = good = torch.ones(2, 3, dtype=torch.int64)
        bad = torch.tensor([[1, 1, 2], [1, 1, 1]])
    if ignore is not None:
        bad, good = torch.cat([bad, bad[:1] * 0 - 1]), torch.cat([good, good[:1] * 0 - 1])
        preds = torch.cat([preds, preds[:1]])
    with pytest.raises(RuntimeError, match="invalid for input of size"):  # upstream: in update()
        _upstream_update(kind, preds, bad, ignore)
    metric.update(preds, bad)
    metric.update(preds, good)
    with pytest.raises(RuntimeError, match=r"1 value\(s\) .* outside \[0, minlength\)"):
        metric.compute()
    assert not metric._is_synced
    reference = _build(kind, CONFUSION[kind][0], 3, ignore_index=ignore, validate_args=False)
    reference.update(preds, good)
    counted = metric.compute()  # reported once; the in-range values were counted
    assert int(counted.sum()) == int(reference.compute().sum()) * 2 - 1


def _upstream_update(kind, preds, target, ignore):
    """The release's own update (the class's ``update`` under tmpatch's layer)."""
    metric_cls = CONFUSION[kind][0]
    metric = _build(kind, metric_cls, 3, ignore_index=ignore, validate_args=False)
    tmpatch.get_original(vars(metric_cls)["update"])(metric, preds, target)


@pytest.mark.parametrize("kind", sorted(CURVES))
def test_only_binned_curves_carry_the_record(kind):
    _apply()
    for metric_cls in CURVES[kind]:
        unbinned = _build(kind, metric_cls, 3, ignore_index=-1)
        assert "_tmpatch_bincount" not in unbinned._defaults and not hasattr(unbinned, "_tmpatch_bincount")
        binned = _build(kind, metric_cls, 3, thresholds=4, ignore_index=-1)
        assert "_tmpatch_bincount" in binned._defaults, metric_cls
    for metric_cls in CONFUSION[kind] if kind in CONFUSION else ():
        assert "_tmpatch_bincount" in _build(kind, metric_cls, 3)._defaults, metric_cls


@pytest.mark.parametrize("kind", sorted(CURVES))
def test_unbinned_curves_keep_the_releases_update(kind):
    preds, target = _sync_inputs(kind, -1)
    _unpatched()
    expected = _build(kind, CURVES[kind][0], 4 if kind == "multiclass" else 3, ignore_index=-1)
    expected.update(preds, target)
    _apply()
    metric = _build(kind, CURVES[kind][0], 4 if kind == "multiclass" else 3, ignore_index=-1)
    metric.update(preds, target)
    for state in ("preds", "target"):
        for g, w in zip(getattr(metric, state), getattr(expected, state)):
            assert_bitwise(g, w)


def test_multilabel_functional_updates_outside_an_update_run_the_release():
    import importlib

    cm = importlib.import_module("torchmetrics.functional.classification.confusion_matrix")
    pr = importlib.import_module("torchmetrics.functional.classification.precision_recall_curve")
    _apply()
    preds, target = torch.tensor([[1, 0], [0, 1]]), torch.tensor([[1, -8], [0, 1]])
    assert_bitwise(cm._multilabel_confusion_matrix_update(preds, target, 2),
                   tmpatch.get_original(cm._multilabel_confusion_matrix_update)(preds, target, 2))
    thresholds = torch.linspace(0, 1, 3)
    probs = torch.tensor([[0.2, -24.0], [0.9, 0.4]])
    target = torch.tensor([[1, -24], [0, 1]])
    assert_bitwise(pr._multilabel_precision_recall_curve_update(probs, target, 2, thresholds),
                   tmpatch.get_original(pr._multilabel_precision_recall_curve_update)(probs, target, 2, thresholds))
    with pytest.raises(RuntimeError, match="invalid for input of size"):  # the release's error, at once
        cm._multilabel_confusion_matrix_update(preds, torch.tensor([[1, 0], [0, 2]]), 2)


def test_eager_policy_keeps_the_releases_errors_for_confusion_matrices():
    _apply()
    tm_settings.policy["bincount"] = "eager"
    metric = cls.MulticlassConfusionMatrix(3, ignore_index=-1, validate_args=False)
    with pytest.raises(RuntimeError, match="invalid for input of size"):
        metric.update(torch.tensor([0, 1, 2]), torch.tensor([0, 3, -1]))
    with pytest.raises(RuntimeError, match="non-negative"):
        cls.BinaryConfusionMatrix(validate_args=False).update(torch.tensor([0, 1]), torch.tensor([0, -1]))


@pytest.mark.parametrize("kwargs, carries", [
    ({}, True),
    ({"average": "micro"}, False),
    ({"average": "micro", "ignore_index": 0}, True),
    ({"top_k": 2}, False),
    ({"multidim_average": "samplewise"}, False),
])
def test_stat_scores_carry_the_record_only_where_an_update_counts(kwargs, carries):
    _apply()
    metric = cls.MulticlassStatScores(num_classes=5, validate_args=False, **kwargs)
    assert (patch.RECORD.name in metric._defaults) is carries
    preds = torch.randn(4, 5, 3) if kwargs.get("multidim_average") else torch.randn(4, 5)
    target = torch.randint(0, 5, preds.shape[:1] + preds.shape[2:])
    metric.update(preds, target)
    metric.compute()
