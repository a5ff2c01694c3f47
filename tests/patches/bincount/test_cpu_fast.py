"""bincount on the CPU: an update whose classes are all valid takes the release's update
(no recorded update: nothing to save there, and the release counts them exactly); one with
an invalid class takes the recorded update and is reported at compute(), as on a GPU."""
from __future__ import annotations

import pytest
import torch

from tests.patches.bincount import cases
from tmpatch.patches.bincount import counting, metrics
from torchmetrics import classification as cls

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

        def __init__(self, metric):
            count.append(metric)
            super().__init__(metric)

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
