"""bincount on the CPU: an update whose classes are all valid takes the release's update
(no recorded update: nothing to save there, and the release counts them exactly); one with
an invalid class takes the recorded update and is reported at compute(), as on a GPU.
Where the release raises on every invalid class (``RELEASE_FIRST``) its update runs first
and is recorded only when it raises: each release is checked to raise there, before it
touches a state (test_host_shortcuts_invalid.py reruns the invalid-class comparisons)."""
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
def test_an_invalid_class_takes_the_recorded_update_and_is_reported(index, opened):
    kind, make, labels = CASES[index]
    batches = _batches(kind, index, labels=labels)
    bad = batches[1][1].clone()
    bad.view(-1)[0] = C + 3 if kind == "multiclass" else 2
    batches[1] = (batches[1][0], bad)
    cases.apply()
    metric = make()
    for p, t in batches:
        metric.update(p, t)
    assert len(opened) == 1  # the second update only
    assert cases.outcome(metric).startswith(f"RuntimeError: {cases.MESSAGE}1 value(s)")


# -- the ways of a CPU update ---------------------------------------------------------------------
#: 0.10.0-0.10.1 count with ``index_add_``, which raises IndexError: their classes are read first
FIRST = metrics.CHECKED if cases.INDEX_ADD else metrics.RELEASE_FIRST


def _way(metric, preds, target):
    curve = isinstance(metric, (cls.BinaryPrecisionRecallCurve, cls.MulticlassPrecisionRecallCurve))
    return metrics.cpu_way(metric, preds, target, curve)


@pytest.mark.parametrize("make, labels, way", [
    (lambda: cls.MulticlassAccuracy(C, validate_args=False), False, FIRST),
    (lambda: cls.MulticlassAccuracy(C, average="micro", validate_args=False), False, metrics.CHECKED),
    (lambda: cls.MulticlassAccuracy(C, validate_args=False), True, metrics.CHECKED),
    (lambda: cls.MulticlassAccuracy(C, validate_args=True), False, metrics.CHECKED),
    (lambda: cls.MulticlassAccuracy(C, top_k=2, validate_args=False), False, metrics.RELEASE),
    (lambda: cls.MulticlassConfusionMatrix(C, validate_args=False), False, FIRST),
    (lambda: cls.MulticlassPrecisionRecallCurve(C, thresholds=5, validate_args=False), False, FIRST),
    (lambda: cls.MulticlassPrecisionRecallCurve(C, thresholds=None, validate_args=False), False, metrics.RELEASE),
    (lambda: cls.BinaryConfusionMatrix(validate_args=False), False, FIRST),
    (lambda: cls.BinaryConfusionMatrix(validate_args=False), True, metrics.CHECKED),
    (lambda: cls.BinaryAUROC(thresholds=10, validate_args=False), False, FIRST),
    (lambda: cls.MultilabelConfusionMatrix(3, validate_args=False), False, metrics.CHECKED),
])
def test_each_path_takes_its_way(make, labels, way):
    metric = make()
    n = 16
    if isinstance(metric, (cls.MultilabelConfusionMatrix,)):
        preds, target = torch.rand(n, 3), torch.randint(0, 2, (n, 3))
    elif "num_classes" in metric.__dict__:
        preds = torch.randint(0, C, (n,)) if labels else torch.rand(n, C)
        target = torch.randint(0, C, (n,))
    else:
        preds = torch.randint(0, 2, (n,)) if labels else torch.rand(n)
        target = torch.randint(0, 2, (n,))
    assert _way(metric, preds, target) == way


def test_deterministic_mode_records_every_counting_update():
    """There the release's _bincount counts with a mesh (or a loop), slowly, and drops codes out of
    range; a recorded update counts with torch.bincount, deterministic on the CPU."""
    cases.apply()  # the replacement is built: the way's module globals are bound
    metric = cls.MulticlassConfusionMatrix(C, validate_args=False)
    preds, target = torch.rand(8, C), torch.randint(0, C, (8,))
    torch.use_deterministic_algorithms(True)
    try:
        assert _way(metric, preds, target) == metrics.RECORDED
        assert _way(cls.BinaryAUROC(thresholds=10), torch.rand(8), torch.randint(0, 2, (8,))) == metrics.RECORDED
    finally:
        torch.use_deterministic_algorithms(False)
    assert _way(metric, preds, target) == FIRST


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


def _raises_and_keeps_the_states(metric, preds, target, at, bad):
    """The unpatched ``metric``, updated once with ``target``, then again with ``target[at] = bad``:
    the second update raises and leaves the states as they were."""
    metric.update(preds, target)
    before = [s.clone() for s in cases.states(metric)]
    target[at] = bad
    with pytest.raises(RuntimeError):
        metric.update(preds, target)
    assert all(torch.equal(a, b) for a, b in zip(cases.states(metric), before))


@pytest.mark.parametrize("bad", [-1, -7, C, C + 1, 10**6])
@pytest.mark.parametrize("make", [
    lambda ii: cls.MulticlassAccuracy(C, average="none", ignore_index=ii, validate_args=False),
    lambda ii: cls.MulticlassConfusionMatrix(C, ignore_index=ii, validate_args=False),
    lambda ii: cls.MulticlassPrecisionRecallCurve(C, thresholds=4, ignore_index=ii, validate_args=False),
])
@pytest.mark.skipif(cases.INDEX_ADD, reason="0.10.0-0.10.1 raise IndexError: no RELEASE_FIRST way there")
def test_the_release_raises_on_every_invalid_multiclass_target_without_touching_a_state(make, bad):
    """What RELEASE_FIRST stands on, checked against each release: the unpatched update raises
    and leaves the states as they were."""
    cases.unpatched()
    _raises_and_keeps_the_states(make(None), torch.rand(6, C), torch.tensor([0, 1, 2, 3, 1, 0]), 2, bad)


@pytest.mark.parametrize("bad", [-1, -3, 2, 3, 10**6])
@pytest.mark.parametrize("make", [
    lambda: cls.BinaryConfusionMatrix(validate_args=False),
    lambda: cls.BinaryPrecisionRecallCurve(thresholds=5, validate_args=False),
    lambda: cls.BinaryAUROC(thresholds=torch.tensor([-float("inf"), 0.5, float("inf")]), validate_args=False),
])
@pytest.mark.skipif(cases.INDEX_ADD, reason="0.10.0-0.10.1 raise IndexError: no RELEASE_FIRST way there")
def test_the_release_raises_on_every_invalid_binary_target_without_touching_a_state(make, bad):
    cases.unpatched()
    _raises_and_keeps_the_states(make(), torch.rand(6), torch.tensor([0, 1, 1, 0, 1, 0]), 5, bad)
