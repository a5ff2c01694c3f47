"""No deferred report is lost, none comes twice, none comes later than it must: the loops users
write, with real metrics (MeanMetric's NaN check, ``nan_check``; a class out of range,
``bincount``), patched. One test per row of the table of the issue that asked for it:

1. forward()-only logging, never computed: every NaN batch reported, once;
2. ``MeanMetric(nan_strategy="error")(nan_batch)`` raises;
3. a metric updated with bad data, then garbage-collected: reported (on the CPU the release's
   error from update(); logged at its collection when it was still pending, as on a GPU);
4. the process exits with a report pending: reported at exit;
5. DataLoader workers (fork and spawn) whose dataset updates a metric, never computed: the
   error comes through the loader, and a pending report is logged when the worker ends;
6. a metric inherited by two forked children that compute it, then the parent: one report;
7. a per-batch ``try/except`` around ``update()``: catches the error (on the CPU the release's,
   from the bad batch's own update; on a GPU from a later one, naming the bad batch's update).

On the CPU the release's own check runs in update() (its warning, its error, from that call: the
tests compare it with the release). ``device_timing`` plays a GPU's timing (a flight to the host
every ``LANDING`` entries, reported once its copy lands), ``on_a_device`` with ``held_reports`` a
GPU's whose copy has not landed; in the children the host rules are switched off the same way
(tests/conftest.py ``cpu_shortcuts``, ``hold_reports``). A deferred warning is the release's words
alone (the note: the ``tmpatch`` logger, INFO); a deferred error the release's words, then the
note. The children are real processes, with timeouts.
"""
from __future__ import annotations

import gc
import logging
import os
import re
import textwrap
import warnings

import pytest
import torch
from torchmetrics.aggregation import MeanMetric
from torchmetrics.classification import MulticlassAccuracy

import tmpatch
from tests.conftest import release_in, run_python
from tmpatch.runtime.deferred import landing

NAN = float("nan")
SPELLING = "Encounted" if release_in("<1.2.1") else "Encountered"
NAN_ERROR = f"{SPELLING} `nan` values in tensor"
NAN_WARNING = f"{NAN_ERROR}. Will be removed."
#: the release's error for a class past the bins (3 classes), deferred: its words, then the note
BINCOUNT_ERROR = "shape '[3, 3]' is invalid for input of size larger than 9 (tmpatch bincount: "
GOOD, BAD = torch.tensor([1.0, 2.0]), torch.tensor([NAN, 1.0])


def _apply() -> None:
    states = tmpatch.apply().states()
    for name in ("deferred_reports", "nan_check", "bincount"):
        assert states[name] == "applied", (name, states)


def _accuracy() -> MulticlassAccuracy:
    """Macro: the release counts a confusion matrix (its micro average counts no bins, and raises
    nothing for a class out of range)."""
    return MulticlassAccuracy(num_classes=3, validate_args=False)


def _outcome(call):
    """``call()``'s result, or the type and message of what it raised."""
    try:
        return call()
    except Exception as exc:  # noqa: BLE001 - the release's own errors are compared
        return type(exc), str(exc)


def _notes(caplog, since: int = 0) -> list:
    """The notes of the deferred reports on the ``tmpatch`` logger, from record ``since`` on."""
    return [r.getMessage() for r in caplog.records[since:] if r.name == "tmpatch" and r.levelno == logging.INFO]


def _nan_warnings(seen) -> list:
    return [str(w.message) for w in seen if NAN_ERROR in str(w.message)]


def _first(message: str):
    found = re.search(r"the first of them came from update #(\d+)", message)
    return int(found.group(1)) if found else None


# -- 1. forward()-only logging, never computed ---------------------------------------------------
NAN_STEPS = [17, 101, 190, 333, 400, 512, 640, 777, 850, 999]  # 10 NaN batches in 1,000 steps


