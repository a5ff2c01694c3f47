"""tmpatch.runtime.deferred without a compute(): reports from a later update (landing.py,
updates.py) and where a metric or the process goes (endings.py).

A toy Metric (``Clipped``: sums values, clips negatives and counts them through a toy Record)
with the ``deferred_reports`` patch applied, whose edit of ``Metric._wrap_update`` calls the
update hook. On the CPU the evidence is read at once; ``device_timing`` plays a GPU's timing
(flights whose copies land when the test says), ``held_reports`` one whose copies never land.
"""
from __future__ import annotations

import copy
import gc
import logging
import os
import pickle
import warnings

import pytest
import torch
from torchmetrics import Metric

import tmpatch
from tests.conftest import run_python
from tmpatch.runtime import deferred
from tmpatch.runtime.deferred import landing

REPORTS = []


def _reporter(top, found, all_ranks):
    REPORTS.append((type(top).__name__, [count for _, count in found], deferred.point()))
    total = sum(count for _, count in found)
    if getattr(top, "strict", False):
        raise ValueError(f"{total} negative values in {type(top).__name__} (reported at {deferred.point()})")
    warnings.warn(f"{total} negative values clipped in {type(top).__name__} (reported at {deferred.point()})",
                  UserWarning, stacklevel=1)


LANDED = deferred.Record("toy_landed", _reporter)


class Clipped(Metric):
    """Sums values, clipping negatives to 0 and counting them in its book (``strict``: an error)."""

    full_state_update = False

    def __init__(self, strict: bool = False, **kwargs) -> None:
        super().__init__(**kwargs)
        self.strict = strict
        self.add_state("total", torch.tensor(0.0), dist_reduce_fx="sum")

    def update(self, x: torch.Tensor) -> None:
        LANDED.note(self, x < 0, deferred.SUM)
        self.total = self.total + x.clamp(min=0).sum()

    def compute(self) -> torch.Tensor:
        return self.total


@pytest.fixture(autouse=True)
def _applied():
    del REPORTS[:]
    assert tmpatch.apply("deferred_reports").states()["deferred_reports"] == "applied"
    yield
    del REPORTS[:]


GOOD, BAD = torch.tensor([1.0, 2.0]), torch.tensor([-1.0, 2.0, -3.0])


# -- on the CPU: at once --------------------------------------------------------------------------
def test_on_the_cpu_the_update_that_saw_it_reports_it_once():
    metric = Clipped()
    metric.update(GOOD)
    with pytest.warns(UserWarning, match=r"^2 negative values clipped in Clipped \(reported at update\(\) #2\)$"):
        metric.update(BAD)
    assert float(metric.total) == 5.0  # the batch is in the states
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        metric.update(GOOD)
        metric.compute()
    assert REPORTS == [("Clipped", [2], "update() #2")]


def test_on_the_cpu_an_error_comes_from_the_update_that_saw_it_and_not_again():
    metric = Clipped(strict=True)
    with pytest.raises(ValueError, match=r"forward\(\) #1"):
        metric(BAD)
    metric.compute()
    metric.reset()
    assert len(REPORTS) == 1


def test_a_book_with_nothing_left_is_no_longer_watched():
    metric = Clipped()
    with pytest.warns(UserWarning):
        metric.update(BAD)
    assert deferred.book_of(metric) not in landing.WATCH.books


# -- a GPU's timing: a flight every LANDING entries, reported once its copy lands ------------------
def test_a_flight_leaves_after_landing_entries_and_reports_at_the_first_update_after_it_lands(device_timing):
    metric = Clipped()
    for step in range(1, landing.LANDING):  # step 3 bad: noted, not yet sent
        metric.update(BAD if step == 3 else GOOD)
    assert device_timing.events == [] and REPORTS == []
    metric.update(GOOD)  # the LANDING-th entry: the flight leaves, nothing waits for it
    assert len(device_timing.events) == 1 and deferred.book_of(metric).flight is not None
    metric.update(GOOD)  # not landed yet: nothing
    assert REPORTS == []
    device_timing.land()
    with pytest.warns(UserWarning, match=r"reported at update\(\) #18 \(the first of them came from update #3\)"):
        metric.update(GOOD)
    assert REPORTS == [("Clipped", [2], "update() #18 (the first of them came from update #3)")]
    metric.compute()
    assert len(REPORTS) == 1


def test_an_error_is_raised_from_the_first_forward_after_landing_naming_its_step(device_timing):
    metric = Clipped(strict=True)
    for step in range(1, landing.LANDING + 1):
        metric(BAD if step in (5, 9) else GOOD)
    device_timing.land()
    with pytest.raises(ValueError, match=r"4 negative values in Clipped \(reported at forward\(\) #17 "
                                         r"\(the first of them came from update #5\)\)"):
        metric(GOOD)
    assert float(metric.total) == 15 * 3.0 + 2 * 2.0  # every batch counted, the last one included
    metric(GOOD)
    metric.compute()
    assert len(REPORTS) == 1


