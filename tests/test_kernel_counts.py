"""The patched ``update()`` of every audit-panel row launches no more kernels than the
release's (benchmarks/kernel_counts.py: ATen ops on simulated CUDA, views, wrapped scalars
and allocations left out, the second update counted; the report's evidence is kept, not
reduced, until compute())."""
from __future__ import annotations

import importlib.util
import os

import pytest

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
    from tmpatch.audit.panel.rows import ROWS
    from tmpatch.audit.panel.rows import _resolve

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
