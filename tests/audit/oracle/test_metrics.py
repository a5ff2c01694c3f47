"""The oracle on real torchmetrics code (every release 1.0.0 .. 1.9.0)."""
import pytest
import torch

from tests.audit.helpers import counts_with_bincount, release_in
from tmpatch.audit import SyncKind, audit

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
    assert report.complete and [p.op for p in shapes] == (["aten.bincount"] if counts_with_bincount() else [])
    assert all(p.function == "_bincount" for p in shapes)


@pytest.mark.filterwarnings("ignore:You are trying to use a metric in deterministic mode")
@pytest.mark.skipif(release_in("<1.0.0"), reason="_cumsum from 1.0.0")
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


def _build(cls, **options):
    """``cls(**options)`` with only the options this release knows."""
    import inspect

    known = inspect.signature(cls.__init__).parameters
    return cls(**{k: v for k, v in options.items() if k in known})


def test_linalg_error_checks_in_signal_distortion_ratio_and_procrustes():
    from torchmetrics.audio import SignalDistortionRatio

    report = audit(SignalDistortionRatio().update, torch.randn(2, 800), torch.randn(2, 800))
    checks = _at(report.of_kind(SyncKind.LINALG_CHECK), "torchmetrics/functional/audio/sdr.py")
    assert report.complete and [p.op for p in checks] == ["aten._linalg_check_errors"], str(report)
    try:
        from torchmetrics.shape import ProcrustesDisparity
    except ImportError:
        assert release_in("<1.7.0")
        return
    report = audit(ProcrustesDisparity().update, torch.rand(2, 10, 3), torch.rand(2, 10, 3))
    assert [p.op for p in report.of_kind(SyncKind.LINALG_CHECK)] == ["aten._linalg_svd"], str(report)


def test_cpu_indices_in_psnrb_and_perplexity():
    from torchmetrics.text import Perplexity

    if release_in(">=1.0.0"):  # PSNRB from 1.0.0
        from torchmetrics.image import PeakSignalNoiseRatioWithBlockedEffect

        psnrb = _build(PeakSignalNoiseRatioWithBlockedEffect, data_range=1.0)
        report = audit(psnrb.update, torch.rand(1, 1, 16, 16), torch.rand(1, 1, 16, 16))
        copies = _at(report.of_kind(SyncKind.CPU_INDEX), "torchmetrics/functional/image/psnrb.py")
        assert report.complete and len(copies) == 8, str(report)  # h_b, h_b + 1, h_bc, ... on every update
    import importlib
    import inspect

    perplexity = importlib.import_module("torchmetrics.functional.text.perplexity")
    arange = "torch.arange(" in inspect.getsource(perplexity._perplexity_update)  # probs[torch.arange(n), target]
    report = audit(Perplexity().update, torch.rand(2, 8, 5), torch.randint(0, 5, (2, 8)))
    copies = _at(report.of_kind(SyncKind.CPU_INDEX), "torchmetrics/functional/text/perplexity.py")
    assert report.complete and len(copies) == int(arange), str(report)