def test_a_flight_of_batches_of_several_sizes_counts_each_update(device_timing):
    metric = Clipped()
    batches = [torch.tensor([1.0, 2.0]), torch.tensor([1.0, -2.0, -3.0]), torch.tensor([-4.0])] * 6
    for batch in batches[:landing.LANDING]:
        metric.update(batch)
    device_timing.land()
    with pytest.warns(UserWarning, match=r"^15 negative values clipped in Clipped \(reported at update\(\) #17 "
                                         r"\(the first of them came from update #2\)\)$"):
        metric.update(GOOD)  # 5 updates of 2 and 5 of 1 negative value, in three groups of entries


def test_a_settle_point_before_the_copy_lands_reads_the_flight_once(device_timing):
    metric = Clipped()
    for step in range(1, landing.LANDING + 3):
        metric.update(BAD if step in (2, landing.LANDING + 1) else GOOD)
    with pytest.warns(UserWarning, match=r"^4 negative values clipped in Clipped \(reported at compute\(\) "
                                         r"\(the first of them came from update #2\)\)$"):
        metric.compute()
    device_timing.land()
    metric.update(GOOD)
    metric.compute()
    assert len(REPORTS) == 1


def test_a_landed_flight_is_reported_at_compute_without_a_read(device_timing):
    metric = Clipped()
    for step in range(landing.LANDING):
        metric.update(BAD if step == 0 else GOOD)
    device_timing.land()
    with pytest.warns(UserWarning, match="^2 negative"):
        metric.compute()
    assert deferred.book_of(metric).flight is None


def test_a_flight_in_the_air_counts_in_the_records_a_sync_sums(device_timing):
    metric = Clipped()
    for step in range(landing.LANDING + 1):
        metric.update(BAD if step in (0, landing.LANDING) else GOOD)
    records = deferred.local_records(metric)
    assert int(records["toy_landed"]) == 4 and deferred.book_of(metric).flight is None


def test_copies_made_while_a_flight_is_in_the_air_carry_nothing(device_timing):
    metric = Clipped()
    for step in range(landing.LANDING):
        metric.update(BAD if step == 0 else GOOD)
    with pytest.warns(UserWarning, match="reported at pickling"):
        twin = pickle.loads(pickle.dumps(metric))
    device_timing.land()
    for each in (metric, twin, copy.deepcopy(metric)):
        each.update(GOOD)
        each.compute()
    assert len(REPORTS) == 1


def test_revert_keeps_a_flight_in_the_air_for_the_next_compute(device_timing):
    metric = Clipped()
    for step in range(landing.LANDING):
        metric.update(BAD if step == 1 else GOOD)
    assert deferred.book_of(metric).flight is not None
    tmpatch.revert()
    device_timing.land()
    metric.update(GOOD)  # the release's update: no hook
    assert REPORTS == []
    with pytest.warns(UserWarning, match=r"reported at compute\(\) \(the first of them came from update #2\)"):
        metric.compute()
    metric.compute()
    assert len(REPORTS) == 1


def test_a_flight_on_simulated_cuda_adds_no_sync_and_copies_without_blocking():
    from tmpatch.audit import audit

    metric = Clipped()

    def steps(x):
        for _ in range(landing.LANDING + 2):
            metric.update(x)
        return x

    report = audit(steps, torch.tensor([-1.0, 2.0]))
    assert report.complete and report.count == 0, report
    copies = report.of_kind("non-blocking copy (pinned memory)")
    assert len(copies) == 1 and copies[0].function == "_to_host", report


# -- where nothing can raise -------------------------------------------------------------------------
def _told(caplog):
    return [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "tmpatch"]


@pytest.mark.parametrize("strict, level", [(True, "ERROR"), (False, "WARNING")])
def test_a_metric_collected_with_a_pending_report_logs_it_once(held_reports, caplog, strict, level):
    metric = Clipped(strict=strict)
    metric.update(GOOD)
    metric.update(BAD)
    metric.update(BAD)
    with caplog.at_level(logging.WARNING, logger="tmpatch"):
        del metric
        gc.collect()
    (found,) = _told(caplog)
    assert found[0] == level
    assert "4 negative values" in found[1] and "Clipped" in found[1]
    assert "the garbage collection of the metric (the first of them came from update #2)" in found[1]


