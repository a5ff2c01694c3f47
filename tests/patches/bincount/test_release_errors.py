"""bincount on invalid classes is the release's: on the CPU its update runs (its errors from the
same metric, call and statement; none where it raises none, its counts where it miscounts);
on a device the recorded update counts the cells the release's ``_bincount`` would and defers
only what would make the release raise, in its words. With and without deterministic mode,
where the release's ``_bincount`` counts with a mesh that drops codes outside its bins."""
from __future__ import annotations

import traceback
import warnings
from typing import Any, Callable, List, Tuple

import pytest
import torch
from torchmetrics import MetricCollection, classification as cls

import tmpatch
from tests.conftest import assert_bitwise, cpu_shortcuts
from tests.patches.bincount import cases

_G = torch.Generator().manual_seed(0)
SCORES = torch.randn(4, 5, generator=_G)
PROBS = SCORES.softmax(-1)
LABELS, LABEL_TARGET = torch.tensor([0, 1, 5]), torch.tensor([0, 1, 2])

#: (name, metric, batches)
PROBES: List[Tuple[str, Callable[[], Any], List[Tuple[torch.Tensor, torch.Tensor]]]] = [
    ("accuracy, scores, target 5", lambda: cls.MulticlassAccuracy(num_classes=5),
     [(SCORES, torch.tensor([0, 1, 2, 5]))]),
    ("accuracy, scores, target -1", lambda: cls.MulticlassAccuracy(num_classes=5, validate_args=False),
     [(SCORES, torch.tensor([0, 1, -1, 3]))]),
    ("accuracy micro, scores, target 5", lambda: cls.MulticlassAccuracy(num_classes=5, average="micro"),
     [(SCORES, torch.tensor([0, 1, 2, 5]))]),
    ("confusion matrix, label preds 5", lambda: cls.MulticlassConfusionMatrix(4), [(LABELS, LABEL_TARGET)]),
    ("confusion matrix, target -1", lambda: cls.MulticlassConfusionMatrix(4, validate_args=False),
     [(torch.tensor([0, 1, 2]), torch.tensor([0, -1, 2]))]),
    ("confusion matrix, ignore -1, label preds 5", lambda: cls.MulticlassConfusionMatrix(4, ignore_index=-1),
     [(torch.tensor([0, 1, 5, 3]), torch.tensor([0, -1, 2, 3]))]),
    ("accuracy, label preds 5", lambda: cls.MulticlassAccuracy(4), [(LABELS, LABEL_TARGET)]),
    ("stat scores, label preds 5", lambda: cls.MulticlassStatScores(4), [(LABELS, LABEL_TARGET)]),
    ("jaccard, label preds 5", lambda: cls.MulticlassJaccardIndex(4), [(LABELS, LABEL_TARGET)]),
    ("accuracy, two updates, the second invalid", lambda: cls.MulticlassAccuracy(4, validate_args=False),
     [(LABEL_TARGET, LABEL_TARGET), (torch.tensor([0, 1, 3]), torch.tensor([0, 4, 3]))]),
    ("binary confusion matrix, target 2", lambda: cls.BinaryConfusionMatrix(validate_args=False),
     [(torch.tensor([0.2, 0.7, 0.9]), torch.tensor([0, 1, 2]))]),
    ("binary confusion matrix, ignore -1", lambda: cls.BinaryConfusionMatrix(ignore_index=-1),
     [(torch.tensor([0.2, 0.7, 0.9]), torch.tensor([0, -1, 1]))]),
    ("binary AUROC, target 2", lambda: cls.BinaryAUROC(thresholds=5, validate_args=False),
     [(torch.tensor([0.2, 0.7, 0.9]), torch.tensor([0, 1, 2]))]),
    ("multilabel confusion matrix, target 2 in label 0",
     lambda: cls.MultilabelConfusionMatrix(3, validate_args=False),
     [(torch.tensor([[1, 0, 1], [0, 1, 1]]), torch.tensor([[2, 0, 1], [0, 1, 1]]))]),
    ("multilabel confusion matrix, target 2 in the last label",
     lambda: cls.MultilabelConfusionMatrix(3, validate_args=False),
     [(torch.tensor([[1, 0, 1], [0, 1, 1]]), torch.tensor([[1, 0, 2], [0, 1, 1]]))]),
    ("multilabel AUROC, target -1", lambda: cls.MultilabelAUROC(3, thresholds=4, validate_args=False),
     [(torch.rand(2, 3, generator=_G), torch.tensor([[-1, 0, 1], [0, -1, 1]]))]),
    ("multiclass AUROC, target 5", lambda: cls.MulticlassAUROC(5, thresholds=5, validate_args=False),
     [(PROBS, torch.tensor([0, 1, 2, 5]))]),
    ("multiclass AUROC, target -1", lambda: cls.MulticlassAUROC(5, thresholds=5, validate_args=False),
     [(PROBS, torch.tensor([0, 1, -1, 3]))]),
    ("collection, accuracy and AUROC, target 5",
     lambda: MetricCollection([cls.MulticlassAccuracy(5), cls.MulticlassAUROC(5, thresholds=5)]),
     [(PROBS, torch.tensor([0, 1, 2, 5]))]),
    ("collection, AUROC first", lambda: MetricCollection(
        {"a": cls.MulticlassAUROC(5, thresholds=5), "b": cls.MulticlassAccuracy(5)}),
     [(PROBS, torch.tensor([0, 1, 2, 5]))]),
]


