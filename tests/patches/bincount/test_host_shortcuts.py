"""bincount on the CPU: every update takes the release's update (nothing to save there: its counts,
a miscount of an invalid class included, and its errors, from its own statements); in
deterministic mode, where the release counts with a mesh, an update whose classes are all valid is
recorded and counted plainly, the same counts (test_host_shortcuts_invalid.py compares invalid
classes with the release)."""
from __future__ import annotations

import pytest
import torch
from torchmetrics import classification as cls

from tests.conftest import assert_bitwise, release_in
from tests.patches.bincount import cases
from tmpatch.patches.bincount import counting, metrics

N, C, L = 32, 4, 3


def _batches(kind: str, seed: int, *, labels: bool = False):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(2):
        if kind == "multiclass":
            preds = torch.randint(0, C, (N,), generator=g) if labels else torch.rand(N, C, generator=g)
            out.append((preds, torch.randint(0, C, (N,), generator=g)))
        elif kind == "binary":
            preds = torch.randint(0, 2, (N,), generator=g) if labels else torch.rand(N, generator=g)
            out.append((preds, torch.randint(0, 2, (N,), generator=g)))
        else:
            preds = torch.randint(0, 2, (N, L), generator=g) if labels else torch.rand(N, L, generator=g)
            out.append((preds, torch.randint(0, 2, (N, L), generator=g)))
    return out


CASES = [
    ("multiclass", lambda **k: cls.MulticlassAccuracy(C, validate_args=False, **k), False),
    ("multiclass", lambda **k: cls.MulticlassConfusionMatrix(C, validate_args=False, **k), True),
    ("multiclass", lambda **k: cls.MulticlassPrecisionRecallCurve(C, thresholds=5, validate_args=False, **k), False),
    ("binary", lambda **k: cls.BinaryConfusionMatrix(validate_args=False, **k), True),
    ("binary", lambda **k: cls.BinaryAUROC(thresholds=10, validate_args=False, **k), False),
    ("multilabel", lambda **k: cls.MultilabelConfusionMatrix(L, validate_args=False, **k), False),
]


@pytest.fixture
def opened(monkeypatch):
    """How many recorded updates were opened."""
    count = []

    class Counted(counting.Update):
        __slots__ = ()

        def __init__(self, metric, labels=False):
            count.append(metric)
            super().__init__(metric, labels)

    monkeypatch.setattr(metrics, "Update", Counted)
    return count


@pytest.mark.parametrize("ignore", [None, -1, 0])
@pytest.mark.parametrize("index", range(len(CASES)))
def test_valid_classes_take_the_release_update(index, ignore, opened):
    kind, make, labels = CASES[index]
    batches = _batches(kind, index, labels=labels)
    if ignore is not None:
        batches = [(p, t.masked_fill(torch.arange(t.numel()).reshape(t.shape) % 5 == 0, ignore)) for p, t in batches]
    metric, expected = cases.pair(lambda: make(ignore_index=ignore), batches)
    assert opened == []  # the shortcut: no recorded update
    cases.assert_same(metric, expected)


@pytest.mark.parametrize("index", range(len(CASES)))
def test_an_invalid_class_takes_the_release_update(index, opened):
    """The release's counts (a miscount included) or its error, from its own update."""
    kind, make, labels = CASES[index]
    batches = _batches(kind, index, labels=labels)
    bad = batches[1][1].clone()
    bad.view(-1)[0] = C + 3 if kind == "multiclass" else 2
    batches[1] = (batches[1][0], bad)
    metric, expected = cases.pair(make, batches)
    assert opened == []
    cases.assert_same(metric, expected)


# -- the ways of a CPU update ---------------------------------------------------------------------
def _way(metric, preds, target):
    curve = isinstance(metric, (cls.BinaryPrecisionRecallCurve, cls.MulticlassPrecisionRecallCurve))
    return metrics.cpu_way(metric, preds, target, curve)