def test_a_collected_metric_reaches_stderr_when_no_handler_writes_there(held_reports, capfd):
    logger = logging.getLogger("tmpatch")
    handlers, propagate = logger.handlers[:], logger.propagate
    logger.handlers, logger.propagate = [logging.NullHandler()], False
    try:
        metric = Clipped(strict=True)
        metric.update(BAD)
        del metric
        gc.collect()
    finally:
        logger.handlers, logger.propagate = handlers, propagate
    err = capfd.readouterr().err
    assert err.count("tmpatch: ValueError: 2 negative values in Clipped") == 1, err


def _dispatch_mode():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Watching(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    return Watching()


def _compile_tracing():
    from torch._guards import TracingContext, tracing
    from torch._subclasses.fake_tensor import FakeTensorMode

    return tracing(TracingContext(FakeTensorMode()))


def _no_dispatch():
    from torch.utils._mode_utils import no_dispatch

    return no_dispatch()


@pytest.mark.parametrize("inside", [_dispatch_mode, _compile_tracing, _no_dispatch],
                         ids=["a dispatch mode", "torch.compile tracing", "no_dispatch"])
def test_a_metric_collected_where_nothing_can_be_read_reports_at_the_next_update(held_reports, caplog, inside):
    """Collected inside a dispatch mode, or in the middle of a trace (no mode on the stack, the dispatch
    half set up: an op there gave garbage counts and left the trace broken): nothing is read there."""
    metric = Clipped(strict=True)
    metric.update(BAD)
    with caplog.at_level(logging.WARNING, logger="tmpatch"):
        with inside():
            del metric
            gc.collect()
        assert _told(caplog) == [] and landing.WATCH.orphans
        Clipped().update(GOOD)  # any metric's update adopts it
    told = _told(caplog)
    assert len(told) == 1 and "2 negative values in Clipped" in told[0][1] and not landing.WATCH.orphans

CHILD = """
import gc, os, sys, warnings
import torch, tmpatch
tmpatch.apply("deferred_reports")
from tmpatch.runtime import deferred
from tmpatch.runtime.deferred import landing
from tests.runtime.test_deferred_landing import Clipped
landing.read_at_once = lambda tensor: False  # a GPU whose copy has not landed
landing.new_event = lambda device: landing.NEVER
"""


@pytest.mark.processes
def test_a_report_pending_at_exit_is_logged_once_and_the_exit_status_kept():
    proc = run_python(CHILD + """
kept = Clipped(strict=True)
kept.update(torch.tensor([-1.0, 5.0]))
kept.update(torch.tensor([1.0]))
print("done")
""", timeout=120)
    assert proc.stdout.strip() == "done"
    assert proc.stderr.count("ValueError: 1 negative values in Clipped") == 1, proc.stderr
    assert "the exit of process" in proc.stderr and "the first of them came from update #1" in proc.stderr


@pytest.mark.processes
@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork")
def test_a_forked_child_reports_its_own_updates_only():
    proc = run_python(CHILD + """
metric = Clipped()
metric.update(torch.tensor([-1.0]))  # the parent's: pending at the fork
pid = os.fork()
if pid == 0:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        metric.compute()  # nothing: the parent's report is the parent's
        metric.update(torch.tensor([-2.0, -3.0]))
        metric.compute()
    print("child", [str(w.message)[:2] for w in seen], flush=True)
    sys.stdout.flush()
    os._exit(0)
os.waitpid(pid, 0)
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    metric.compute()
print("parent", [str(w.message)[:2] for w in seen], flush=True)
""", timeout=120)
    assert proc.stdout.split("\n")[:2] == ["child ['2 ']", "parent ['1 ']"], proc.stdout


@pytest.mark.processes
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_multiprocessing_child_reports_what_it_holds_when_it_ends(method, tmp_path):
    if method == "fork" and not hasattr(os, "fork"):
        pytest.skip("os.fork")
    module = tmp_path / "landing_child.py"
    module.write_text(CHILD + """
metric = Clipped(strict=True)  # built at import: in the parent (fork), in the child (spawn: unpickling)


def work():
    metric.update(torch.tensor([-1.0, -2.0]))  # pending (alive) until the process ends
""")
    proc = run_python(f"""
import multiprocessing, sys
sys.path.insert(0, {str(tmp_path)!r})
import landing_child
if __name__ == "__main__":
    process = multiprocessing.get_context({method!r}).Process(target=landing_child.work)
    process.start()
    process.join(60)
    print("exit", process.exitcode)
""", timeout=120)
    assert proc.stdout.strip() == "exit 0", (proc.stdout, proc.stderr)
    # the child's finalizers or, where its exit runs them first (spawn on Python 3.13), its atexit hooks: once
    assert sum(proc.stderr.count(f"ValueError: 2 negative values in Clipped (reported at the {end} of process")
               for end in ("end", "exit")) == 1, proc.stderr
