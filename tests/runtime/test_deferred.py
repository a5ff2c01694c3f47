"""tmpatch.runtime.deferred: books kept outside the metric, reported once at the user's compute().

A toy Metric (``Clipped``: sums values, clips negatives and counts them through a toy
Record) and a toy reporter that records what it is told. The first group of tests uses
the module's functions directly; the second applies ``deferred_reports``, which puts the
book rules in place (a book for each metric built while applied, a report after the
user's compute, nothing inside forward()).
"""
from __future__ import annotations

import copy
import gc
import logging
import pickle
import threading
import warnings

import pytest
import torch
from torchmetrics import Metric

import tmpatch
from tmpatch.runtime import deferred
from tmpatch.runtime.deferred import books

#: reports wait for a settle point here, as on a GPU before the evidence's copy lands (the reports
#: that come at a later update, or where a metric or process goes: test_deferred_landing.py)
pytestmark = pytest.mark.usefixtures("held_reports")

REPORTS = []


def _reporter(top, found, all_ranks):
    REPORTS.append((top, [(metric, count) for metric, count in found], all_ranks))
    total = sum(count for _, count in found)
    if total >= 100:
        raise ValueError(f"{total} negative values")
    warnings.warn(f"{total} negative values clipped", UserWarning, stacklevel=1)


TOY = deferred.Record("toy", _reporter)


def _other(top, found, all_ranks):
    REPORTS.append(("other", [count for _, count in found], all_ranks))
    warnings.warn("other record", UserWarning, stacklevel=1)


OTHER = deferred.Record("toy_other", _other)


class Clipped(Metric):
    """Sums values, clipping negatives to 0 and counting them in its book."""

    full_state_update = False

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.add_state("total", torch.tensor(0.0), dist_reduce_fx="sum")

    def update(self, x: torch.Tensor) -> None:
        TOY.add(self, (x < 0).sum())
        self.total = self.total + x.clamp(min=0).sum()

    def compute(self) -> torch.Tensor:
        return self.total


class ClippedFull(Clipped):
    full_state_update = True


class Pair(Metric):
    """A metric holding two others (as wrappers do)."""

    full_state_update = False

    def __init__(self) -> None:
        super().__init__()
        self.left, self.right = Clipped(), Clipped()

    def update(self, x: torch.Tensor) -> None:
        self.left.update(x)
        self.right.update(-x)

    def compute(self) -> torch.Tensor:
        return self.left.compute() + self.right.compute()


@pytest.fixture(autouse=True)
def _clean():
    del REPORTS[:]
    yield
    del REPORTS[:]


def _counts():
    return [[count for _, count in found] for _, found, _ in REPORTS if _ != "other"]


def _booked(metric):
    """Give ``metric`` (and the metrics inside it) a book by hand (without the patch)."""
    for module in metric.modules():
        deferred.open_book(module)
    return metric


# -- marked updates (deferred.marking) -----------------------------------------------------
def test_a_marker_marks_the_update_of_a_booked_metric_only_and_unmarks_after_an_exception():
    from tmpatch.runtime.deferred.marking import Marker

    seen = []
    mark = Marker("tmpatch_toy_mark", TOY, make=lambda metric: ("made", metric))

    def release_update(self, x, fail=False):
        seen.append(mark.get())
        if fail:
            raise ValueError("the release raised")
        return x

    update = mark.build_update(None)
    plain, booked = Clipped(), _booked(Clipped())
    assert update(release_update, plain, 1) == 1 and seen == [None]
    assert update(release_update, booked, 2) == 2 and seen[-1] == ("made", booked)
    with pytest.raises(ValueError, match="the release raised"):
        update(release_update, booked, 3, fail=True)
    assert seen[-1] == ("made", booked) and mark.get() is None


