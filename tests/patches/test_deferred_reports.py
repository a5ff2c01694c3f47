"""deferred_reports with real metrics (issue #11): nothing lost, nothing repeated, nothing leaked.

A NaN seen by ``nan_check`` (``nan_strategy="error"``/``"warn"``) or an invalid class seen by
``bincount`` is reported once, at the user's next explicit ``compute()`` of the metric or of a
wrapper or collection holding it, or at the first other point where the data that carries it
leaves the metric or is dropped (issue #34 item 2: ``state_dict``, pickling and copies,
``merge_state``, ``sync``, ``reset``); and nothing of tmpatch shows in a metric's state_dict,
metric_state, merge_state, _defaults or pickles. The numbered sections follow the issue's items
(7, DDP: test_deferred_reports_ddp.py; 8, engine: tests/engine/test_core.py and tests/control/test_api.py; 9,
fidelity: test_nan_check.py).
"""
from __future__ import annotations

import copy
import io
import pickle
import threading
import warnings
from typing import Any, Callable, List, Tuple

import pytest
import torch
from torchmetrics import Metric, MetricCollection, wrappers
from torchmetrics.aggregation import MeanMetric, SumMetric
from torchmetrics.classification import (
    BinaryAUROC,
    MulticlassAccuracy,
    MulticlassConfusionMatrix,
)
from torchmetrics.wrappers import BootStrapper, ClasswiseWrapper, MetricTracker, MinMaxMetric, MultioutputWrapper

import tmpatch
from tests.conftest import assert_bitwise, cpu_shortcuts, release_in, run_python

#: reports wait for a settle point here, as on a GPU before the evidence's copy lands (reports at a
#: later update, at the metric's collection and at exit: tests/runtime/test_deferred_landing.py and
#: test_deferred_timing.py)
pytestmark = pytest.mark.usefixtures("held_reports")


@pytest.fixture(autouse=True)
def _on_a_device():
    """The path a GPU takes, where the checks are deferred (on the CPU the release's own check runs
    in update(): test_nan_check.py, tests/patches/bincount/)."""
    cpu_shortcuts(False)
    yield
    cpu_shortcuts(True)

#: 1.0.0+
MultitaskWrapper = getattr(wrappers, "MultitaskWrapper", None)
Running = getattr(wrappers, "Running", None)

NAN = float("nan")
SPELLING = "Encounted" if release_in("<1.2.1") else "Encountered"
NAN_ERROR = f"{SPELLING} `nan` values in tensor"
BINCOUNT_ERROR = "tmpatch bincount: "
MERGE_STATE = hasattr(Metric, "merge_state")


def _apply() -> None:
    states = tmpatch.apply().states()
    for name in ("deferred_reports", "nan_check", "bincount"):
        assert states[name] == "applied", (name, states)


def _accuracy(**kwargs: Any) -> MulticlassAccuracy:
    return MulticlassAccuracy(num_classes=3, validate_args=False, **kwargs)


#: (name, builder, bad update arguments, good update arguments, the message of the report)
SINGLE = [
    ("nan", lambda: MeanMetric(nan_strategy="error"), (torch.tensor([NAN, 1.0]),), (torch.tensor([1.0]),), NAN_ERROR),
    ("bincount", _accuracy, (torch.tensor([0, 1, 2]), torch.tensor([0, 3, 2])),
     (torch.tensor([0, 1, 2]), torch.tensor([0, 1, 2])), BINCOUNT_ERROR),
]
SINGLE_IDS = [case[0] for case in SINGLE]


def _errors(calls: List[Callable[[], Any]]) -> str:
    """Run ``calls``; one letter each: ``.`` done, ``E`` raised RuntimeError (or the IndexError of
    0.10.0-0.10.1's ``_bincount``, which counts with ``index_add_``)."""
    out = ""
    for call in calls:
        try:
            call()
            out += "."
        except (RuntimeError, IndexError):
            out += "E"
    return out


def _warnings(records, text: str) -> int:
    return len([w for w in records if text in str(w.message)])


