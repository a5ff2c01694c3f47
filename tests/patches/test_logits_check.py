"""logits_check: the formatters that test for logits choose sigmoid/softmax on the device (before 1.6.1)."""
from __future__ import annotations

import sys
from typing import Any, Callable, List

import pytest
import torch
import torchmetrics.functional.classification.calibration_error  # noqa: F401

# the modules, not the functions of the same name that the package exports
import torchmetrics.functional.classification.confusion_matrix  # noqa: F401
import torchmetrics.functional.classification.precision_recall_curve  # noqa: F401
import torchmetrics.functional.classification.stat_scores  # noqa: F401
from hypothesis import given, settings, strategies as st
from torchmetrics import classification as cls

import tmpatch
from tests.conftest import assert_bitwise, examples, release_in

NEEDED = release_in("<1.6.1")
needed = pytest.mark.skipif(not NEEDED, reason="fixed upstream in 1.6.1 (the patch reports not-needed)")
HAS_AVERAGE = release_in(">=1.3.0")  # the multiclass curve's ``average`` argument
fmt = sys.modules["torchmetrics.functional.classification.stat_scores"]
cmf = sys.modules["torchmetrics.functional.classification.confusion_matrix"]
prf = sys.modules["torchmetrics.functional.classification.precision_recall_curve"]
cef = sys.modules["torchmetrics.functional.classification.calibration_error"]
NAN, INF = float("nan"), float("inf")
VALUES = [0.0, 1.0, 0.5, 0.25, 0.75, -0.0, -0.5, 1.5, 3.0, -2.0, NAN, INF, -INF, 1e-8]
DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
# probabilities only; probabilities and a NaN (upstream normalises them); anything
POOLS = [VALUES[:6], VALUES[:6] + [NAN], VALUES]


def _apply(expected: str = "applied") -> None:
    row = next(r for r in tmpatch.apply(["logits_check"]) if r.name == "logits_check")
    assert row.state == expected, row


def test_state_on_this_release():
    _apply("applied" if NEEDED else "not-needed")


@st.composite
def _case(draw, multilabel: bool):
    dtype = draw(st.sampled_from(DTYPES))
    rows = draw(st.integers(0, 4))
    cols = draw(st.integers(0, 3))
    pool = draw(st.sampled_from(POOLS))
    values = draw(st.lists(st.sampled_from(pool), min_size=rows * cols, max_size=rows * cols))
    preds = torch.tensor(values, dtype=torch.float64).reshape(rows, cols).to(dtype)
    target = torch.tensor(draw(st.lists(st.sampled_from([0, 1, -1, 2]), min_size=rows * cols, max_size=rows * cols)))
    return preds, target.reshape(rows, cols)


@needed
@settings(max_examples=examples(60), deadline=None)
@given(st.booleans(), st.data(), st.sampled_from([None, -1, 2]), st.sampled_from([0.5, 0.3]))
def test_stat_score_formatters_are_bitwise_the_releases(multilabel, data, ignore_index, threshold):
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


@needed
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


@needed
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


@needed
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


# --- confusion-matrix and precision-recall-curve formatters -----------------------------------

FORMATTERS = [
    (cmf, "_binary_confusion_matrix_format"),
    (cmf, "_multilabel_confusion_matrix_format"),
    (prf, "_binary_precision_recall_curve_format"),
    (prf, "_multiclass_precision_recall_curve_format"),
    (prf, "_multilabel_precision_recall_curve_format"),
]
FORMATTER_NAMES = {name for _, name in FORMATTERS}
THRESHOLDS = [None, 0, 1, 3, [0.2, 0.7], [], "tensor"]
IGNORE = [None, -1, 2]


@pytest.mark.skipif(NEEDED, reason="applied on this release")
def test_not_needed_leaves_the_formatters_alone():
    _apply("not-needed")
    for module, name in FORMATTERS:
        fn = getattr(module, name)
        assert tmpatch.get_original(fn) is fn, name


