"""What a simulated run knows of integer values (tmpatch/audit/oracle/bounds.py): unique's size."""
from __future__ import annotations

import pytest
import torch

from tmpatch.audit import simulated_cuda
from tmpatch.audit.oracle import bounds
from tmpatch.audit.oracle.bounds import distinct, get

pytestmark = pytest.mark.once  # torch's ops, not the torchmetrics release


def _unique(t: torch.Tensor) -> int:
    return len(torch.unique(t))


def test_unique_keeps_at_most_the_integers_of_a_known_range():
    with simulated_cuda():
        target = torch.randint(0, 10, (64,), device="cuda")
        assert get(target) == (0, 10) and _unique(target) == 10
        assert _unique(torch.randint(3, (64,), device="cuda")) == 3
        assert _unique(torch.randint(0, 100, (8,), device="cuda")) == 8  # never more than the elements
        labels = torch.randn(64, 7, device="cuda").argmax(dim=1)  # predicted classes
        assert get(labels) == (0, 7) and _unique(labels) == 7
        values, indices = torch.randn(64, 7, device="cuda").max(dim=1)
        assert get(indices) == (0, 7) and get(values) is None
        assert _unique(torch.arange(5, device="cuda").repeat(10)) == 5
        assert _unique(torch.zeros(9, dtype=torch.long, device="cuda")) == 1
        assert _unique(torch.randn(9, device="cuda") > 0) == 2  # booleans
        assert _unique(torch.empty(9, dtype=torch.long, device="cuda")) == 9  # no range known: every element


def test_host_data_gives_its_own_range():
    host = torch.tensor([3, 7, 3, 5])
    with simulated_cuda():
        moved = host.to("cuda")
        assert get(moved) == (3, 8)
        assert get(torch.tensor([1, 2, 2], device="cuda")) == (1, 3)
        assert distinct(moved.repeat(20)) == 5 and _unique(moved.repeat(20)) == 5  # the integers of [3, 8)


def test_selections_views_and_joins_keep_ranges_writes_widen_or_forget_them():
    with simulated_cuda():
        a = torch.randint(0, 4, (8,), device="cuda")
        b = torch.randint(10, 12, (8,), device="cuda")
        assert get(a.view(2, 4)) == (0, 4) and get(a[:3]) == (0, 4) and get(a.clone()) == (0, 4)
        assert get(a[a > 1]) == (0, 4) and get(a.float()) == (0, 4)
        assert get(torch.cat([a, b])) == (0, 12) and get(torch.where(a > 1, a, b)) == (0, 12)
        assert get(a.masked_fill(a > 2, 20)) == (0, 21)
        assert get(a + 1) is None  # arithmetic: new values
        view = a[2:4]
        view.fill_(50)  # a write through a view: the base's range widens
        assert get(a) == (0, 51)
        a.add_(1)  # an unknown write: forgotten
        assert get(a) is None and _unique(a) == 8
        c = torch.empty(6, dtype=torch.long, device="cuda")
        c.fill_(2)  # the whole storage written: its range is the value's
        assert get(c) == (2, 3)
        c[:2].copy_(b[:2])
        assert get(c) == (2, 12)
        assert get(a.to(torch.uint8)) is None and get(b.to(torch.int8)) == (10, 12)  # a cast that may not fit
    assert not bounds._RANGES  # forgotten with the simulation