@pytest.fixture(params=[False, True], ids=["default", "deterministic"])
def deterministic(request):
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(request.param)
    yield request.param
    torch.use_deterministic_algorithms(before)


def _run(make: Callable[[], Any], batches) -> Tuple[str, Any, Any]:
    """``("update", error, frame)``, ``("compute", error, frame)`` or ``("ok", result, states)``;
    ``frame``: the file and function of the statement that raised, and the metric whose call raised."""
    metric = make()
    stage = "update"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            for preds, target in batches:
                metric.update(preds, target)
            stage = "compute"
            result = metric.compute()
        except Exception as exc:  # noqa: BLE001 - the release's own errors are compared
            last = traceback.extract_tb(exc.__traceback__)[-1]
            owners = [frame.f_locals.get("self") for frame, _ in traceback.walk_tb(exc.__traceback__)]
            metrics = [type(o).__name__ for o in owners if type(o).__name__.startswith(("Multi", "Binary"))]
            return stage, exc, (last.filename.rsplit("site-packages", 1)[-1], last.name, metrics[-1:])
    return "ok", result, [cases.tensors(s) for s in _states(metric)]


def _states(metric: Any) -> List[Any]:
    if isinstance(metric, MetricCollection):
        return [getattr(m, name) for m in metric.values() for name in m._defaults]
    return cases.states(metric)


def _release(make, batches):
    tmpatch.revert()
    return _run(make, batches)


def _same_values(got: Any, want: Any) -> None:
    got, want = cases.tensors(got), cases.tensors(want)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert_bitwise(g, w)


@pytest.mark.parametrize("index", range(len(PROBES)), ids=[p[0] for p in PROBES])
def test_on_the_cpu_the_release_raises_or_counts_and_so_does_patched(index, deterministic):
    name, make, batches = PROBES[index]
    want = _release(make, batches)
    cases.apply()
    cpu_shortcuts(True)
    got = _run(make, batches)
    assert got[0] == want[0], (got, want)
    if want[0] == "ok":
        _same_values(got[1], want[1])
        for g, w in zip(got[2], want[2]):
            _same_values(g, w)
    else:
        assert type(got[1]) is type(want[1]) and str(got[1]) == str(want[1]), (got[1], want[1])
        assert got[2] == want[2]  # the same statement, the same metric


def _release_words(error: BaseException) -> str:
    """What the deferred error's message must start with: the release's message (the length of the
    count in a ``reshape`` error is not known without a read)."""
    text = str(error)
    if text.startswith("shape '"):
        return text.split(" is invalid for input of size ")[0] + " is invalid for input of size"
    return text


def same_as_release_on_a_device(make: Callable[[], Any], batches) -> None:
    """The device path (CPU shortcuts off, reports held for a settle point) against the release:
    its states and result where it raises nothing, else its error (type, words) at compute()."""
    want = _release(make, batches)
    cases.apply()
    cpu_shortcuts(False)
    got = _run(make, batches)
    if want[0] == "ok":
        assert got[0] == "ok", got
        _same_values(got[1], want[1])
        for g, w in zip(got[2], want[2]):
            _same_values(g, w)
        return
    assert got[0] == "compute", got  # deferred: the first settle point after the update
    if f"{type(want[1]).__name__}: {want[1]}" == cases.INDEX_ADD_ERROR:  # 0.10.0-0.10.1 (cases.INDEX_ADD_ERROR)
        assert f"{type(got[1]).__name__}: {got[1]}".startswith(cases.INDEX_ADD_DEFERRED), (got[1], want[1])
    else:
        assert type(got[1]) is type(want[1]), (got[1], want[1])
        assert str(got[1]).startswith(_release_words(want[1])), (got[1], want[1])
    assert "(tmpatch bincount: " in str(got[1])


@pytest.mark.parametrize("index", range(len(PROBES)), ids=[p[0] for p in PROBES])
def test_on_a_device_the_release_cells_are_counted_and_its_errors_deferred(index, deterministic):
    name, make, batches = PROBES[index]
    same_as_release_on_a_device(make, batches)


def test_the_examples_of_the_report():
    """The three examples: the release's error from update(); none in deterministic mode; none for a
    label prediction of 5 (counted in the release's cell)."""
    cases.apply()
    cpu_shortcuts(True)
    with cases.release_raises(r"^shape '\[5, 5\]' is invalid for input of size \d+$"):
        cls.MulticlassAccuracy(num_classes=5).update(SCORES, torch.tensor([0, 1, 2, 5]))
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        metric = cls.MulticlassAccuracy(num_classes=5)
        metric.update(SCORES, torch.tensor([0, 1, 2, 5]))
        metric.compute()
    finally:
        torch.use_deterministic_algorithms(before)
    metric = cls.MulticlassConfusionMatrix(4)
    metric.update(LABELS, LABEL_TARGET)
    assert metric.compute()[3, 1] == 1  # the flat index 2 * 4 + 5 = 13
