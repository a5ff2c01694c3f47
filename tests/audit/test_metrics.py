"""The oracle on real torchmetrics code (every release 1.0.0 .. 1.9.0)."""
import pytest
import torch

from tmpatch.audit import SyncKind, audit

from tests.audit.helpers import release_in

pytest.importorskip("torchmetrics")


def _at(points, suffix):
    return [p for p in points if p.location.rsplit(":", 1)[0].endswith(suffix)]


def test_mean_metric_nan_check_reads_the_device():
    from torchmetrics import MeanMetric

    report = audit(MeanMetric().update, torch.randn(8))
    reads = _at(report.of_kind(SyncKind.D2H_READ), "torchmetrics/aggregation.py")
    assert report.complete and len(reads) >= 1
    assert reads[0].function == "_cast_and_nan_check_input"


def test_mean_metric_default_weight_copy_until_1_6_2():
    from torchmetrics import MeanMetric

    copies = _at(audit(MeanMetric().update, torch.randn(8)).of_kind(SyncKind.H2D_COPY),
                 "torchmetrics/aggregation.py")
    assert len(copies) == (1 if release_in("<1.6.2") else 0)


def test_mean_metric_python_float_is_a_host_to_device_copy():
    from torchmetrics import MeanMetric

    report = audit(MeanMetric().update, 3.5)
    assert _at(report.of_kind(SyncKind.H2D_COPY), "torchmetrics/aggregation.py")


def test_safe_divide_by_release():
    from torchmetrics.utilities.compute import _safe_divide

    report = audit(_safe_divide, torch.randn(4), torch.randn(4))
    if release_in("<1.4.0") or release_in(">=1.9.0"):
        assert report.count == 0, str(report)
    else:
        copies = _at(report.of_kind(SyncKind.H2D_COPY), "torchmetrics/utilities/compute.py")
        assert report.count == len(copies) == 1, str(report)


def test_multiclass_accuracy_bincount():
    from torchmetrics.classification import MulticlassAccuracy

    metric = MulticlassAccuracy(num_classes=5, validate_args=False)
    report = audit(metric.update, torch.randn(8, 5), torch.randint(0, 5, (8,)))
    shapes = _at(report.of_kind(SyncKind.DATA_DEPENDENT_SHAPE), "torchmetrics/utilities/data.py")
    assert report.complete and [p.op for p in shapes] == ["aten.bincount"]
    assert shapes[0].function == "_bincount"


@pytest.mark.filterwarnings("ignore:You are trying to use a metric in deterministic mode")
def test_cumsum_device_in_deterministic_mode():
    from torchmetrics.utilities.data import _cumsum

    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        report = audit(_cumsum, torch.randn(8), dim=0, device="cuda:1")
    finally:
        torch.use_deterministic_algorithms(previous)
    buggy = release_in("<1.4.1")
    assert report.result_devices == [torch.device("cuda:0" if buggy else "cuda:1")]
    assert bool(report.of_kind(SyncKind.DEVICE_MISMATCH)) is buggy
    if buggy:  # later releases skip the host round trip on torch >= 2.6
        assert report.of_kind(SyncKind.D2H_COPY) and report.of_kind(SyncKind.H2D_COPY)


def test_metric_forward_runs_to_the_end():
    from torchmetrics import MeanMetric

    report = audit(MeanMetric(), torch.randn(8))
    assert report.complete and report.result_devices == [torch.device("cuda:0")]
