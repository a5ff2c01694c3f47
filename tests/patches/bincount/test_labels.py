"""Labels made from scores need no range check: the formatter's argmax over one score per
class, or its threshold, gives valid classes. Only the target is checked then (its clamp
makes the codes: fewer kernels on a launch-bound GPU, benchmarks/kernel_counts.txt); label
predictions given by the user, or scores with another number of columns, are checked too
(a table of both classes' codes), and the states stay the release's on the valid positions."""
from __future__ import annotations

import pytest
import torch
from torchmetrics import classification as cls

from tests.conftest import assert_bitwise, cpu_shortcuts
from tests.patches.bincount import cases
from tmpatch.patches.bincount import updates


@pytest.fixture
def checked(monkeypatch):
    """The predictions whose classes the edited statements check: a table of both classes'
    codes, or a mask of each (CPU shortcut off: the GPU's way)."""
    seen = []
    pairs, outside, not_binary = updates._pairs, updates.outside, updates.not_binary
    cpu_shortcuts(False)
    monkeypatch.setattr(updates, "_pairs", lambda n, device: seen.append(n) or pairs(n, device))
    monkeypatch.setattr(updates, "outside", lambda x, n: seen.append(x) or outside(x, n))
    monkeypatch.setattr(updates, "not_binary", lambda x: seen.append(x) or not_binary(x))
    return seen


def _check(make, preds, target, valid, checks, checked):
    cases.unpatched()
    expected = make()
    expected.update(preds[valid], target[valid])  # the release on the valid positions alone
    cases.apply()
    metric = make()
    metric.update(preds, target)
    assert len(checked) == checks
    for got, want in zip(cases.states(metric), cases.states(expected)):
        assert_bitwise(got, want)
    assert cases.outcome(metric).startswith(f"RuntimeError: {cases.MESSAGE}{int((~valid).sum())} value(s)")


@pytest.mark.parametrize("metric_cls", [cls.MulticlassConfusionMatrix, cls.MulticlassAccuracy])
def test_scores_of_every_class_check_the_target_alone(metric_cls, checked):
    preds, target = (torch.randn(8, 4, generator=torch.Generator().manual_seed(0)),
                     torch.tensor([0, 1, 7, 3, 2, -2, 1, 0]))
    _check(lambda: metric_cls(num_classes=4, validate_args=False), preds, target, (target >= 0) & (target < 4), 0,
           checked)


def test_scores_of_more_columns_check_the_labels_too(checked):
    preds = torch.zeros(6, 6)
    preds[torch.arange(6), torch.tensor([0, 5, 1, 4, 3, 2])] = 1.0  # argmax 5 and 4: not among 4 classes
    target = torch.tensor([0, 1, 2, 3, 9, 1])
    labels = preds.argmax(1)
    valid = (labels < 4) & (target < 4)
    cases.unpatched()
    expected = cls.MulticlassConfusionMatrix(num_classes=4, validate_args=False)
    expected.update(labels[valid], target[valid])
    cases.apply()
    metric = cls.MulticlassConfusionMatrix(num_classes=4, validate_args=False)
    metric.update(preds, target)
    assert len(checked) == 1  # the labels, with the target
    assert_bitwise(metric.confmat, expected.confmat)
    assert cases.outcome(metric).startswith(f"RuntimeError: {cases.MESSAGE}3 value(s)")


def test_binary_scores_check_the_target_alone_and_labels_both(checked):
    target = torch.tensor([0, 1, 2, 1, 0, -1])
    valid = (target == 0) | (target == 1)
    make = lambda: cls.BinaryConfusionMatrix(validate_args=False)  # noqa: E731
    _check(make, torch.tensor([0.1, 0.9, 0.4, 0.2, 0.7, 0.6]), target, valid, 0, checked)
    checked.clear()
    _check(make, torch.tensor([0, 1, 1, 0, 1, 1]), target, valid, 1, checked)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16, torch.uint8, torch.float32])
def test_the_class_checks_agree_with_the_comparisons(dtype):
    from tmpatch.patches.bincount.counting import not_binary, outside

    values = [0, 1, 2, 3, 4, 5, 127] + ([] if dtype == torch.uint8 else [-1, -128])
    x = torch.tensor(values).to(dtype)
    if dtype.is_floating_point:
        x = torch.cat([x, torch.tensor([float("nan"), 0.5])])
    for count in (1, 2, 5, 200):
        assert torch.equal(outside(x, count), ~((x >= 0) & (x < count))), count
    assert torch.equal(not_binary(x), ~((x == 0) | (x == 1)))