# -- reports: once, at the user's compute ----------------------------------------------------
@pytest.mark.parametrize("name, build, bad, good, message", SINGLE, ids=SINGLE_IDS)
def test_reported_once_at_the_next_compute_never_in_forward(name, build, bad, good, message):
    _apply()
    metric = build()
    metric(*bad)  # forward: its own compute reports nothing
    metric(*good)
    with pytest.raises(RuntimeError, match=message):
        metric.compute()
    metric.compute()
    metric.update(*good)
    metric.compute()


@pytest.mark.parametrize("name, build, bad, good, message", SINGLE, ids=SINGLE_IDS)
def test_item1_a_forward_that_raised_silences_nothing(name, build, bad, good, message):
    """Item 1: torchmetrics leaves ``_should_unsync=False`` after a forward that raised."""
    _apply()
    metric = build()
    wrong = (torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0, 3.0])) if name == "nan" else (
        torch.tensor([0, 1]), torch.tensor([0, 1, 2]))  # shapes that do not match
    with pytest.raises(RuntimeError):
        metric(*wrong)
    assert metric._should_unsync is False  # the release's flag, left as it was mid-forward
    metric.update(*bad)
    assert _errors([metric.compute, metric.compute]) == "E."


@pytest.mark.parametrize("name, build, bad, good, message", SINGLE, ids=SINGLE_IDS)
def test_item1_an_update_that_raised_keeps_the_pending_report(name, build, bad, good, message):
    _apply()
    metric = build()
    metric.update(*bad)
    with pytest.raises((RuntimeError, ValueError, TypeError, AttributeError)):
        metric.update("not a tensor", "nor this")
    with pytest.raises(RuntimeError, match=message):
        metric.compute()


@pytest.mark.parametrize("name, build, bad, good, message", SINGLE, ids=SINGLE_IDS)
def test_item2_reset_by_the_user_gives_the_report_once(name, build, bad, good, message):
    """Item 2: the batch is dropped there, so its report is given there: the error never blocks
    the reset (the metric is reset first, as the release's reset leaves it, then it is raised);
    the next reset is silent, and so is the next compute."""
    _apply()
    metric = build()
    metric.update(*bad)
    with pytest.raises(RuntimeError, match=message) as raised:
        metric.reset()
    assert "reset()" in str(raised.value)
    for key, default in metric._defaults.items():  # reset, the error notwithstanding
        value = getattr(metric, key)
        assert (value == default) if isinstance(value, list) else torch.equal(value, default), key
    assert metric._update_count == 0
    metric.reset()
    metric.update(*good)
    metric.compute()


@pytest.mark.parametrize("name, build, bad, good, message", SINGLE, ids=SINGLE_IDS)
def test_on_the_cpu_the_release_raises_in_the_same_update(name, build, bad, good, message):
    """On the CPU (the library's rule: a read costs nothing there) the release's own check runs:
    its error, type and words, from the same update(); nothing is left pending after it."""
    def run() -> Tuple[Any, ...]:
        metric = build()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "compute called before update"
            metric.update(*good)
            with pytest.raises(Exception) as raised:
                metric.update(*bad)
            return type(raised.value), str(raised.value), _errors([metric.compute, metric.reset, metric.compute])

    want = run()
    assert want[0] in (RuntimeError, IndexError), want  # IndexError: 0.10.0-0.10.1's index_add_
    _apply()
    cpu_shortcuts(True)
    assert run() == want


# -- item 2: revert() keeps a pending report ----------------------------------------------------
@pytest.mark.parametrize("name, build, bad, good, message", SINGLE, ids=SINGLE_IDS)
def test_item2_revert_keeps_the_pending_report(name, build, bad, good, message):
    _apply()
    metric = build()
    metric.update(*bad)
    tmpatch.revert()
    with pytest.raises(RuntimeError, match=message):
        metric.compute()
    metric.compute()


@pytest.mark.parametrize("name, build, bad, good, message", SINGLE, ids=SINGLE_IDS)
def test_item2_after_revert_forward_keeps_it_and_reset_clears_it(name, build, bad, good, message):
    _apply()
    kept, cleared = build(), build()
    for metric in (kept, cleared):
        metric.update(*bad)
    tmpatch.revert()
    kept(*good)  # forward resets the metric for itself: not the user's reset
    cleared.reset()
    cleared(*good)
    with pytest.raises(RuntimeError, match=message):
        kept.compute()
    cleared.compute()


