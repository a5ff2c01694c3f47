"""Label predictions, made from scores by the formatter or given by the user, make the release's
codes in a recorded update (the GPU's way: CPU shortcuts off): an invalid label counts in the cell
the release counts it in, or, where its code lies outside the bins, is reported in the release's
words; the class checks themselves (counting.outside, not_binary) agree with comparisons."""
from __future__ import annotations

import pytest
import torch
from torchmetrics import classification as cls

from tests.patches.bincount.test_release_errors import same_as_release_on_a_device


@pytest.mark.parametrize("metric_cls", [cls.MulticlassConfusionMatrix, cls.MulticlassAccuracy])
@pytest.mark.parametrize("bad", [7, -2])
def test_scores_of_every_class_with_an_invalid_target(metric_cls, bad):
    preds = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))
    target = torch.tensor([0, 1, bad, 3, 2, 1, 1, 0])
    same_as_release_on_a_device(lambda: metric_cls(num_classes=4, validate_args=False), [(preds, target)])


@pytest.mark.parametrize("target", [[0, 1, 2, 3, 0, 1], [0, 1, 2, 3, 3, 1]])
def test_scores_of_more_columns_count_their_labels_where_the_release_does(target):
    preds = torch.zeros(6, 6)
    preds[torch.arange(6), torch.tensor([0, 5, 1, 4, 3, 2])] = 1.0  # argmax 5 and 4: not among 4 classes
    same_as_release_on_a_device(lambda: cls.MulticlassConfusionMatrix(num_classes=4, validate_args=False),
                                [(preds, torch.tensor(target))])


@pytest.mark.parametrize("preds", [[0.1, 0.9, 0.4, 0.2, 0.7, 0.6], [0, 1, 1, 0, 1, 1], [0, 1, 2, 0, 1, 1]])
@pytest.mark.parametrize("target", [[0, 1, 2, 1, 0, -1], [0, 1, 0, 1, 0, 1]])
def test_binary_scores_and_labels(preds, target):
    same_as_release_on_a_device(lambda: cls.BinaryConfusionMatrix(validate_args=False),
                                [(torch.tensor(preds), torch.tensor(target))])


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