def _same(call: Callable[[Callable], Any], module: Any, name: str) -> None:
    """``call(formatter)`` patched returns the release's outputs bit for bit, or raises the same type."""
    original = tmpatch.get_original(getattr(module, name))
    try:
        expected = call(original)
    except Exception as exc:  # e.g. reshape(0, -1) of an empty tensor, one_hot of -1: the same patched
        _apply()
        with pytest.raises(type(exc)):
            call(getattr(module, name))
        return
    _apply()
    patched = getattr(module, name)
    assert patched is not original
    got = call(patched)
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        if b is None:
            assert a is None
        else:
            assert_bitwise(a, b)


@st.composite
def _preds(draw, shape: tuple) -> torch.Tensor:
    """Float ``preds`` (from one of ``POOLS``), sometimes int or bool."""
    n = 1
    for size in shape:
        n *= size
    dtype = draw(st.sampled_from(DTYPES + [torch.int64, torch.bool]))
    if dtype.is_floating_point:
        pool = draw(st.sampled_from(POOLS))
    else:
        pool = [0.0, 1.0] if dtype is torch.bool else [0.0, 1.0, 2.0, -1.0]
    values = draw(st.lists(st.sampled_from(pool), min_size=n, max_size=n))
    return torch.tensor(values, dtype=torch.float64).reshape(shape).to(dtype)


@st.composite
def _labels(draw, shape: tuple, pool: List[int]) -> torch.Tensor:
    n = 1
    for size in shape:
        n *= size
    return torch.tensor(draw(st.lists(st.sampled_from(pool), min_size=n, max_size=n)), dtype=torch.long).reshape(shape)


def _thresholds(draw: Callable) -> Any:
    choice = draw(st.sampled_from(THRESHOLDS))
    return torch.linspace(0, 1, 4, dtype=torch.float64) if choice == "tensor" else choice


def _shape(draw: Callable, classes: int) -> tuple:
    """``(N, classes)`` or ``(N, classes, extra)``."""
    rows = draw(st.integers(0, 4))
    return (rows, classes) + tuple(draw(st.lists(st.integers(0, 2), max_size=1)))


@needed
@settings(max_examples=examples(50), deadline=None)
@given(st.data(), st.sampled_from(IGNORE), st.sampled_from([0.5, 0.3]), st.booleans())
def test_binary_confusion_matrix_format_is_bitwise_the_releases(data, ignore_index, threshold, convert):
    shape = tuple(data.draw(st.lists(st.integers(0, 3), min_size=1, max_size=3)))
    preds, target = data.draw(_preds(shape)), data.draw(_labels(shape, [0, 1, -1, 2]))
    _same(lambda f: f(preds, target, threshold, ignore_index, convert), cmf, "_binary_confusion_matrix_format")


@needed
@settings(max_examples=examples(50), deadline=None)
@given(st.data(), st.sampled_from(IGNORE), st.sampled_from([0.5, 0.3]), st.booleans())
def test_multilabel_confusion_matrix_format_is_bitwise_the_releases(data, ignore_index, threshold, should_threshold):
    labels = data.draw(st.integers(0, 3))
    shape = _shape(data.draw, labels)
    preds, target = data.draw(_preds(shape)), data.draw(_labels(shape, [0, 1, -1, 2]))
    _same(lambda f: f(preds, target, labels, threshold, ignore_index, should_threshold),
          cmf, "_multilabel_confusion_matrix_format")


@needed
@settings(max_examples=examples(50), deadline=None)
@given(st.data(), st.sampled_from(IGNORE))
def test_binary_curve_format_is_bitwise_the_releases(data, ignore_index):
    shape = tuple(data.draw(st.lists(st.integers(0, 3), min_size=1, max_size=3)))
    preds, target = data.draw(_preds(shape)), data.draw(_labels(shape, [0, 1, -1, 2]))
    thresholds = _thresholds(data.draw)
    _same(lambda f: f(preds, target, thresholds, ignore_index), prf, "_binary_precision_recall_curve_format")


@needed
@settings(max_examples=examples(60), deadline=None)
@given(st.data(), st.sampled_from(IGNORE))
def test_multiclass_curve_format_is_bitwise_the_releases(data, ignore_index):
    classes = data.draw(st.integers(0, 3))
    shape = _shape(data.draw, classes)
    preds = data.draw(_preds(shape))
    target = data.draw(_labels(shape[:1] + shape[2:], [-1, 2] + list(range(classes))))
    thresholds = _thresholds(data.draw)
    average = (data.draw(st.sampled_from([None, "macro", "micro"])),) if HAS_AVERAGE else ()
    _same(lambda f: f(preds, target, classes, thresholds, ignore_index, *average),
          prf, "_multiclass_precision_recall_curve_format")