@pytest.mark.parametrize("name, build, bad, good, message", SINGLE, ids=SINGLE_IDS)
def test_item2_revert_then_apply_again_keeps_it(name, build, bad, good, message):
    _apply()
    metric = build()
    metric.update(*bad)
    tmpatch.revert()
    _apply()
    metric.update(*good)
    assert _errors([metric.compute, metric.compute]) == "E."


def test_item2_apply_and_revert_in_threads_lose_no_report():
    """Other threads apply and revert while a metric built applied sees a NaN and an
    invalid class on every step: each is reported exactly once, in update() (reverted
    at that moment: the release's check) or at the next compute()."""
    _apply()
    metrics = [SumMetric(nan_strategy="error"), _accuracy()]
    bad = [(torch.tensor([NAN, 1.0]),), (torch.tensor([0, 1]), torch.tensor([0, 3]))]
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            tmpatch.apply()
            tmpatch.revert()

    threads = [threading.Thread(target=churn) for _ in range(4)]
    for thread in threads:
        thread.start()
    steps, seen = 30, [[], []]  # per metric, per step: (raised in update, errors at the two computes)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for _ in range(steps):
                for i, metric in enumerate(metrics):
                    raised = False
                    try:
                        metric.update(*bad[i])
                    except (RuntimeError, IndexError):  # the release's check (0.10.0-0.10.1: IndexError)
                        raised = True
                    seen[i].append((raised, _errors([metric.compute, metric.compute]).count("E")))
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    for steps_seen in seen:
        # never lost, never twice at compute; the one known double: an update that another
        # thread's revert() caught half patched (its count recorded, then the release's own
        # check raised): raised in update() and reported at compute (docs/guide/deferred.rst).
        # How often it happens depends on the machine's load and on how long apply()/revert()
        # take against an update (4 threads churning: 12 of 30 steps were seen on a loaded CI
        # machine, none on an idle one), so no bound below the step count holds; what must hold
        # is the line above, and that not every update reports twice
        assert all(raised + errors >= 1 and errors <= 1 for raised, errors in steps_seen), steps_seen
        doubles = [step for step in steps_seen if step == (True, 1)]
        assert len(doubles) < steps, steps_seen


# -- item 3: checkpoints -------------------------------------------------------------------------
def _collection() -> MetricCollection:
    return MetricCollection({"mean": MeanMetric(), "acc": _accuracy()})


_VALID_C = (torch.tensor([0, 1, 1]), torch.tensor([0, 1, 2]))  # the valid positions of _INVALID_C
_INVALID_C = (torch.tensor([0, 1, 2, 1]), torch.tensor([0, 1, 3, 2]))
_CURVE = (torch.tensor([0.1, 0.8, 0.4, 0.7]), torch.tensor([0, 1, 2, 1]))

#: name -> (builder, what the patched metric is fed (a pending report included), what the
#: unpatched one is fed: the same, less the invalid classes the release would raise on). On a
#: device the patched update counts the cells the release's ``_bincount`` counts: where an invalid
#: class lands in other cells (BinaryAUROC: a target of 2 in the next threshold's), the unpatched
#: one is fed the same in deterministic mode (:data:`MESH_FED`), whose mesh counts those cells and
#: drops the codes past its bins without an error
CHECKPOINTED = {
    "MeanMetric": (MeanMetric, [(torch.tensor([1.0, NAN, 4.0]),)], [(torch.tensor([1.0, NAN, 4.0]),)]),
    "SumMetric": (SumMetric, [(torch.tensor([1.0, NAN, 4.0]),)], [(torch.tensor([1.0, NAN, 4.0]),)]),
    "MulticlassAccuracy": (_accuracy, [_INVALID_C], [_VALID_C]),
    "MulticlassConfusionMatrix": (lambda: MulticlassConfusionMatrix(3, validate_args=False), [_INVALID_C], [_VALID_C]),
    "BinaryAUROC": (lambda: BinaryAUROC(thresholds=5, validate_args=False), [_CURVE], [_CURVE]),
    "MetricCollection": (_collection, [("mean", torch.tensor([1.0, NAN, 4.0])), ("acc",) + _INVALID_C],
                         [("mean", torch.tensor([1.0, NAN, 4.0])), ("acc",) + _VALID_C]),
}