# -- books ------------------------------------------------------------------------------
def test_a_book_is_opened_once_and_goes_with_its_metric():
    metric = Clipped()
    assert deferred.book_of(metric) is None and not TOY.deferred(metric)
    book = deferred.open_book(metric)
    assert deferred.open_book(metric) is book and deferred.book_of(metric) is book and TOY.deferred(metric)
    key = id(metric)
    del metric
    gc.collect()
    assert key not in books._books


def test_a_book_answers_only_for_its_own_metric():
    metric, other = Clipped(), Clipped()
    book = deferred.Book(other)
    books._books[id(metric)] = book  # a stale entry under a reused id
    try:
        assert deferred.book_of(metric) is None
    finally:
        del books._books[id(metric)]


def test_add_without_a_book_adds_nothing_and_reads_nothing():
    metric = Clipped()
    assert TOY.add(metric, torch.tensor(3)) is False
    assert deferred.local_records(metric) == {}


def test_add_accumulates_long_counts_on_the_device():
    metric = _booked(Clipped())
    assert TOY.add(metric, torch.tensor(True)) and TOY.add(metric, torch.tensor(2, dtype=torch.int32))
    count = deferred.local_records(metric)["toy"]
    assert count.dtype == torch.int64 and int(count) == 3
    assert deferred.local_records(metric) is not deferred.book_of(metric).counts  # a copy


def test_add_makes_no_sync_on_simulated_cuda():
    from tmpatch.audit import audit

    metric = _booked(Clipped())

    def add(x):
        TOY.add(metric, (x < 0).sum())
        TOY.add(metric, torch.isnan(x).any())
        return x

    report = audit(add, torch.tensor([-1.0, 2.0]))
    assert report.complete and report.count == 0, report


# -- settle: the report -------------------------------------------------------------------
def test_settle_reports_once_then_starts_afresh():
    metric = _booked(Clipped())
    metric.update(torch.tensor([-1.0, 2.0, -3.0]))
    metric.update(torch.tensor([-1.0]))
    with pytest.warns(UserWarning, match="^3 negative values clipped$"):
        deferred.settle(metric)
    assert REPORTS == [(metric, [(metric, 3)], False)]
    deferred.settle(metric)  # nothing pending: no reporter call
    metric.update(torch.tensor([1.0]))
    deferred.settle(metric)  # a zero count is no report
    assert len(REPORTS) == 1 and deferred.book_of(metric).counts == {}


def test_settle_covers_the_metrics_inside_in_one_report():
    pair = _booked(Pair())
    pair.update(torch.tensor([-1.0, 2.0, 3.0]))  # left sees 1 negative, right 2
    with pytest.warns(UserWarning, match="^3 negative"):
        deferred.settle(pair)
    (top, found, _), = REPORTS
    assert top is pair and found == [(pair.left, 1), (pair.right, 2)]
    assert deferred.books_in(pair) == [deferred.book_of(m) for m in (pair, pair.left, pair.right)]
    pair.update(torch.tensor([1.0]))
    with pytest.warns(UserWarning, match="^1 negative"):
        deferred.settle(pair.right)  # an inner metric alone: its own book only
    assert REPORTS[-1][1] == [(pair.right, 1)]


def test_settle_reads_the_device_once_for_every_book():
    from tmpatch.audit import audit

    pair = _booked(Pair())

    def update_and_settle(x):
        pair.update(x)  # counts on the (simulated) CUDA device, in three books
        OTHER.add(pair.left, (x > 0).sum())
        deferred.settle(pair)
        return x

    report = audit(update_and_settle, torch.tensor([-1.0, 2.0]))
    assert report.count == 1, report  # the audit reads a record as 0: nothing is reported there
    assert report.sync_points[0].function == "read" and REPORTS == []  # landing.read, called by settle


def test_errors_come_after_every_warning_and_nothing_stays_pending():
    metric = _booked(Clipped())
    metric.update(-torch.ones(100))
    OTHER.add(metric, torch.tensor(1))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with pytest.raises(ValueError, match="100 negative values"):
            deferred.settle(metric)
    assert [str(w.message) for w in seen] == ["other record"]
    assert deferred.book_of(metric).counts == {}
    deferred.settle(metric)
    assert len(REPORTS) == 2


