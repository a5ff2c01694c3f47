"""segmentation_format: MeanIoU/GeneralizedDiceScore 1.4.x detect their input format with no read for boolean inputs."""
from __future__ import annotations

import importlib

import pytest
import torch
from hypothesis import given, settings, strategies as st

import tmpatch
from tests.conftest import assert_bitwise, examples, release_in

NEEDED = release_in(">=1.4.0,<1.5.0")
pytestmark = pytest.mark.skipif(not NEEDED, reason="the format is an argument from 1.5.0; no function before 1.4.0")
FUNCTIONS = {
    "mean_iou": ("torchmetrics.functional.segmentation.mean_iou", "_mean_iou_update"),
    "generalized_dice": ("torchmetrics.functional.segmentation.generalized_dice", "_generalized_dice_update"),
}


def _apply(*others: str) -> None:
    row = next(r for r in tmpatch.apply(["segmentation_format", *others]) if r.name == "segmentation_format")
    assert row.state == "applied", row


def _function(key):
    module, name = FUNCTIONS[key]
    return getattr(importlib.import_module(module), name)


def _one_hot(dtype, seed=0):
    return torch.randint(0, 2, (2, 3, 5, 5), generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("dtype, reads", [(torch.bool, 0), (torch.int64, 1)])
def test_format_detection_reads_once_or_not_at_all_on_simulated_cuda(dtype, reads):
    from tmpatch.audit import SyncKind, audit

    functions = {name for _, name in FUNCTIONS.values()} | {"index_formats"}

    def points(report):
        kinds = (SyncKind.D2H_READ, SyncKind.D2H_COPY)
        return [p for p in report.sync_points if p.kind in kinds and p.function in functions]

    from torchmetrics.segmentation import GeneralizedDiceScore, MeanIoU

    preds, target = _one_hot(dtype), _one_hot(dtype, 1)
    for cls in (MeanIoU, GeneralizedDiceScore):
        assert len(points(audit(cls(num_classes=3).update, preds, target, real=False))) == 2
    _apply("safe_divide")  # MeanIoU's update divides
    for cls in (MeanIoU, GeneralizedDiceScore):
        report = audit(cls(num_classes=3).update, preds, target, real=False)
        assert len(points(report)) == reads, str(report)
        if cls is MeanIoU and dtype is torch.bool:
            assert report.count == 0, str(report)


@st.composite
def _inputs(draw):
    dtype = draw(st.sampled_from([torch.bool, torch.uint8, torch.int32, torch.int64, torch.float32]))
    classes = draw(st.integers(2, 4))
    index = draw(st.booleans())
    shape = (draw(st.integers(1, 2)), *(() if index else (classes,)), 3, 3)
    n = 1
    for s in shape:
        n *= s
    high = classes if index else 2
    values = [draw(st.lists(st.integers(0, high - 1), min_size=n, max_size=n)) for _ in range(2)]
    preds, target = (torch.tensor(v).reshape(shape).to(dtype) for v in values)
    return preds, target, classes, draw(st.booleans())


@settings(max_examples=examples(40), deadline=None)
@given(st.sampled_from(sorted(FUNCTIONS)), _inputs())
def test_functions_return_the_releases_tensors(key, inputs):
    preds, target, classes, background = inputs
    _apply()
    function = _function(key)
    original = tmpatch.get_original(function)
    assert function is not original
    try:
        want = original(preds, target, classes, background)
    except Exception as exc:  # noqa: BLE001 - the same error patched
        with pytest.raises(type(exc)):
            function(preds, target, classes, background)
        return
    got = function(preds, target, classes, background)
    for a, b in zip(got, want):
        assert_bitwise(a, b)