#: the cases whose unpatched metric is fed in deterministic mode (:data:`CHECKPOINTED`)
MESH_FED = {"BinaryAUROC"}


def _feed(metric, updates, mesh: bool = False) -> None:
    """Feed ``updates``; ``mesh``: in deterministic mode (the release's ``_bincount`` by a mesh)."""
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(mesh or before)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for args in updates:
                if isinstance(args[0], str):  # a member of the collection
                    metric[args[0]].update(*args[1:])
                else:
                    metric.update(*args)
    finally:
        torch.use_deterministic_algorithms(before)


def _values(metric) -> List[torch.Tensor]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            value = metric.compute()
        except RuntimeError:  # patched: the report of what _feed gave
            value = metric.compute()
    if isinstance(value, dict):
        return [value[k] for k in sorted(value)]
    return list(value) if isinstance(value, tuple) else [value]


@pytest.mark.parametrize("name", sorted(CHECKPOINTED))
def test_item3_checkpoints_load_strictly_both_ways_with_equal_values(name):
    build, args, valid = CHECKPOINTED[name]
    _apply()
    patched = build()
    _feed(patched, args)
    patched.persistent(True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            patched.state_dict()  # its data leaves: the pending report is given here (item 2)
        except RuntimeError:
            pass
    written_patched = patched.state_dict()
    assert not [k for k in written_patched if "tmpatch" in k]
    tmpatch.revert()
    plain = build()
    _feed(plain, valid, mesh=name in MESH_FED)
    plain.persistent(True)
    written_plain = plain.state_dict()
    assert sorted(written_patched) == sorted(written_plain)
    loaded_plain = build()
    loaded_plain.persistent(True)
    loaded_plain.load_state_dict(written_patched, strict=True)  # patched checkpoint, unpatched process
    _apply()
    loaded_patched = build()
    loaded_patched.persistent(True)
    loaded_patched.load_state_dict(written_plain, strict=True)  # and the reverse
    assert sorted(loaded_patched.state_dict()) == sorted(written_plain)
    for metric in (loaded_plain, loaded_patched):
        for got, want in zip(_values(metric), _values(plain)):
            assert_bitwise(got, want)


def test_state_dict_metric_state_and_defaults_hold_nothing_of_tmpatch():
    _apply()
    for metric in (MeanMetric(nan_strategy="warn"), _accuracy(), BinaryAUROC(thresholds=3), _collection()):
        for persistent in (False, True):
            metric.persistent(persistent)
            assert not [k for k in metric.state_dict() if "tmpatch" in k]
        for inner in metric.modules():
            if isinstance(inner, Metric):
                assert not [k for k in inner._defaults if "tmpatch" in k]
                assert not [k for k in getattr(inner, "metric_state", {}) if "tmpatch" in k]
                assert not [k for k in vars(inner) if "tmpatch" in k]


# -- item 4: merge_state ---------------------------------------------------------------------
@pytest.mark.skipif(not MERGE_STATE, reason="merge_state from 1.6.0")
def test_item4_merge_state_expects_the_releases_keys_only():
    _apply()
    metric = SumMetric()
    metric.merge_state({"sum_value": torch.tensor(2.0)})  # the release's own docstring example
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "compute called before update"
        assert float(metric.compute()) == 2.0
    assert sorted(metric.metric_state) == ["sum_value"]
    left, right = MeanMetric(nan_strategy="error"), MeanMetric(nan_strategy="error")
    left.update(torch.tensor([1.0, 2.0]))
    right.update(torch.tensor([3.0, NAN]))
    with pytest.raises(RuntimeError, match=NAN_ERROR):  # its data would leave: the report comes first
        left.merge_state(right)
    left.merge_state(right)  # given once
    assert float(left.compute()) == 2.0
    assert float(right.compute()) == 3.0


# -- item 5: wrappers report once --------------------------------------------------------------
def _tracker(metric):
    tracker = MetricTracker(metric)
    tracker.increment()
    return tracker


_BAD_C = (torch.tensor([0, 1, 2]), torch.tensor([0, 3, 3]))
_GOOD_C = (torch.tensor([0, 1, 2]), torch.tensor([0, 1, 2]))
_BAD_N, _GOOD_N = (torch.tensor([NAN, NAN]),), (torch.tensor([1.0]),)

WRAPPED = {
    "BootStrapper-bincount": (lambda: BootStrapper(_accuracy(), num_bootstraps=4, sampling_strategy="multinomial"),
                              (torch.tensor([0, 1, 2]), torch.tensor([3, 3, 3])), _GOOD_C),
    "BootStrapper-nan": (lambda: BootStrapper(MeanMetric(nan_strategy="error"), num_bootstraps=4,
                                              sampling_strategy="multinomial"), _BAD_N, _GOOD_N),
    "MultioutputWrapper-bincount": (lambda: MultioutputWrapper(_accuracy(), num_outputs=2),
                                    (torch.tensor([[0, 1], [1, 2]]), torch.tensor([[0, 3], [1, 3]])),
                                    (torch.tensor([[0, 1], [1, 2]]), torch.tensor([[0, 1], [1, 2]]))),
    "MultioutputWrapper-nan": (lambda: MultioutputWrapper(MeanMetric(nan_strategy="error"), num_outputs=2,
                                                          remove_nans=False),
                               (torch.tensor([[NAN, 1.0], [1.0, NAN]]),), (torch.tensor([[1.0, 1.0]]),)),
    "ClasswiseWrapper": (lambda: ClasswiseWrapper(_accuracy(average=None)), _BAD_C, _GOOD_C),
    "MinMaxMetric-bincount": (lambda: MinMaxMetric(_accuracy()), _BAD_C, _GOOD_C),
    "MinMaxMetric-nan": (lambda: MinMaxMetric(MeanMetric(nan_strategy="error")), _BAD_N, _GOOD_N),
    "MetricTracker": (lambda: _tracker(_accuracy()), _BAD_C, _GOOD_C),
    "MetricCollection-bincount": (
        lambda: MetricCollection([_accuracy(), MulticlassConfusionMatrix(3, validate_args=False)]), _BAD_C, _GOOD_C),
    "MetricCollection-nan": (lambda: MetricCollection({"a": MeanMetric(nan_strategy="error"),
                                                       "b": SumMetric(nan_strategy="error")}), _BAD_N, _GOOD_N),
    "MultitaskWrapper": (lambda: MultitaskWrapper({"a": _accuracy(), "b": MeanMetric(nan_strategy="error")}),
                         ({"a": _BAD_C[0], "b": torch.tensor([NAN])}, {"a": _BAD_C[1], "b": torch.tensor([1.0])}),
                         ({"a": _GOOD_C[0], "b": torch.tensor([1.0])}, {"a": _GOOD_C[1], "b": torch.tensor([1.0])})),
}
if Running is not None:
    WRAPPED["Running-bincount"] = (lambda: Running(_accuracy(), window=3), _BAD_C, _GOOD_C)
    WRAPPED["Running-nan"] = (lambda: Running(MeanMetric(nan_strategy="error"), window=3), _BAD_N, _GOOD_N)
if MultitaskWrapper is None:
    del WRAPPED["MultitaskWrapper"]


def _rounds(metric, bad, good) -> str:
    calls = []
    for step in range(4):
        args = bad if step == 0 else good
        calls += [lambda args=args: metric.update(*args), metric.compute]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _errors(calls)


@pytest.mark.parametrize("name", sorted(WRAPPED))
def test_item5_wrappers_and_collections_report_once(name):
    build, bad, good = WRAPPED[name]
    assert _rounds(build(), bad, good) == "E......."  # the release: once, in update()
    _apply()
    assert _rounds(build(), bad, good) == ".E......"  # patched on a device: once, at the next compute
    cpu_shortcuts(True)
    assert _rounds(build(), bad, good) == "E......."  # on the CPU: the release's check, in update()


@pytest.mark.skipif(Running is None, reason="Running from 1.0.0")
def test_item5_running_reports_once_while_the_batch_is_in_the_window():
    _apply()
    metric = Running(_accuracy(), window=3)
    metric.update(*_BAD_C)
    assert _errors([metric.compute, metric.compute]) == "E."
    metric.update(*_GOOD_C)
    assert _errors([metric.compute]) == "."  # the bad batch is still in the window: no repeat


def test_item5_a_forward_through_a_wrapper_reports_at_its_compute():
    _apply()
    running = [Running(MeanMetric(nan_strategy="error"), window=2)] if Running is not None else []
    for metric in running + [MinMaxMetric(MeanMetric(nan_strategy="error"))]:
        metric(torch.tensor([NAN, 1.0]))
        metric(torch.tensor([2.0]))
        assert _errors([metric.compute, metric.compute]) == "E.", type(metric).__name__


# -- item 6: compute groups ----------------------------------------------------------------------
def _warned_group(first_nan: bool) -> Tuple[int, int, Any, set]:
    """The NaN warnings in the updates, in all, the compute groups and the warnings' (words,
    category, file)."""
    collection = MetricCollection({"a": MeanMetric(nan_strategy="warn"), "b": MeanMetric(nan_strategy="warn")},
                                  compute_groups=True)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        collection.update(torch.tensor([1.0, NAN if first_nan else 2.0]))
        collection.update(torch.tensor([1.0, NAN]))
        in_updates = _warnings(seen, SPELLING)
        collection.compute()
        collection.compute()
        collection.update(torch.tensor([3.0]))
        collection.compute()
    given = {(str(w.message), w.category, w.filename) for w in seen if SPELLING in str(w.message)}
    return in_updates, _warnings(seen, SPELLING), collection.compute_groups, given


@pytest.mark.parametrize("first_nan", [False, True])
def test_item6_compute_groups_warn_once(first_nan):
    during, total, groups, release = _warned_group(first_nan)
    assert list(groups.values()) == [["a", "b"]]
    assert (during, total) == ((2 + 1, 3) if first_nan else (1, 1))  # the release, in update()
    assert len(release) == 1, release
    _apply()
    during, total, groups, given = _warned_group(first_nan)
    assert list(groups.values()) == [["a", "b"]]
    assert (during, total) == (0, 1)  # on a device: one report for the collection, at its first compute
    assert given == release  # in the release's words alone, its category, from its file
    cpu_shortcuts(True)
    during, total, groups, given = _warned_group(first_nan)
    assert list(groups.values()) == [["a", "b"]]
    assert (during, total) == ((2 + 1, 3) if first_nan else (1, 1))  # on the CPU: the release's, in update()
    assert given == release


# -- settle points (issue #34 item 2): a pending report travels with no copy of its data ----------
def _persistent(metric):
    """``metric`` with every metric state in it persistent (in its state_dict)."""
    for inner in metric.modules():
        if isinstance(inner, Metric):
            inner.persistent(True)
    return metric


def _torch_save(metric) -> None:
    torch.save(metric, io.BytesIO())


def _sync(metric) -> None:
    """A sync over a world of two ranks that both hold this rank's states (no process group)."""
    metric.sync(dist_sync_fn=lambda tensor, group=None: [tensor, tensor], distributed_available=lambda: True)
    metric.unsync()


#: what takes a metric's data out of it, or drops it (the metric is persistent: ``_persistent``)
POINTS = {
    "state_dict": lambda metric: metric.state_dict(),
    "torch.save": _torch_save,
    "pickle": pickle.dumps,
    "deepcopy": copy.deepcopy,
    "reset": lambda metric: metric.reset(),
    "sync": _sync,
}
POINT_NAMES = {"state_dict": "state_dict()", "torch.save": "pickling", "pickle": "pickling", "deepcopy": "pickling",
               "reset": "reset()", "sync": "sync()"}


def _at_points(metric, bad, point: str) -> str:
    take = POINTS[point]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "compute called before update" after a reset
        return _errors([lambda: metric.update(*bad), lambda: take(metric), lambda: take(metric), metric.compute])


@pytest.mark.parametrize("point", sorted(POINTS))
@pytest.mark.parametrize("name, build, bad, good, message", SINGLE, ids=SINGLE_IDS)
def test_item2_a_pending_report_settles_where_its_data_leaves(point, name, build, bad, good, message):
    """The release raises in update() and the batch never reaches the state; patched, the batch
    is in the state, so the first point that copies or drops it gives the report, once."""
    assert _at_points(_persistent(build()), bad, point) == "E..."
    _apply()
    metric = _persistent(build())
    metric.update(*good)
    assert _at_points(metric, bad, point) == ".E.."
    metric.update(*bad)
    with pytest.raises(RuntimeError, match=message) as raised:
        POINTS[point](metric)
    assert f"reported at {POINT_NAMES[point]}" in str(raised.value) or (
        name == "bincount" and f"Reported at {POINT_NAMES[point]}" in str(raised.value))


@pytest.mark.parametrize("name, build, bad, good, message", SINGLE, ids=SINGLE_IDS)
def test_item2_a_state_dict_without_metric_states_leaves_the_report_for_compute(name, build, bad, good, message):
    _apply()
    metric = build()  # states not persistent: the state_dict carries none of the data
    metric.update(*bad)
    assert metric.state_dict() == {}
    assert _errors([metric.compute, metric.compute]) == "E."


@pytest.mark.parametrize("name, build, bad, good, message", SINGLE, ids=SINGLE_IDS)
def test_item2_a_sync_that_does_not_run_leaves_the_report_for_compute(name, build, bad, good, message):
    _apply()
    metric = build()
    metric.update(*bad)
    metric.sync()  # not distributed: nothing leaves
    assert _errors([metric.compute, metric.compute]) == "E."


@pytest.mark.parametrize("name, build, bad, good, message", SINGLE, ids=SINGLE_IDS)
def test_item2_a_sync_that_raises_the_report_puts_the_local_states_back(name, build, bad, good, message):
    _apply()
    metric = build()
    metric.update(*good)

    def states():
        return {key: getattr(metric, key).clone() for key in metric._defaults}

    before = states()
    metric.update(*bad)
    local = states()
    assert any(not torch.equal(local[key], before[key]) for key in local)  # the bad batch is in the states
    with pytest.raises(RuntimeError, match=message):
        metric.sync(dist_sync_fn=lambda tensor, group=None: [tensor, tensor], distributed_available=lambda: True)
    assert not metric._is_synced
    for key, value in states().items():
        assert torch.equal(value, local[key]), key


def test_item2_a_checkpoint_between_a_bad_batch_and_compute_is_never_written_silently(tmp_path):
    """The issue's case: a checkpoint taken between the bad batch and the next compute()."""
    _apply()
    metric = _persistent(MeanMetric(nan_strategy="error"))
    metric.update(torch.tensor([2.0, 6.0]))
    metric.update(torch.tensor([NAN, 10.0]))
    with pytest.raises(RuntimeError, match=NAN_ERROR):
        torch.save(metric.state_dict(), tmp_path / "state.pt")
    metric.update(torch.tensor([NAN, 4.0]))
    with pytest.raises(RuntimeError, match=NAN_ERROR):
        torch.save(metric, tmp_path / "metric.pt")  # the whole metric, pickled
    torch.save(metric.state_dict(), tmp_path / "state.pt")  # every report given: the checkpoint is written
    assert sorted(path.name for path in tmp_path.iterdir()) == ["metric.pt", "state.pt"] or sorted(
        path.name for path in tmp_path.iterdir()) == ["state.pt"]


@pytest.mark.skipif(not MERGE_STATE, reason="merge_state from 1.6.0")
@pytest.mark.parametrize("direction", ["out of", "into"])
@pytest.mark.parametrize("name, build, bad, good, message", SINGLE, ids=SINGLE_IDS)
def test_item2_merge_state_gives_the_report_of_either_metric(direction, name, build, bad, good, message):
    def run() -> str:
        seen, other = build(), build()
        other.update(*good)
        calls = [lambda: seen.update(*good), lambda: seen.update(*bad)]
        merge = (lambda: other.merge_state(seen)) if direction == "out of" else (lambda: seen.merge_state(other))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return _errors(calls + [merge, merge, seen.compute, other.compute])

    assert run() == ".E...."  # the release: in update()
    _apply()
    assert run() == "..E..."


#: the settle points a wrapper or collection goes through (a sync is one metric's)
WRAPPER_POINTS = ("state_dict", "torch.save", "deepcopy", "reset")


@pytest.mark.parametrize("point", WRAPPER_POINTS)
@pytest.mark.parametrize("name", sorted(WRAPPED))
def test_item2_wrappers_and_collections_give_the_report_once_at_a_settle_point(name, point):
    """Once for the wrapper or collection, as at its compute; but a MetricCollection pickled or
    copied whole (it has no pickling method of torchmetrics' own, the pickler takes its members
    one by one) gives each member's report as that member goes: here two members saw the batch."""
    build, bad, good = WRAPPED[name]
    assert _at_points(_persistent(build()), bad, point) == "E..."
    _apply()
    member_by_member = name.startswith("MetricCollection") and point in ("torch.save", "deepcopy")
    assert _at_points(_persistent(build()), bad, point) == (".EE." if member_by_member else ".E..")


@pytest.mark.parametrize("groups", [True, False])
@pytest.mark.parametrize("point", WRAPPER_POINTS + ("clone",))
def test_item2_a_collection_warns_once_at_a_settle_point(point, groups):
    """One warning for the collection, as at its compute: the first member's state_dict, reset
    or clone settles every member's book (with compute groups the leader's holds the count)."""
    _apply()
    collection = _persistent(MetricCollection({"a": MeanMetric(nan_strategy="warn"),
                                               "b": MeanMetric(nan_strategy="warn")}, compute_groups=groups))
    take = (lambda c: c.clone()) if point == "clone" else POINTS[point]
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        collection.update(torch.tensor([1.0, 2.0]))
        collection.update(torch.tensor([1.0, NAN]))
        take(collection)
        take(collection)
        collection.compute()
    expected = 2 if point in ("torch.save", "deepcopy") and not groups else 1  # pickled member by member
    assert _warnings(seen, SPELLING) == expected, [str(w.message) for w in seen]


# -- copies and pickles ---------------------------------------------------------------------------
def test_copies_carry_no_pending_report_and_the_first_copy_gives_it():
    """Item 2: a copy carries the data and no report; so copying gives the report, once."""
    _apply()
    metric = MeanMetric(nan_strategy="error")
    metric.update(torch.tensor([NAN, 2.0]))
    with pytest.raises(RuntimeError, match=NAN_ERROR):
        metric.clone()
    twins = [metric.clone(), copy.deepcopy(metric), pickle.loads(pickle.dumps(metric))]
    for twin in twins:
        assert float(twin.compute()) == 2.0
        twin.update(torch.tensor([NAN]))  # a copy made while applied defers its own reports
        with pytest.raises(RuntimeError, match=NAN_ERROR):
            twin.compute()
    assert _errors([metric.compute, metric.compute]) == ".."


def test_pickles_hold_nothing_of_tmpatch_and_load_where_it_cannot_be_imported(tmp_path):
    _apply()
    metrics = {}
    for name, (build, args, _) in CHECKPOINTED.items():
        metrics[name] = build()
        _feed(metrics[name], args)  # a pending report in each
    tmpatch.revert()  # the watch revert() puts on a metric's update is not pickled either
    expected = {}
    for name, metric in metrics.items():
        data = pickle.dumps(metric)
        assert b"tmpatch" not in data, name
        (tmp_path / f"{name}.pkl").write_bytes(data)
        expected[name] = [v.tolist() for v in _values(pickle.loads(data))]
    code = f"""
        import sys, pickle, warnings
        sys.modules["tmpatch"] = None  # importing tmpatch fails here
        warnings.simplefilter("ignore")
        for name in {sorted(metrics)!r}:
            metric = pickle.loads(open({str(tmp_path)!r} + "/" + name + ".pkl", "rb").read())
            value = metric.compute()
            values = [value[k] for k in sorted(value)] if isinstance(value, dict) else (
                list(value) if isinstance(value, tuple) else [value])
            print(name, repr([v.tolist() for v in values]))
    """
    lines = run_python(code).stdout.strip().splitlines()
    assert lines == [f"{name} {expected[name]!r}" for name in sorted(metrics)]
