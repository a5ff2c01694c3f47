"""tmpatch.deferred: a device-side record kept during update, reported at compute."""
from __future__ import annotations

import warnings

import pytest
import torch

from tmpatch import deferred
from torchmetrics import Metric

NEGATIVE = deferred.Record("negative")


class Clipped(Metric):
    """Sums values, clipping negatives to 0 and reporting them at compute()."""

    full_state_update = False

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.add_state("total", torch.tensor(0.0), dist_reduce_fx="sum")
        NEGATIVE.attach(self)

    def update(self, x: torch.Tensor) -> None:
        NEGATIVE.add(self, (x < 0).count_nonzero())
        self.total = self.total + x.clamp(min=0).sum()

    def compute(self) -> torch.Tensor:
        seen = NEGATIVE.take(self)
        if seen:
            warnings.warn(f"{seen:g} negative values clipped", UserWarning)
        return self.total


class ClippedFull(Clipped):
    full_state_update = True


def _reported(records):
    return [str(w.message) for w in records if "negative" in str(w.message)]


def test_attach_registers_a_private_summed_state():
    metric = Clipped()
    assert NEGATIVE.has(metric)
    assert NEGATIVE.name == "_tmpatch_negative"
    assert metric._reductions[NEGATIVE.name] is not None
    assert NEGATIVE.name not in metric.state_dict()
    NEGATIVE.attach(metric)  # idempotent
    assert list(metric._defaults).count(NEGATIVE.name) == 1
    assert not NEGATIVE.has(torch.nn.Linear(1, 1))


def test_take_reads_then_starts_afresh():
    metric = Clipped()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        metric.update(torch.tensor([-1.0, 2.0, -3.0]))
        assert _reported(seen) == []
        assert float(metric.compute()) == 2.0
        assert _reported(seen) == ["2 negative values clipped"]
        metric.update(torch.tensor([1.0]))
        metric.compute()
        assert len(_reported(seen)) == 1
        metric.update(torch.tensor([-1.0]))
        metric.reset()
        metric.update(torch.tensor([1.0]))
        metric.compute()
        assert len(_reported(seen)) == 1


@pytest.mark.parametrize("cls", [Clipped, ClippedFull])
def test_forward_keeps_the_record_for_compute(cls):
    metric = cls()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert float(metric(torch.tensor([-1.0, 4.0]))) == 4.0
        assert float(metric(torch.tensor([1.0]))) == 1.0
        assert _reported(seen) == []  # forward's internal compute reports nothing
        assert float(metric.compute()) == 5.0
        assert _reported(seen) == ["1 negative values clipped"]


def test_explicit_compute():
    metric = Clipped()
    assert deferred.explicit_compute(metric)
    metric._should_unsync = False  # what forward() sets around its compute()
    assert not deferred.explicit_compute(metric)
    metric.update(torch.tensor([-1.0]))
    assert NEGATIVE.take(metric) == 0.0
    metric._should_unsync = True
    assert NEGATIVE.take(metric) == 1.0


def test_take_named_copies():
    metric = Clipped()
    slots = NEGATIVE.slots(3)
    assert slots == ("_tmpatch_negative_0", "_tmpatch_negative_1", "_tmpatch_negative_2")
    for i, name in enumerate(slots):
        setattr(metric, name, torch.tensor(i))
    assert NEGATIVE.take(metric, slots) == 3.0
    assert [int(getattr(metric, name)) for name in slots] == [0, 0, 0]


def test_take_in_a_synced_compute_clears_the_local_copy():
    metric = Clipped()
    metric.update(torch.tensor([-1.0]))
    local = getattr(metric, NEGATIVE.name)
    metric._cache = {NEGATIVE.name: local, "total": metric.total}
    metric._is_synced = True
    setattr(metric, NEGATIVE.name, torch.tensor(5))  # the value summed over ranks
    assert NEGATIVE.take(metric) == 5.0
    metric.unsync()
    assert int(getattr(metric, NEGATIVE.name)) == 0


def test_fail_unsyncs_before_raising():
    metric = Clipped()
    metric.update(torch.tensor([2.0]))
    metric._cache = {name: getattr(metric, name) for name in metric._defaults}
    metric._is_synced = True
    metric.total = torch.tensor(100.0)  # synced
    with pytest.raises(ValueError, match="bad"):
        deferred.fail(metric, ValueError("bad"))
    assert not metric._is_synced
    assert float(metric.total) == 2.0
    with pytest.raises(ValueError):
        deferred.fail(Clipped(), ValueError("not synced"))


def test_record_moves_and_copies_with_the_metric():
    metric = Clipped().double()
    metric.update(torch.tensor([-1.0]))
    twin = metric.clone()
    assert NEGATIVE.take(twin) == 1.0
    assert NEGATIVE.take(metric) == 1.0


def test_update_is_sync_free():
    from tmpatch.audit import audit

    report = audit(Clipped().update, torch.tensor([-1.0, 2.0]))
    assert report.complete and report.count == 0, report