def _forward_only() -> list:
    """(step, words, category, file) of each NaN warning of 1,000 forward() steps."""
    metric = MeanMetric(nan_strategy="warn")
    given = []
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for step in range(1, 1001):
            before = len(seen)
            metric(BAD if step in NAN_STEPS else GOOD)
            given += [(step, str(w.message), w.category, w.filename) for w in seen[before:]
                      if NAN_ERROR in str(w.message)]
    return given


def test_row1_forward_only_logging_warns_for_every_nan_batch_on_the_cpu():
    """On the CPU the release's warning, from the forward() that saw the NaN."""
    release = _forward_only()
    assert [step for step, *_ in release] == NAN_STEPS
    assert {words for _, words, _, _ in release} == {NAN_WARNING}
    _apply()
    assert _forward_only() == release


def test_row1_forward_only_logging_on_a_gpu_reports_each_batch_once_within_landing_updates(device_timing, caplog):
    _apply()
    metric = MeanMetric(nan_strategy="warn")
    late = []  # (the step that gave the warning, its words, the note logged with it)
    with warnings.catch_warnings(record=True) as seen, caplog.at_level(logging.INFO, logger="tmpatch"):
        warnings.simplefilter("always")
        for step in range(1, 1001):
            before, logged = len(seen), len(caplog.records)
            metric(BAD if step in NAN_STEPS else GOOD)
            words, notes = _nan_warnings(seen[before:]), _notes(caplog, logged)
            assert len(words) == len(notes), (words, notes)
            late.extend((step, w, n) for w, n in zip(words, notes))
            device_timing.land()  # the device keeps up: each copy lands before the next update
    assert {words for _, words, _ in late} == {NAN_WARNING}  # the release's words alone
    assert [_first(note) for _, _, note in late] == NAN_STEPS[:-1]  # each once, naming its update
    for (step, _, note), nan_step in zip(late, NAN_STEPS):
        assert "saw NaN in 1 update(s)" in note and 0 < step - nan_step <= landing.LANDING, (step, note)
    with caplog.at_level(logging.INFO, logger="tmpatch"):
        logged = len(caplog.records)
        with pytest.warns(UserWarning, match=f"^{re.escape(NAN_WARNING)}$"):
            metric.compute()  # the last one had not left yet (fewer than LANDING entries since)
        note, = _notes(caplog, logged)
    assert "reported at compute() (the first of them came from update #999)" in note, note


@pytest.mark.parametrize("case", ["nan", "class"])
def test_row1_a_forward_only_loop_on_simulated_cuda_sends_its_evidence_without_a_sync(case):
    """40 forward() steps on simulated CUDA: no sync, the evidence sent to the host in
    non-blocking copies into pinned memory, one flight per ``LANDING`` entries (a copy there never
    lands: the simulation has no values, and the next flight waits for it) with a copy per record
    noted (bincount: the negative codes and those past the bins, the release's two errors)."""
    from tmpatch.audit import audit

    _apply()
    metric = MeanMetric(nan_strategy="warn") if case == "nan" else _accuracy()
    batch = (BAD,) if case == "nan" else (torch.tensor([0, 1, 2]), torch.tensor([0, 7, 2]))

    def loop(each, *args):
        for _ in range(40):
            each(*args)
        return args[0]

    report = audit(loop, metric, *batch)
    assert report.complete and report.count == 0, report
    copies = report.of_kind("non-blocking copy (pinned memory)")
    assert len(copies) == (1 if case == "nan" else 2), report
    assert {copy.function for copy in copies} == {"_to_host"}, report


# -- 2. MeanMetric(nan_strategy="error")(nan_batch) -----------------------------------------------
def test_row2_an_error_strategy_raises_from_the_forward_that_saw_nan():
    """On the CPU the release's error, from that forward()."""
    release = _outcome(lambda: MeanMetric(nan_strategy="error")(BAD))
    assert release == (RuntimeError, NAN_ERROR)
    _apply()
    assert _outcome(lambda: MeanMetric(nan_strategy="error")(BAD)) == release


