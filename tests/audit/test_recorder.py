"""The oracle on small functions with known sync points, and known sync-free ones."""
import pytest
import torch

from tmpatch.audit import SyncKind, audit, classify
from tmpatch.deferred import AUDIT_TAG

from tests.audit.helpers import marked_line

READ, H2D, D2H = SyncKind.D2H_READ, SyncKind.H2D_COPY, SyncKind.D2H_COPY
DDS, MISMATCH = SyncKind.DATA_DEPENDENT_SHAPE, SyncKind.DEVICE_MISMATCH


def s_item(x):
    return x.sum().item()  # <- sync


def s_if_any(x):
    if x.any():  # <- sync
        return x
    return -x


def s_float(x):
    return float(x.sum())  # <- sync


def s_tensor_to(x):
    return x + torch.tensor(1.0).to("cuda")  # <- sync


def s_as_tensor(x):
    return x * torch.as_tensor(1.0, device="cuda")  # <- sync


def s_tensor_list(x):
    return torch.tensor([1.0, 2.0], device=x.device)  # <- sync


def s_bool_index(x):
    return x[x > 0]  # <- sync


def s_cpu(x):
    return x.cpu()  # <- sync


def s_to_cpu(x):
    return x.to("cpu")  # <- sync


def s_tolist(x):
    return x.tolist()  # <- sync


def s_nonzero(x):
    return torch.nonzero(x)  # <- sync


def s_where_one_arg(x):
    return torch.where(x > 0)  # <- sync


def s_bincount(x):
    return torch.bincount(x.long(), minlength=4)  # <- sync


def s_unique(x):
    return torch.unique(x)  # <- sync


def s_masked_select(x):
    return x.masked_select(x > 0)  # <- sync


def s_repeat_interleave(x):
    return torch.repeat_interleave(x, torch.ones(x.shape[0], dtype=torch.long, device=x.device))  # <- sync


def s_cuda(x):
    return torch.ones(3).cuda()  # <- sync


def s_copy_from_host(x):
    return x.copy_(torch.ones(x.shape))  # <- sync


def s_mask_assign_tensor(x):
    x[x > 0] = x.sum()  # <- sync
    return x


SYNCS = [
    (s_item, READ, "aten._local_scalar_dense"),
    (s_if_any, READ, "aten._local_scalar_dense"),
    (s_float, READ, "aten._local_scalar_dense"),
    (s_tensor_to, H2D, "aten._to_copy"),
    (s_as_tensor, H2D, "aten._to_copy"),
    (s_tensor_list, H2D, "aten._to_copy"),
    (s_bool_index, DDS, "aten.index"),
    (s_cpu, D2H, "aten._to_copy"),
    (s_to_cpu, D2H, "aten._to_copy"),
    (s_tolist, D2H, "aten._to_copy"),
    (s_nonzero, DDS, "aten.nonzero"),
    (s_where_one_arg, DDS, "aten.nonzero"),
    (s_bincount, DDS, "aten.bincount"),
    (s_unique, DDS, "aten._unique2"),
    (s_masked_select, DDS, "aten.masked_select"),
    (s_repeat_interleave, DDS, "aten.repeat_interleave"),
    (s_cuda, H2D, "aten._to_copy"),
    (s_copy_from_host, H2D, "aten.copy_"),
    (s_mask_assign_tensor, DDS, "aten.index_put_"),
]


@pytest.mark.parametrize("fn, kind, op", SYNCS, ids=[f.__name__ for f, _, _ in SYNCS])
def test_known_sync_is_reported_once_at_its_line(fn, kind, op):
    report = audit(fn, torch.randn(6))
    assert report.complete
    assert [(p.kind, p.op) for p in report.sync_points] == [(kind, op)], str(report)
    point = report.sync_points[0]
    assert point.location == f"{__file__}:{marked_line(fn)}"
    assert point.function == fn.__name__


def f_where(x):
    return torch.where(x > 0, x, torch.zeros_like(x))


def f_where_scalar(x):
    return torch.where(x > 0, x, 0.0)


def f_full(x):
    return x + torch.full((), 3.0, device="cuda")


def f_cpu_scalar_operand(x):
    return x * torch.tensor(2.0) + torch.tensor(1.0)


def f_ones_like(x):
    return torch.ones_like(x) + torch.zeros(3, device=x.device)[0]


def f_masked_fill(x):
    return x.masked_fill(x > 0, 1.0)


def f_mask_assign_scalar(x):
    x[x > 0] = 1.0
    return x


def f_mask_assign_cpu_scalar_tensor(x):
    x[torch.isnan(x)] = torch.tensor(0.0)
    return x


def f_basic_indexing(x):
    y = x.view(2, 3)
    y[0] = 1.0
    return y[:, 1] + y[1, 2] + x[torch.arange(3, device=x.device)].sum()


def f_repeat_interleave_sized(x):
    return torch.repeat_interleave(x, torch.ones(6, dtype=torch.long, device=x.device), output_size=6)


def f_same_device_moves(x):
    return x.to(x.device).float().to(torch.float64).cuda(x.device)


def f_host_only(x):
    t = torch.tensor([1.0, 2.0])
    return x.sum() + (t.sum().item() + float(t.max()))


FREE = [f_where, f_where_scalar, f_full, f_cpu_scalar_operand, f_ones_like, f_masked_fill, f_mask_assign_scalar,
        f_mask_assign_cpu_scalar_tensor, f_basic_indexing, f_repeat_interleave_sized, f_same_device_moves,
        f_host_only]


@pytest.mark.parametrize("fn", FREE, ids=[f.__name__ for f in FREE])
def test_sync_free_code_reports_nothing(fn):
    report = audit(fn, torch.randn(6))
    assert report.complete and report.count == 0, str(report)
    assert report.result_devices[0] == torch.device("cuda:0")


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
    assert [p.kind for p in report.sync_points] == [D2H, H2D, MISMATCH]
    assert report.sync_points[-1].op == "(return value)"


def cross_device(x):
    return x.to("cuda:0") * 2  # <- sync


def test_op_level_device_mismatch():
    report = audit(cross_device, torch.randn(4), device="cuda:1")
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
