"""The oracle on small functions with known sync points, and known sync-free ones."""
import pytest
import torch

from tests.audit.helpers import marked_line
from tmpatch.audit import SyncKind, audit, classify
from tmpatch.runtime.deferred import AUDIT_TAG

pytestmark = pytest.mark.once  # nothing here depends on the torchmetrics release

READ, H2D, D2H = SyncKind.D2H_READ, SyncKind.H2D_COPY, SyncKind.D2H_COPY
DDS, MISMATCH = SyncKind.DATA_DEPENDENT_SHAPE, SyncKind.DEVICE_MISMATCH


# one small function per event, with its verdict: tmpatch.audit.calibrate.probes (tests/audit/calibrate/test_probes.py)


def f_mask_assign_scalar(x):
    x[x > 0] = 1.0
    return x


def test_mask_assignment_of_a_scalar_keeps_shape():
    report = audit(f_mask_assign_scalar, torch.randn(2, 3))
    assert report.result.shape == (2, 3) and report.count == 0


def several(x):
    total = x.sum().item()  # read
    kept = x[x > 0]  # data-dependent shape
    host = kept.cpu()  # device-to-host copy
    one = torch.tensor(1.0).to(x.device)  # host-to-device copy
    if (x > 0).any():  # read (any -> plausible False)
        raise AssertionError("not reached in simulation")
    return total, host, one + torch.bincount(x.long(), minlength=5)  # data-dependent shape


def test_one_run_reports_every_sync_point():
    report = audit(several, torch.randn(10))
    assert report.complete
    assert [p.kind for p in report.sync_points] == [READ, DDS, D2H, H2D, READ, DDS]
    total, host, counts = report.result
    assert total == 1.0
    assert host.device.type == "cpu" and host.shape == (10,)
    assert counts.shape == (5,) and counts.device == torch.device("cuda:0")


def plausible(x):
    mask = x > 0
    return (bool(mask.any()), bool(mask.all()), int(x.long().sum()), x.sum().item(), torch.nonzero(x).shape,
            x[mask].shape, torch.bincount(x.long()).shape, torch.unique(x, return_counts=True)[1].shape,
            torch.equal(x, x), x.view(2, 2).tolist())


def test_plausible_values_for_continuation():
    result = audit(plausible, torch.randn(4)).result
    assert result == (False, True, 1, 1.0, (4, 1), (4,), (4,), (4,), True, [[1.0, 1.0], [1.0, 1.0]])


def moves_to_current_device(x):
    return x.cpu().cumsum(0).cuda()


def test_cuda_without_index_lands_on_cuda0():
    report = audit(moves_to_current_device, torch.randn(4), device="cuda:1")
    assert report.result_devices == [torch.device("cuda:0")]
    assert [p.kind for p in report.sync_points] == [D2H, H2D]
    assert [(p.kind, p.op) for p in report.non_syncs] == [(MISMATCH, "(return value)")]
    assert report.count == 2 and report.of_kind(MISMATCH) == report.non_syncs


def cross_device(x):
    return x.to("cuda:0") * 2  # <- sync (not one: a device mismatch)


def test_op_level_device_mismatch():
    report = audit(cross_device, torch.randn(4), device="cuda:1")
    assert report.count == 0 and not report.sync_points  # a copy between GPUs: not a sync
    op_level = [p for p in report.of_kind(MISMATCH) if p.op != "(return value)"]
    assert [p.op for p in op_level] == ["aten._to_copy"]
    assert "cuda:0" in op_level[0].detail and "cuda:1" in op_level[0].detail
    assert op_level[0].location == f"{__file__}:{marked_line(cross_device)}"
    assert report.result_devices == [torch.device("cuda:0")]


def test_audit_on_another_device_keeps_results_there():
    report = audit(lambda a, b: a + b.sum(), torch.randn(3), torch.randn(3), device="cuda:1")
    assert report.count == 0 and report.result_devices == [torch.device("cuda:1")]


def test_classify_on_plain_meta_arguments():
    aten = torch.ops.aten
    cpu = torch.empty(3)
    assert classify(aten._local_scalar_dense.default, (cpu,), {}) is None
    assert classify(aten.nonzero.default, (cpu,), {}) is None


def test_a_deferred_record_reads_as_zero_other_integers_as_one():
    from tmpatch.audit import audit

    def reads():
        counter = torch.ones((), dtype=torch.int64, device="cuda")
        record = torch.ones((), dtype=torch.int64, device="cuda")
        setattr(record, AUDIT_TAG, True)
        return int(counter), int(record)

    report = audit(reads, real=False)
    assert report.result == (1, 0) and report.count == 2