def test_two_errors_at_one_compute_are_raised_together():
    def fail(top, found, all_ranks):
        raise RuntimeError("second record failed")

    failing = deferred.Record("toy_failing", fail)
    metric = _booked(Clipped())
    metric.update(-torch.ones(100))
    failing.add(metric, torch.tensor(1))
    with pytest.raises(ValueError) as raised:
        deferred.settle(metric)
    assert str(raised.value) == "100 negative values\nAlso: second record failed"
    del books._records["toy_failing"]


def test_a_count_that_cannot_be_read_is_logged_and_dropped(caplog):
    metric = _booked(Clipped())
    TOY.add(metric, torch.empty((), dtype=torch.int64, device="meta"))  # no value to read
    with caplog.at_level(logging.ERROR, logger="tmpatch"):
        deferred.settle(metric)  # never breaks the user's compute
    assert "could not read the deferred reports of Clipped" in caplog.text
    assert REPORTS == [] and deferred.book_of(metric).counts == {}


def test_a_count_of_an_unknown_record_is_dropped():
    metric = _booked(Clipped())
    deferred.book_of(metric).counts["no_such_record"] = torch.tensor(4)
    deferred.settle(metric)
    assert REPORTS == [] and deferred.book_of(metric).counts == {}


def test_totals_of_a_sync_replace_the_local_counts_until_the_next_compute():
    metric = _booked(Clipped())
    metric.update(torch.tensor([-1.0]))
    deferred.set_synced(metric, {"toy": torch.tensor(5)})  # what a coalesced sync would give
    with pytest.warns(UserWarning, match="^5 negative"):
        deferred.settle(metric)
    assert REPORTS[-1][2] is True  # all ranks
    metric.update(torch.tensor([-1.0]))
    deferred.set_synced(metric, {"toy": torch.tensor(7)})  # a forward's sync ...
    deferred.start_compute(metric)  # ... forgotten when the user's compute starts
    with pytest.warns(UserWarning, match="^1 negative"):
        deferred.settle(metric)
    assert REPORTS[-1][2] is False


def test_clear_forgets_the_books_inside():
    pair = _booked(Pair())
    pair.update(torch.tensor([-1.0, 1.0]))
    deferred.clear(pair)
    deferred.settle(pair)
    assert REPORTS == [] and all(not book.counts for book in deferred.books_in(pair))


