"""The patched ``update()`` of every audit-panel row launches no more kernels than the
release's (benchmarks/kernel_counts.py: every ATen op on simulated CUDA whose result lies on
the device or that reads a device tensor, ``.item()`` included, views, metadata and allocations left out, the second
update counted; the report's evidence is kept, not reduced, until compute()); and the counter
counts what launches on a GPU, every copy between host and device included."""
from __future__ import annotations

import importlib.util
import os

import pytest
import torch

import tmpatch

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def kernel_counts():
    path = os.path.join(os.path.dirname(HERE), "benchmarks", "kernel_counts.py")
    spec = importlib.util.spec_from_file_location("tmpatch_kernel_counts", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    yield module
    tmpatch.revert()


def test_no_panel_row_launches_more_kernels_than_the_release(kernel_counts):
    from tmpatch.audit.panel.rows import ROWS, _resolve

    over, counted = [], 0
    for row in ROWS:
        try:
            for name in row.requires:
                _resolve(name)
        except (ImportError, AttributeError):
            continue
        before, after = kernel_counts.count_row(row, False), kernel_counts.count_row(row, True)
        if before is None:  # the release itself fails on this row (1.6.x: samplewise top_k); so must tmpatch
            assert after is None, row.name
            continue
        assert after is not None, row.name
        counted += 1
        if sum(after.values()) > sum(before.values()):
            over.append((row.name, sum(before.values()), sum(after.values()), dict(after - before)))
    assert counted > 60
    assert over == [], over


@pytest.mark.parametrize("op, expected", [
    # the Python scalar becomes a 0-d tensor on the mask's device: a fill kernel, then where's
    (lambda x, mask: torch.where(mask, x, 0.0), {"aten.scalar_tensor": 1, "aten.where": 1}),
    (lambda x, mask: torch.full((), 1.0, device=x.device), {"aten.full": 1}),
    (lambda x, mask: x.to(torch.float64), {"aten._to_copy": 1}),
    (lambda x, mask: x.cpu(), {"aten._to_copy": 1}),  # a copy to the host: the device works too
    # a device value read into Python: the same copy to the host (and a wait, not counted)
    (lambda x, mask: x.sum().item(), {"aten.sum": 1, "aten._local_scalar_dense": 1}),
    (lambda x, mask: bool(mask.any()), {"aten.any": 1, "aten._local_scalar_dense": 1}),
    # an op that reads the device inside: its kernel and that copy
    (lambda x, mask: torch.bincount(mask.long()),
     {"aten._to_copy": 1, "aten.bincount": 1, "aten.bincount (its copies to or from the host)": 1}),
    (lambda x, mask: x[mask], {"aten.index": 1, "aten.index (its copies to or from the host)": 1}),
    # a Python scalar operand is wrapped on the host and passed to the kernel: one op
    (lambda x, mask: x + 1.0, {"aten.add": 1}),
    # views and allocations launch nothing
    (lambda x, mask: x.view(2, 4)[0].unsqueeze(0), {}),
    (lambda x, mask: torch.empty_like(x), {}),
])
def test_the_counter_counts_every_op_that_launches(kernel_counts, op, expected):
    from tmpatch.audit.oracle.sim import simulated_cuda

    with simulated_cuda() as sim:
        x = sim.put(torch.randn(8))
        mask = x > 0
        with kernel_counts._Kernels() as counter:
            op(x, mask)
    assert dict(counter.ops) == expected


def test_host_tensors_launch_nothing(kernel_counts):
    """The counter counts device work only: the same ``where`` on CPU tensors is no kernel."""
    x = torch.randn(8)
    with kernel_counts._Kernels() as counter:
        torch.where(x > 0, x, 0.0)
        x + 1.0
    assert dict(counter.ops) == {}