def test_row2_on_a_gpu_the_error_is_raised_from_the_first_forward_after_landing(device_timing):
    _apply()
    metric = MeanMetric(nan_strategy="error")
    metric(GOOD)
    metric(BAD)
    for _ in range(landing.LANDING - 2):
        metric(GOOD)
    assert len(device_timing.events) == 1
    device_timing.land()
    with pytest.raises(RuntimeError, match=f"^{re.escape(NAN_ERROR)} " + r"\(tmpatch nan_check: .*reported at "
                       r"forward\(\) #17 \(the first of them came from update #2\)"):
        metric(GOOD)


# -- 3. updated with bad data, then garbage-collected ------------------------------------------------
@pytest.mark.parametrize("case", ["nan", "class"])
def test_row3_on_the_cpu_the_update_raises_before_the_metric_can_be_dropped(case):
    """The release's error, from the update itself."""
    def update():
        metric = MeanMetric(nan_strategy="error") if case == "nan" else _accuracy()
        metric.update(*((BAD,) if case == "nan" else (torch.tensor([0, 1, 2]), torch.tensor([0, 7, 2]))))

    release = _outcome(update)
    assert release[0] in (RuntimeError, IndexError), release  # IndexError: 0.10.0-0.10.1's index_add_
    _apply()
    assert _outcome(update) == release


@pytest.mark.parametrize("case", ["nan", "class"])
def test_row3_a_pending_report_is_logged_once_when_its_metric_is_collected(on_a_device, caplog, case):
    _apply()
    metric = MeanMetric(nan_strategy="error") if case == "nan" else _accuracy()
    good = (GOOD,) if case == "nan" else (torch.tensor([0, 1, 2]), torch.tensor([0, 1, 2]))
    bad = (BAD,) if case == "nan" else (torch.tensor([0, 1, 2]), torch.tensor([0, 7, 2]))
    metric.update(*good)
    metric.update(*bad)
    before = len(caplog.records)  # apply()'s own lines (a patch that cannot apply on this torch) left out
    with caplog.at_level(logging.WARNING, logger="tmpatch"):
        del metric
        gc.collect()
    told = [r for r in caplog.records[before:] if r.name == "tmpatch"]
    assert len(told) == 1 and told[0].levelname == "ERROR", told
    text = told[0].getMessage()
    name, eager = ("MeanMetric", "TMPATCH_NAN_CHECK=eager") if case == "nan" else ("MulticlassAccuracy",
                                                                                    "TMPATCH_BINCOUNT=eager")
    release = NAN_ERROR + " (tmpatch nan_check: " if case == "nan" else BINCOUNT_ERROR  # its words, then the note
    assert text.startswith("RuntimeError: " + release), text
    assert name in text and eager in text
    assert "the garbage collection of the metric (the first of them came from update #2)" in text
    assert ("saw NaN in 1 update(s)" if case == "nan" else "1 value(s)") in text


# -- 4. the process exits with a report pending -------------------------------------------------------
HELD = """
from tests.conftest import cpu_shortcuts, hold_reports
cpu_shortcuts(False)  # the path a GPU takes
hold_reports()  # a GPU whose copy has not landed
"""
#: the notes of the deferred reports (the ``tmpatch`` logger, INFO) on stderr, one line each
NOTES = """
import logging, sys
notes = logging.StreamHandler(sys.stderr)
notes.setFormatter(logging.Formatter("logged: %(message)s"))
logging.getLogger("tmpatch").addHandler(notes)
logging.getLogger("tmpatch").setLevel(logging.INFO)
"""


