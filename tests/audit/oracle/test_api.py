"""audit(), count_syncs() and no_sync()."""
import warnings

import pytest
import torch

from tests.audit.helpers import marked_line
from tmpatch.audit import SyncError, SyncKind, audit, count_syncs, no_sync, to_sim_cuda

needs_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def two_reads(x, scale=1.0):
    return x.sum().item() * scale + x.max().item()


def test_count_syncs_and_kwargs():
    assert count_syncs(two_reads, torch.randn(4), scale=2.0) == 2
    assert audit(two_reads, torch.randn(4), scale=2.0, real=False).result == 3.0


def test_audit_leaves_the_callers_metric_alone():
    from torchmetrics import MeanMetric

    metric = MeanMetric()
    before = {k: getattr(metric, k).clone() for k in metric._defaults}
    for target in (metric.update, metric):
        report = audit(target, torch.randn(8))
        assert report.complete and report.count >= 1
    assert metric.device == torch.device("cpu")
    for key, value in before.items():
        assert type(getattr(metric, key)) is torch.Tensor and torch.equal(getattr(metric, key), value)


def test_a_metric_built_before_apply_is_audited_as_it_runs():
    """A metric built before ``tmpatch.apply()`` keeps the release's update (and has no book of
    deferred reports): it syncs on every update. The audit's copy must do what the object does,
    not what a metric built now would do."""
    from torchmetrics import MeanMetric

    import tmpatch
    from tmpatch.audit.oracle.api import audit_simulated

    tmpatch.revert()
    unpatched = count_syncs(MeanMetric().update, torch.randn(8), real=False)
    old, itself = MeanMetric(), MeanMetric()
    tmpatch.apply()
    new = MeanMetric()
    # the object itself, no copy: what it really does (it is changed by the run)
    own = audit_simulated(itself.update, (torch.randn(8),), {}, torch.device("cuda", 0)).count
    assert own >= 1 and unpatched >= 1
    assert count_syncs(old.update, torch.randn(8), real=False) == own
    assert count_syncs(old, torch.randn(8), real=False) == own  # forward: the same update
    assert count_syncs(new.update, torch.randn(8), real=False) == 0
    # and the copy of a metric built now runs its patched update (and reports nothing pending)
    report = audit(new.update, torch.randn(8), real=False)
    assert report.complete and report.count == 0


def test_metric_passed_as_argument_is_copied_and_moved():
    from torchmetrics import SumMetric

    metric = SumMetric()
    report = audit(lambda m, x: (m.update(x), m.device)[1], metric, torch.randn(3), device="cuda:1")
    assert report.result == torch.device("cuda:1") and metric.device == torch.device("cpu")


def sync_in_block(x):
    return bool(x.any())  # <- sync


def test_no_sync_raises_on_the_first_sync():
    with pytest.raises(SyncError) as info:
        with no_sync() as dev:
            x = to_sim_cuda(torch.randn(4), dev)
            y = torch.where(x > 0, x, 0.0) * torch.tensor(2.0)
            sync_in_block(y)
    point = info.value.point
    assert point.kind is SyncKind.D2H_READ and point.op == "aten._local_scalar_dense"
    assert point.location == f"{__file__}:{marked_line(sync_in_block)}"
    assert point.location in str(info.value)


def test_no_sync_passes_sync_free_code():
    with no_sync("cuda:1") as dev:
        x = to_sim_cuda(torch.randn(4), dev)
        out = (x.clamp(min=0) + torch.full((), 1.0, device=dev)).sum()
    assert out.shape == () and dev == torch.device("cuda:1")


def test_real_requires_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(RuntimeError, match="GPU"):
        audit(two_reads, torch.randn(2), real=True)


@needs_gpu
def test_real_gpu_counts_syncs():
    report = audit(two_reads, torch.randn(4), real=True)
    assert report.mode == "real" and report.count >= 2
    assert all(p.location.startswith(__file__) for p in report.sync_points)
    assert audit(lambda x: torch.where(x > 0, x, 0.0), torch.randn(4), real=True).count == 0


@needs_gpu
def test_real_gpu_no_sync():
    x = torch.randn(4, device="cuda")
    with pytest.raises(SyncError):
        with no_sync(real=True):
            x.sum().item()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with no_sync(real=True):
            torch.where(x > 0, x, 0.0)


def test_an_op_it_cannot_size_stops_the_run_and_is_reported(monkeypatch):
    from tmpatch.audit.oracle import recorder

    monkeypatch.setattr(recorder, "synthesize", lambda func, args, kwargs: NotImplemented)
    report = audit(lambda x: (x.sum().item(), torch.nonzero(x), x.sum().item()), torch.randn(4))
    assert not report.complete and report.result is None
    assert "nonzero" in str(report.error) and "stopped early" in str(report)
    assert [p.op for p in report.sync_points] == ["aten._local_scalar_dense", "aten.nonzero"]