WAYS = [  # (metric, label predictions, its way in deterministic mode with valid classes)
    (lambda: cls.MulticlassAccuracy(C, validate_args=False), False, metrics.RECORDED),
    (lambda: cls.MulticlassAccuracy(C, average="micro", validate_args=False), False, metrics.RECORDED),
    (lambda: cls.MulticlassAccuracy(C, validate_args=False), True, metrics.RECORDED),
    (lambda: cls.MulticlassAccuracy(C, validate_args=True), False, metrics.RECORDED),
    (lambda: cls.MulticlassAccuracy(C, top_k=2, validate_args=False), False, metrics.RELEASE),
    (lambda: cls.MulticlassConfusionMatrix(C, validate_args=False), False, metrics.RECORDED),
    (lambda: cls.MulticlassPrecisionRecallCurve(C, thresholds=5, validate_args=False), False, metrics.RECORDED),
    (lambda: cls.MulticlassPrecisionRecallCurve(C, thresholds=None, validate_args=False), False, metrics.RELEASE),
    (lambda: cls.BinaryConfusionMatrix(validate_args=False), False, metrics.RECORDED),
    (lambda: cls.BinaryConfusionMatrix(validate_args=False), True, metrics.RECORDED),
    (lambda: cls.BinaryAUROC(thresholds=10, validate_args=False), False, metrics.RECORDED),
    (lambda: cls.MultilabelConfusionMatrix(3, validate_args=False), False, metrics.RECORDED),
]


def _inputs(metric, labels, bad=False):
    n = 16
    if isinstance(metric, (cls.MultilabelConfusionMatrix,)):
        preds, target = torch.rand(n, 3), torch.randint(0, 2, (n, 3))
    elif "num_classes" in metric.__dict__:
        preds = torch.randint(0, C, (n,)) if labels else torch.rand(n, C)
        target = torch.randint(0, C, (n,))
    else:
        preds = torch.randint(0, 2, (n,)) if labels else torch.rand(n)
        target = torch.randint(0, 2, (n,))
    if bad:
        target.view(-1)[3] = -1
    return preds, target


@pytest.mark.parametrize("make, labels, way", WAYS)
def test_each_path_takes_its_way(make, labels, way):
    """Outside deterministic mode every CPU update is the release's (torch.bincount: its counts, its
    errors); in it, an update whose classes are all valid is recorded (a plain count, not the mesh),
    one with an invalid class is the release's (its mesh's counts)."""
    cases.apply()  # the replacement is built: the way's module globals are bound
    metric = make()
    preds, target = _inputs(metric, labels)
    assert _way(metric, preds, target) == metrics.RELEASE
    torch.use_deterministic_algorithms(True)
    try:
        assert _way(metric, preds, target) == way
        assert _way(metric, *_inputs(metric, labels, bad=True)) == metrics.RELEASE
    finally:
        torch.use_deterministic_algorithms(False)


class _Repeats(torch.overrides.TorchFunctionMode):
    """Counts ``Tensor.repeat`` calls: the release's mesh is ``arange(minlength).repeat(N, 1)``."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.repeat:
            self.count += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("make", [
    lambda: cls.MulticlassAUROC(C, thresholds=50),
    lambda: cls.BinaryAUROC(thresholds=50),
    lambda: cls.MulticlassConfusionMatrix(C),
    lambda: cls.MulticlassF1Score(C, validate_args=False),
], ids=["multiclass-auroc", "binary-auroc", "confusion-matrix", "f1"])
def test_deterministic_mode_counts_without_the_releases_mesh(make):
    """The same states as the release's mesh, from torch.bincount."""
    kind = "binary" if isinstance(make(), cls.BinaryAUROC) else "multiclass"
    batches = _batches(kind, 3)

    def run(patched: bool):
        cases.apply() if patched else cases.unpatched()
        metric = make()
        mode = _Repeats()
        torch.use_deterministic_algorithms(True)
        try:
            with mode:
                for preds, target in batches:
                    metric.update(preds, target)
        finally:
            torch.use_deterministic_algorithms(False)
        return mode.count, [s.clone() for s in cases.states(metric)]

    meshes, expected = run(False)
    if release_in(">=1.2.1"):  # before, a Python loop over the classes instead of the mesh
        assert meshes == len(batches)  # the release: a mesh per update
    meshes, actual = run(True)
    assert meshes == 0
    for got, want in zip(actual, expected):
        assert_bitwise(got, want)