@pytest.mark.processes
def test_row4_a_report_pending_at_exit_is_given_once_and_the_exit_status_kept():
    proc = run_python("""
import torch, tmpatch
tmpatch.apply()
""" + HELD + NOTES + """
from torchmetrics.aggregation import MeanMetric
from torchmetrics.classification import MulticlassAccuracy
mean = MeanMetric(nan_strategy="warn")
mean.update(torch.tensor([1.0]))
mean.update(torch.tensor([float("nan")]))
accuracy = MulticlassAccuracy(num_classes=3, validate_args=False)
accuracy.update(torch.tensor([0, 1]), torch.tensor([5, 1]))
print("done")
""", timeout=120)
    assert proc.stdout.strip() == "done"
    err = proc.stderr
    assert err.count(f"logged: UserWarning: {NAN_WARNING}\n") == 1, err  # the release's words alone
    assert err.count(f"logged: {NAN_WARNING} [tmpatch nan_check: MeanMetric saw NaN in 1 update(s)") == 1, err
    assert err.count("logged: RuntimeError: " + BINCOUNT_ERROR) == 1, err
    assert err.count("reported at the exit of process") == 2, err
    assert err.count("(the first of them came from update #2)") == 1, err  # the mean's second update
    assert err.count("(the first of them came from update #1)") == 1, err  # the accuracy's only one


# -- 5. DataLoader workers -------------------------------------------------------------------------
LOADER_CASE = """
import torch
import tmpatch
from torch.utils.data import Dataset

tmpatch.apply()  # in a spawned worker too: this module is imported before the metric is unpickled


class Batches(Dataset):
    \"\"\"Its items update a metric (one NaN item).\"\"\"

    def __init__(self, metric, nan_at):
        self.metric, self.nan_at = metric, nan_at

    def __len__(self):
        return 8

    def __getitem__(self, index):
        self.metric.update(torch.tensor([float("nan")]) if index == self.nan_at else torch.tensor([1.0]))
        return index


def hold(worker_id):
    \"\"\"In the worker: the path a GPU takes, reports waiting as on a GPU whose copy has not landed.\"\"\"
    import logging
    import sys

    from tests.conftest import cpu_shortcuts, hold_reports

    cpu_shortcuts(False)
    hold_reports()
    notes = logging.StreamHandler(sys.stderr)  # the notes of the deferred reports, on stderr
    notes.setFormatter(logging.Formatter("logged: %(message)s"))
    logging.getLogger("tmpatch").addHandler(notes)
    logging.getLogger("tmpatch").setLevel(logging.INFO)
"""


def _loader(tmp_path, method: str, strategy: str, hold: bool):
    (tmp_path / "loader_case.py").write_text(textwrap.dedent(LOADER_CASE))
    return run_python(f"""
import sys
sys.path.insert(0, {str(tmp_path)!r})
import loader_case
from torch.utils.data import DataLoader
from torchmetrics.aggregation import MeanMetric

if __name__ == "__main__":
    metric = MeanMetric(nan_strategy={strategy!r})
    loader = DataLoader(loader_case.Batches(metric, 3), batch_size=None, num_workers=2, timeout=60,
                        multiprocessing_context={method!r}, worker_init_fn=loader_case.hold if {hold} else None)
    try:
        seen = sorted(int(i) for i in loader)
        print("finished", seen)
    except RuntimeError as error:
        print("raised", {NAN_ERROR!r} in str(error))
""", timeout=180)


METHODS = [pytest.param(m, marks=pytest.mark.skipif(not hasattr(os, "fork") and m == "fork", reason="os.fork"))
           for m in ("fork", "spawn")]


@pytest.mark.processes
@pytest.mark.parametrize("method", METHODS)
def test_row5_a_workers_error_comes_through_the_loader(tmp_path, method):
    proc = _loader(tmp_path, method, "error", hold=False)
    assert proc.stdout.strip() == "raised True", (proc.stdout, proc.stderr)


@pytest.mark.processes
@pytest.mark.parametrize("method", METHODS)
def test_row5_a_report_pending_when_a_worker_ends_is_logged_there_once(tmp_path, method):
    proc = _loader(tmp_path, method, "warn", hold=True)
    assert proc.stdout.strip() == "finished [0, 1, 2, 3, 4, 5, 6, 7]", (proc.stdout, proc.stderr)
    assert proc.stderr.count(f"UserWarning: {NAN_WARNING}\n") == 1, proc.stderr  # the release's words alone
    assert proc.stderr.count(f"logged: {NAN_WARNING} [tmpatch nan_check: ") == 1, proc.stderr  # its note
    # the worker's finalizers or, where its exit runs them first (spawn on Python 3.13), its atexit hooks
    assert "reported at the end of process" in proc.stderr or "reported at the exit of process" in proc.stderr, \
        proc.stderr