@needed
@settings(max_examples=examples(50), deadline=None)
@given(st.data(), st.sampled_from(IGNORE))
def test_multilabel_curve_format_is_bitwise_the_releases(data, ignore_index):
    labels = data.draw(st.integers(0, 3))
    shape = _shape(data.draw, labels)
    preds, target = data.draw(_preds(shape)), data.draw(_labels(shape, [0, 1, -1, 2]))
    thresholds = _thresholds(data.draw)
    _same(lambda f: f(preds, target, labels, thresholds, ignore_index),
          prf, "_multilabel_precision_recall_curve_format")


@needed
@pytest.mark.parametrize(
    "preds, softmax",
    [([[0.2, 0.9], [0.0, 1.0]], False), ([[0.2, 1.5], [0.1, 0.3]], True), ([[0.2, NAN], [0.5, 0.5]], True),
     ([[-3.0, 0.1], [0.2, 0.3]], True)],
)
def test_multiclass_curve_softmax_is_all_or_nothing_as_the_release(preds, softmax):
    x = torch.tensor(preds)
    _apply()
    got, _, _ = prf._multiclass_precision_recall_curve_format(x, torch.tensor([0, 1]), 2)
    assert_bitwise(got, x.softmax(1) if softmax else x)


@needed
@settings(max_examples=examples(60), deadline=None)
@given(st.data())
def test_multiclass_calibration_update_is_bitwise_the_releases(data):
    classes = data.draw(st.integers(1, 3))
    rows = data.draw(st.integers(0, 4))
    preds = data.draw(_preds((rows, classes)))
    target = data.draw(_labels((rows,), [-1] + list(range(classes))))
    _same(lambda f: f(preds, target), cef, "_multiclass_calibration_error_update")


@needed
def test_multiclass_calibration_error_loses_its_read_and_keeps_its_results():
    from tmpatch.audit import audit

    torch.manual_seed(3)
    batches = [(torch.rand(6, 3), torch.randint(0, 3, (6,))), (torch.randn(5, 3) * 3, torch.randint(0, 3, (5,)))]
    unpatched = audit(cls.MulticlassCalibrationError(num_classes=3, validate_args=False).update, *batches[1],
                      real=False)
    assert [p.function for p in _reads(unpatched)] == ["_multiclass_calibration_error_update"], str(unpatched)
    reference = cls.MulticlassCalibrationError(num_classes=3, validate_args=False)
    for p, t in batches:
        reference.update(p, t)
    _apply()
    patched = audit(cls.MulticlassCalibrationError(num_classes=3, validate_args=False).update, *batches[1],
                    real=False)
    assert patched.count == 0, str(patched)
    metric = cls.MulticlassCalibrationError(num_classes=3, validate_args=False)
    for p, t in batches:
        metric.update(p, t)
    assert_bitwise(metric.compute(), reference.compute())


P, T = torch.randn(8, 3), torch.randint(0, 2, (8, 3))
# (formatter, arguments, sync points left patched: the boolean removal of ignored entries)
FORMATTER_CASES = [
    ("_binary_confusion_matrix_format", (P, T, 0.5, None), 0),
    ("_binary_confusion_matrix_format", (P, T, 0.5, -1), 2),
    ("_multilabel_confusion_matrix_format", (P, T, 3, 0.5, -1), 0),
    ("_binary_precision_recall_curve_format", (P, T, None, None), 0),
    ("_binary_precision_recall_curve_format", (P, T, 5, None), 0),
    ("_multiclass_precision_recall_curve_format", (P, T[:, 0], 3, None, None), 0),
    ("_multiclass_precision_recall_curve_format", (P, T[:, 0], 3, 5, -1), 2),
    ("_multilabel_precision_recall_curve_format", (P, T, 3, 5, -1), 0),
]


def _reads(report: Any) -> List[Any]:
    """The report's device reads (``.item()``, a tensor in an ``if``)."""
    return [p for p in report.sync_points if p.op == "aten._local_scalar_dense"]