class _Ops(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the ATen ops run inside it that compute something (views and metadata left out)."""

    VIEWS = frozenset({"aten.view", "aten._unsafe_view", "aten.reshape", "aten.alias", "aten.expand", "aten.select",
                       "aten.slice", "aten.detach", "aten.lift_fresh", "aten.unsqueeze", "aten.squeeze"})

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if str(func.overloadpacket) not in self.VIEWS:
            self.count += 1
        return func(*args, **(kwargs or {}))


def test_an_update_keeps_its_evidence_and_runs_nothing_for_it():
    """An update's report costs no op: the tensor is kept, counted when the book is gathered."""
    metric = _booked(Clipped())
    x = torch.tensor([-1.0, 2.0, -3.0])
    negative, count, codes = x < 0, (x < 0).sum(), torch.tensor([0, 5, -1, 3])
    with _Ops() as ops:
        TOY.add(metric, count)
        TOY.note(metric, negative, deferred.ANY)
        TOY.note(metric, codes, deferred.outside(0, 4))
        TOY.note(metric, negative, deferred.FALSE, -1)
    assert ops.count == 0
    book = deferred.book_of(metric)
    assert book.counts == {} and len(book.pending) == 4 and book.marked
    assert int(deferred.local_records(metric)["toy"]) == 2 + 1 + 2 - 1
    assert book.pending == [] and book.pinned == 0


def test_evidence_of_many_updates_is_counted_together_and_exactly():
    metric = _booked(Clipped())
    masks = [torch.rand(5, generator=torch.Generator().manual_seed(i)) < 0.3 for i in range(10)]
    codes = [torch.randint(-3, 9, (7,), generator=torch.Generator().manual_seed(i)) for i in range(10)]
    for mask, code in zip(masks, codes):
        TOY.note(metric, mask, deferred.ANY)
        TOY.note(metric, code.int() if len(code) % 2 else code, deferred.outside(0, 6))
        TOY.note(metric, mask, deferred.SUM, -1)
    expected = (sum(bool(m.any()) for m in masks) + sum(int(((c < 0) | (c >= 6)).sum()) for c in codes)
                - sum(int(m.sum()) for m in masks))
    with _Ops() as ops:
        assert int(deferred.local_records(metric)["toy"]) == expected
    assert ops.count <= 16  # a few reductions for the thirty entries, not one per entry


def test_a_book_folds_when_it_holds_too_many_entries_or_bytes(monkeypatch):
    metric = _booked(Clipped())
    book = deferred.book_of(metric)
    monkeypatch.setattr(books, "PENDING_ENTRIES", 3)
    for _ in range(3):
        TOY.add(metric, torch.tensor(1))
    assert book.pending == [] and int(book.counts["toy"]) == 3
    monkeypatch.setattr(books, "PENDING_BYTES", 64)
    TOY.note(metric, torch.zeros(100, dtype=torch.bool), deferred.ANY)  # 100 bytes kept: folded at once
    assert book.pending == [] and int(book.counts["toy"]) == 3


def test_a_report_from_kept_evidence_comes_at_compute_and_once():
    metric = Clipped()
    deferred.open_book(metric)
    with pytest.warns(UserWarning, match="^3 negative"):
        for value in ([-1.0, 2.0], [-2.0, -3.0]):
            metric.update(torch.tensor(value))
        deferred.settle(metric)
    deferred.settle(metric)
    assert _counts() == [[3]]


@pytest.mark.parametrize("before, added, kept", [(None, 2, 1), (None, 6, 3), (1, 2, 2), (3, 4, 5), (None, 1, 1)])
def test_count_once_keeps_one_of_two_identical_updates(before, added, kept):
    metric = _booked(Clipped())
    book = deferred.book_of(metric)
    if before is not None:
        book.counts["toy"] = torch.tensor(before)
    snapshot = dict(book.counts)
    TOY.add(metric, torch.tensor(added))
    deferred.count_once(book, snapshot)
    assert int(book.counts["toy"]) == kept


def test_count_once_leaves_untouched_counts_alone():
    metric = _booked(Clipped())
    book = deferred.book_of(metric)
    TOY.add(metric, torch.tensor(3))
    deferred.books_in(metric)  # as forward() takes its snapshot: what earlier updates left, gathered
    deferred.count_once(book, dict(book.counts))
    assert int(book.counts["toy"]) == 3


def test_scope_marks_torchmetrics_own_calls_per_thread():
    assert not deferred.internal()
    with deferred.scope():
        with deferred.scope():
            assert deferred.internal()
        assert deferred.internal()
        seen = []
        thread = threading.Thread(target=lambda: seen.append(deferred.internal()))
        thread.start()
        thread.join()
        assert seen == [False]
    assert not deferred.internal()


def test_pending_books_lists_metrics_with_something_pending():
    quiet, loud = _booked(Clipped()), _booked(Clipped())
    loud.update(torch.tensor([1.0]))  # a count of 0 is pending too (it is not read before compute)
    pending = [metric for metric, _ in deferred.pending_books()]
    assert any(m is loud for m in pending) and not any(m is quiet for m in pending)
    deferred.clear(loud)


# -- detach: what revert() leaves with a metric ------------------------------------------
def test_detach_keeps_the_report_and_a_later_update_keeps_it():
    metric = _booked(Clipped())
    metric.update(torch.tensor([-1.0]))
    deferred.detach(metric, deferred.book_of(metric))
    assert getattr(vars(metric)["update"], "_tmpatch_watch", False)
    metric.update(torch.tensor([-2.0]))
    with pytest.warns(UserWarning, match="^2 negative"):
        deferred.settle(metric)
    metric.update(torch.tensor([1.0]))  # nothing left to watch: the metric's own update again
    assert not getattr(vars(metric)["update"], "_tmpatch_watch", False)


def test_detach_sees_a_reset_by_the_update_count():
    metric = _booked(Clipped())
    metric.update(torch.tensor([-1.0]))
    metric.update(torch.tensor([-1.0]))
    deferred.detach(metric, deferred.book_of(metric))
    metric.reset()  # the reset layer is gone after revert(): the count tells
    deferred.settle(metric)
    assert REPORTS == []
    metric.update(torch.tensor([-1.0]))
    deferred.detach(metric, deferred.book_of(metric))
    metric.reset()
    metric.update(torch.tensor([-5.0, -5.0]))  # the watcher sees the count go down before the update
    assert int(deferred.local_records(metric)["toy"]) == 2  # this update's count alone


@pytest.mark.parametrize("cls", [Clipped, ClippedFull])
def test_detach_tells_forwards_own_reset_from_the_users(cls):
    """After revert() forward() resets the metric for itself (the count drops, then comes
    back): the pending report stays. A reset by the user before the forward clears it."""
    metric = _booked(cls())
    metric.update(torch.tensor([-1.0]))
    metric.update(torch.tensor([2.0]))
    deferred.detach(metric, deferred.book_of(metric))
    assert float(metric(torch.tensor([3.0]))) == 3.0
    assert float(metric(torch.tensor([4.0]))) == 4.0
    with pytest.warns(UserWarning, match="^1 negative"):
        deferred.settle(metric)
    metric.update(torch.tensor([-1.0]))
    deferred.detach(metric, deferred.book_of(metric))
    metric.reset()
    metric(torch.tensor([5.0]))
    deferred.settle(metric)
    assert len(REPORTS) == 1


def test_a_watched_metric_pickles_copies_and_clones_without_tmpatch():
    metric = _booked(Clipped())
    metric.update(torch.tensor([-1.0]))
    deferred.detach(metric, deferred.book_of(metric))
    data = pickle.dumps(metric)
    assert b"tmpatch" not in data
    for twin in (pickle.loads(data), copy.deepcopy(metric), metric.clone()):
        assert "update" in vars(twin) and not getattr(vars(twin)["update"], "_tmpatch_watch", False)
        assert float(twin.compute()) == 0.0


# -- with the deferred_reports patch: the rules around the toy metric -----------------------
@pytest.fixture
def live():
    rows = {r.name: r.state for r in tmpatch.apply("deferred_reports")}
    assert rows["deferred_reports"] == "applied" and deferred.is_live()
    yield
    tmpatch.revert()
    assert not deferred.is_live()


@pytest.mark.parametrize("cls", [Clipped, ClippedFull])
def test_forward_reports_nothing_compute_reports_once(live, cls):
    metric = cls()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert float(metric(torch.tensor([-1.0, 4.0]))) == 4.0
        assert float(metric(torch.tensor([-2.0, -1.0]))) == 0.0
        assert REPORTS == []  # forward's own compute: nothing
        assert float(metric.compute()) == 4.0
        metric.compute()
    assert _counts() == [[3]]  # a full-state forward's two updates counted once
    assert [str(w.message) for w in seen] == ["3 negative values clipped"]


def test_a_forward_that_raises_leaves_later_reports_alone(live):
    metric = Clipped()
    with pytest.raises(TypeError):
        metric("not a tensor")  # raises inside forward's update
    metric.update(torch.tensor([-1.0]))
    with pytest.warns(UserWarning, match="^1 negative"):
        metric.compute()


def test_reset_by_the_user_reports_first_and_revert_keeps(live):
    metric = Clipped()
    metric.update(torch.tensor([-1.0]))
    with pytest.warns(UserWarning, match="^1 negative"):
        metric.reset()  # the data goes: its report first
    assert _counts() == [[1]] and deferred.point() == "compute()"
    metric.update(torch.tensor([1.0]))
    metric.compute()
    REPORTS.clear()
    metric.update(torch.tensor([-1.0]))
    tmpatch.revert()
    metric.update(torch.tensor([2.0]))  # no book-keeping now: the count stays as it was
    with pytest.warns(UserWarning, match="^1 negative"):
        assert float(metric.compute()) == 3.0
    assert not any(m is metric for m, _ in deferred.pending_books())


def test_books_of_the_metrics_inside_report_at_the_outer_compute(live):
    pair = Pair()
    pair.update(torch.tensor([-1.0, 2.0]))
    with pytest.warns(UserWarning, match="^2 negative"):
        pair.compute()  # the inner computes inside it report nothing themselves
    assert len(REPORTS) == 1 and REPORTS[0][0] is pair


def test_copies_start_with_nothing_pending_and_the_first_gives_the_report(live):
    metric = Clipped()
    metric.update(torch.tensor([-1.0]))
    with pytest.warns(UserWarning, match="^1 negative"):
        twins = [metric.clone(), copy.deepcopy(metric), pickle.loads(pickle.dumps(metric))]
    assert _counts() == [[1]]  # once, at the first copy
    for twin in twins:
        assert deferred.book_of(twin) is not None and deferred.book_of(twin).counts == {}
        twin.compute()
    metric.compute()
    assert _counts() == [[1]]


def test_apply_revert_under_threads_loses_no_report():
    """Threads apply and revert while a metric built applied is updated: every negative
    value is reported exactly once at a compute, whatever the state at that moment."""
    tmpatch.apply("deferred_reports")
    metric = Clipped()
    stop = threading.Event()

    def churn():
        while not stop.is_set():
            tmpatch.apply("deferred_reports")
            tmpatch.revert("deferred_reports")

    threads = [threading.Thread(target=churn) for _ in range(3)]
    for thread in threads:
        thread.start()
    reported = 0
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for _ in range(60):
                metric.update(torch.tensor([-1.0, 1.0]))
                before = len(REPORTS)
                metric.compute()
                reported += sum(sum(c for _, c in found) for _, found, _ in REPORTS[before:])
                metric.compute()
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    assert reported == 60 and sum(sum(c for _, c in found) for _, found, _ in REPORTS) == 60


def test_a_compute_while_another_thread_folds_the_book_waits_and_reports(monkeypatch):
    """``revert()`` gathers every book from its own thread: a compute that comes while that
    fold is half done (the book unmarked, its counts not yet written) waits for it and gives
    the report then, not at the compute after."""
    tmpatch.apply("deferred_reports")
    metric = Clipped()
    metric.update(torch.tensor([-1.0, 1.0]))
    book = deferred.book_of(metric)
    folding, go_on = threading.Event(), threading.Event()
    reduce = books._reduce

    def slow_reduce(kind, tensors):
        folding.set()
        go_on.wait(10)
        return reduce(kind, tensors)

    monkeypatch.setattr(books, "_reduce", slow_reduce)
    folder = threading.Thread(target=deferred.gather, args=(book,))
    folder.start()
    assert folding.wait(10)
    first = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        computer = threading.Thread(target=lambda: (metric.compute(), first.append(len(REPORTS))))
        computer.start()
        computer.join(0.5)  # a compute that does not wait for the fold is done by now, reporting nothing
        go_on.set()
        folder.join(10)
        computer.join(10)
        metric.compute()
    assert first == [1] and len(REPORTS) == 1