# -- 6. a metric inherited by forked children --------------------------------------------------------
FORKED = """
import multiprocessing, sys, warnings
import torch, tmpatch
tmpatch.apply()
{hold}
from torchmetrics.aggregation import MeanMetric

warnings.simplefilter("always")
metric = MeanMetric(nan_strategy="warn")
metric.update(torch.tensor([1.0, float("nan")]))  # the warning: given now (CPU), or pending (a GPU)


def child():
    metric.compute()
    sys.stderr.flush()


if __name__ == "__main__":
    context = multiprocessing.get_context("fork")
    for _ in range(2):
        process = context.Process(target=child)
        process.start()
        process.join(60)
        assert process.exitcode == 0
    metric.compute()
    print("done")
"""


@pytest.mark.processes
@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork")
@pytest.mark.parametrize("hold", [False, True], ids=["cpu", "pending at the fork"])
def test_row6_forked_children_do_not_repeat_their_parents_report(hold):
    proc = run_python(FORKED.format(hold=HELD if hold else ""), timeout=120)
    assert proc.stdout.strip() == "done"
    # once (0.10-0.11's own warnings.warn shows its source line too, the words in it)
    assert proc.stderr.count(f"UserWarning: {NAN_WARNING}\n") == 1, proc.stderr


# -- 7. a per-batch try/except around update() ---------------------------------------------------------
PREDS = torch.tensor([0, 1, 2, 0, 1])
BATCHES = [torch.tensor([0, 1, 2, 0, 1]), torch.tensor([0, 1, 2, 0, 7]), torch.tensor([1, 2, 0, 1, 2])]


def _per_batch() -> tuple:
    metric, caught = _accuracy(), []
    for index, target in enumerate(BATCHES):
        try:
            metric.update(PREDS, target)
        except (RuntimeError, IndexError) as error:  # IndexError: 0.10.0-0.10.1's index_add_
            caught.append((index, str(error)))
    return caught, metric.compute()


def test_row7_the_bad_batchs_own_update_raises_on_the_cpu():
    """The release's error from the bad batch's own update, which adds nothing to the states."""
    release = _per_batch()
    assert [index for index, _ in release[0]] == [1]
    _apply()
    caught, value = _per_batch()
    assert caught == release[0]
    assert torch.equal(value, release[1])


def test_row7_on_a_gpu_a_later_update_raises_naming_the_bad_batch(device_timing):
    _apply()
    metric, caught = _accuracy(), []
    batches = BATCHES + [BATCHES[0]] * (2 * landing.LANDING)
    for index, target in enumerate(batches):
        try:
            metric.update(PREDS, target)
        except RuntimeError as error:
            caught.append((index + 1, str(error)))
        device_timing.land()
    (step, message), = caught
    assert 2 < step <= 2 + landing.LANDING and "(the first of them came from update #2)" in message
    metric.compute()


def test_on_a_gpu_ignored_positions_are_not_counted_as_invalid(device_timing):
    """With ``ignore_index`` an update notes the codes (out of range: counted) and the kept positions
    (taken off): both go to the host as they are and are counted there."""
    _apply()
    metric = MulticlassAccuracy(num_classes=3, ignore_index=0, validate_args=False)
    targets = ([torch.tensor([0, 1, 2, 0, 1])] * 3 + [torch.tensor([0, 1, 2, 0, 7])]
               + [torch.tensor([0, 1, 2, 0, 1])] * 20)
    caught = []
    for step, target in enumerate(targets, 1):
        try:
            metric.update(PREDS, target)
        except RuntimeError as error:
            caught.append((step, str(error)))
        device_timing.land()
    (step, message), = caught
    assert "1 value(s)" in message and "(the first of them came from update #4)" in message, message
    metric.compute()