@needed
@pytest.mark.parametrize("name, args, left", FORMATTER_CASES,
                         ids=[f"{c[0][1:-7]}-{i}" for i, c in enumerate(FORMATTER_CASES)])
def test_formatter_reads_the_device_unpatched_and_not_patched(name, args, left):
    from tmpatch.audit import audit

    module = cmf if "confusion" in name else prf
    unpatched = audit(getattr(module, name), *args, real=False)
    assert [p.function for p in _reads(unpatched)] == [name], str(unpatched)
    _apply()
    patched = audit(getattr(module, name), *args, real=False)
    assert patched.count == left, str(patched)
    assert all(p.op == "aten.index" for p in patched.sync_points), str(patched)  # boolean-mask removal


PM, TM = torch.randn(8, 3), torch.randint(0, 3, (8,))
CURVE_METRICS = [
    (cls.BinaryConfusionMatrix, {}, "binary"),
    (cls.MultilabelConfusionMatrix, {"num_labels": 3}, "multilabel"),
    (cls.BinaryPrecisionRecallCurve, {"thresholds": None}, "binary"),
    (cls.BinaryPrecisionRecallCurve, {"thresholds": 5}, "binary"),
    (cls.MulticlassPrecisionRecallCurve, {"num_classes": 3, "thresholds": None}, "multiclass"),
    (cls.MulticlassPrecisionRecallCurve, {"num_classes": 3, "thresholds": 5}, "multiclass"),
    (cls.MultilabelPrecisionRecallCurve, {"num_labels": 3, "thresholds": 5, "ignore_index": -1}, "multilabel"),
    (cls.BinaryAUROC, {"thresholds": None}, "binary"),
    (cls.MulticlassAveragePrecision, {"num_classes": 3, "thresholds": 4}, "multiclass"),
    (cls.BinaryCalibrationError, {}, "binary"),
    (cls.BinaryMatthewsCorrCoef, {}, "binary"),
]
CURVE_IDS = [f"{m.__name__}-{i}" for i, (m, _, _) in enumerate(CURVE_METRICS)]


def _inputs(kind: str, logits: bool = True, rows: int = 8) -> tuple:
    scale = 3.0 if logits else 1.0
    make = torch.randn if logits else torch.rand
    if kind == "multiclass":
        return make(rows, 3) * scale, torch.randint(0, 3, (rows,))
    if kind == "multilabel":
        return make(rows, 3) * scale, torch.randint(0, 2, (rows, 3))
    return make(rows) * scale, torch.randint(0, 2, (rows,))


@needed
@pytest.mark.parametrize("metric, kwargs, kind", CURVE_METRICS, ids=CURVE_IDS)
def test_curve_and_confusion_updates_lose_the_formatters_read(metric, kwargs, kind):
    """Other syncs (``_bincount``, boolean removal) may remain: only the formatter's is checked."""
    from tmpatch.audit import audit

    preds, target = _inputs(kind)
    unpatched = audit(metric(validate_args=False, **kwargs).update, preds, target, real=False)
    assert any(p.function in FORMATTER_NAMES for p in _reads(unpatched)), str(unpatched)
    _apply()
    patched = audit(metric(validate_args=False, **kwargs).update, preds, target, real=False)
    assert not [p for p in patched.sync_points if p.function in FORMATTER_NAMES], str(patched)
    assert not _reads(patched), str(patched)


def _leaves(value: Any) -> List[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    return [t for v in value for t in _leaves(v)]


@needed
@pytest.mark.parametrize("metric, kwargs, kind", CURVE_METRICS, ids=CURVE_IDS)
def test_curve_and_confusion_results_equal_the_releases(metric, kwargs, kind):
    torch.manual_seed(2)
    batches = [_inputs(kind, logits=False, rows=6), _inputs(kind, logits=True, rows=5)]
    reference = metric(validate_args=False, **kwargs)
    for p, t in batches:
        reference.update(p, t)
    _apply()
    patched = metric(validate_args=False, **kwargs)
    for p, t in batches:
        patched.update(p, t)
    expected, got = _leaves(reference.compute()), _leaves(patched.compute())
    assert len(got) == len(expected)
    for a, b in zip(got, expected):
        assert_bitwise(a, b)
