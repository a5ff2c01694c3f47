"""The probe table (tmpatch.audit.calibrate.probes): each event reported with its kind, at a line of its
probe, on every torch of the matrix; non-syncs apart; sync-free probes report nothing."""
import inspect

import pytest
import torch

from tmpatch.audit import SyncKind, audit
from tmpatch.audit.calibrate import probe_fns, probes
from tmpatch.audit.calibrate.probes import PROBE_NAMES, PROBES, Probe, find_probe

pytestmark = pytest.mark.once  # nothing here depends on the torchmetrics release


def _lines(fn):
    source, start = inspect.getsourcelines(fn)
    return range(start, start + len(source))


@pytest.mark.parametrize("probe", PROBES, ids=PROBE_NAMES)
def test_probe_verdict(probe: Probe):
    report = audit(probe.fn, *probe.make(), real=False)
    assert [p.kind for p in report.sync_points] == list(probe.syncs), str(report)
    assert [p.kind for p in report.non_syncs] == list(probe.others), str(report)
    assert report.count == len(probe.syncs)
    assert (report.error is not None) is (probe.raises is not None), str(report)
    if probe.raises is not None:
        assert isinstance(report.error, probe.raises)
    lines = _lines(probe.fn)
    for point in report.points:
        if point.op == "(return value)":
            continue
        path, line = point.location.rsplit(":", 1)
        assert path == inspect.getsourcefile(probe.fn) and int(line) in lines, str(point)
        assert point.function == probe.name


def test_the_table_covers_every_kind_and_both_verdicts():
    kinds = {k for p in PROBES for k in p.syncs + p.others}
    assert kinds == set(SyncKind)
    assert sum(not p.syncs for p in PROBES) >= 10 and sum(bool(p.syncs) for p in PROBES) >= 30
    assert len(set(PROBE_NAMES)) == len(PROBES)
    with pytest.raises(KeyError):
        find_probe("no such probe")


def test_formatting_is_counted_not_raised():
    report = audit(find_probe("fstring_spec").fn, torch.randn(6), real=False)
    assert report.complete and report.result == "loss 1.000"  # the plausible value, formatted
    report = audit(find_probe("print_tensor").fn, torch.randn(6), real=False)
    assert "device='cuda:0'" in report.result


def test_a_format_spec_on_a_vector_raises_as_on_a_gpu():
    def spec_on_vector(x):
        return f"{x:.3f}"

    with pytest.raises(TypeError):
        audit(spec_on_vector, torch.randn(3), real=False)


def test_torch_tensor_of_cuda_values_reads_each_one():
    report = audit(find_probe("tensor_of_cuda_values").fn, torch.randn(6), real=False)
    assert report.result.device.type == "cpu" and report.result.shape == (2,)
    assert all("read to build a tensor" in p.detail for p in report.sync_points)


def test_pinned_copies_say_so():
    (point,) = audit(find_probe("nonblocking_to_cpu").fn, torch.randn(6), real=False).non_syncs
    assert point.kind is SyncKind.PINNED_COPY and "pinned cpu" in point.detail
    (sync,) = audit(find_probe("nonblocking_into_pageable").fn, torch.randn(6), real=False).sync_points
    assert "pageable" in sync.detail
    assert find_probe("nonblocking_into_pageable").expected_real is False
    assert find_probe("item").expected_real is True and find_probe("where_scalar").expected_real is False


@pytest.mark.skipif(probes.LIST_INDEX_SIMULATED, reason="this torch simulates a list index")
def test_a_list_index_stops_the_simulation_on_an_older_cuda_build():
    """Left out of the table there (docs/guide/install.rst, limits): torch makes the index on the device itself."""
    with pytest.raises(RuntimeError):
        audit(probe_fns.list_index, probe_fns.vector(), real=False)
