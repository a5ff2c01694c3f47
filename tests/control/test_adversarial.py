"""apply / revert / status under adversarial use, on every release of the matrix.

* revert() while a DDP test's mock holds ``gather_all_tensors`` or ``Metric._sync_dist``
  (and a rebuild or a rebinding that fails): it never raises, never stops half-way, and
  status() says what each target holds;
* ``os.fork()`` while another thread is inside apply()/revert(): the child is not stuck;
* apply() before torchmetrics is imported, then revert(): no default argument keeps
  tmpatch's wrapper;
* the inspection API on objects with odd attributes, and an unknown name in status();
* a batch whose error waits for compute() on a device (a NaN with ``nan_strategy="error"``, a
  target out of range) taken out of the metric before that compute: a checkpoint, ``torch.save``,
  a pickle, ``merge_state`` into another metric, ``reset()``: the error is given there, exactly
  once, and no copy of the data carries it away silently (on the CPU the release's error comes
  from the update itself, and nothing is left to carry).
"""
from __future__ import annotations

import io
import os
import pickle
import signal
import sys
import threading
import types
import warnings
from typing import List, Set, Tuple
from unittest import mock

import pytest
import torch
import torchmetrics  # noqa: E402  (the suite runs with torchmetrics imported)

import tmpatch
from tests.conftest import cpu_shortcuts, release_in, run_python, torch_at_least
from tmpatch import patches as catalogue
from tmpatch.control import api, gating
from tmpatch.engine.fingerprint import fingerprint
from tmpatch.engine.references import PatchError, resolve

needs_torch_2_5 = pytest.mark.skipif(not torch_at_least(2, 5), reason="coalesced_sync needs torch 2.5 or later")
needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="no os.fork here")


# -- what status() says against what each target holds ------------------------------------------
def _installed(name: str) -> List[Tuple[str, str]]:
    """The targets of ``name`` that apply() wraps on this release (modules loaded, code to repair)."""
    keys = []
    for target in gating.here(catalogue.load(name), catalogue.release()):
        if target.module not in sys.modules:
            continue
        try:
            value = resolve(target.module, target.qualname)[2]
        except PatchError:  # the release lacks it (0.10-0.11: a patch not needed there)
            continue
        variant = target.variant_for(fingerprint(tmpatch.get_original(value)))
        if variant is not None and not variant.fixed:
            keys.append((target.module, target.qualname))
    return keys


def assert_truthful(report) -> None:
    """Each applied patch's targets hold its active layer; no other target holds one."""
    applied = [row.name for row in report if row.state == "applied"]
    held: Set[Tuple[str, str]] = {key for name in applied for key in _installed(name)}
    wrong = [f"{name}: {'.'.join(key)} not patched" for name in applied for key in _installed(name)
             if not tmpatch.is_patched(resolve(*key)[2])]
    for row in report:
        if row.state == "applied" or row.state == "pending":
            continue
        wrong += [f"{row.name} ({row.state}): {'.'.join(key)} still patched" for key in _installed(row.name)
                  if key not in held and tmpatch.is_patched(resolve(*key)[2])]
    assert wrong == [], wrong


def _applied_everything():
    report = tmpatch.apply()
    applied = [row.name for row in report if row.state == "applied"]
    assert "deferred_reports" in applied
    return applied


def _mock_gather():
    return mock.patch("torchmetrics.utilities.distributed.gather_all_tensors", autospec=True)


def _mock_sync_dist():
    return mock.patch.object(torchmetrics.Metric, "_sync_dist", lambda self, *args, **kwargs: None)


# -- revert under a DDP test's mocks, and places that refuse ----------------------------------------
@needs_torch_2_5
@pytest.mark.parametrize("mocked", [_mock_gather, _mock_sync_dist], ids=["gather_all_tensors", "sync_dist_lambda"])
def test_revert_under_a_mock_restores_every_patch(mocked):
    """deferred_reports' removal from MetricCollection.compute (shared with coalesced_sync)
    rebuilt coalesced_sync's replacement, which fingerprinted the mock: FingerprintError (a
    lambda: SyntaxError or KeyError), deferred_reports half-reverted, status() saying applied."""
    applied = _applied_everything()
    with mocked():
        report = tmpatch.revert()
    assert {name: report[name].state for name in applied} == {name: "reverted" for name in applied}
    assert_truthful(tmpatch.status())
    assert tmpatch.apply()["coalesced_sync"].state == "applied"  # and it comes back
    assert_truthful(tmpatch.status())


@needs_torch_2_5
def test_reverting_deferred_reports_alone_under_a_mock_keeps_the_others_whole():
    applied = _applied_everything()
    with _mock_gather():
        report = tmpatch.revert(["deferred_reports"])
    assert report["deferred_reports"].state == "reverted"
    assert report["coalesced_sync"].state == "applied"  # its joined replacement is made of pieces built at apply
    assert {n: report[n].state for n in applied if n != "deferred_reports"} == \
        {n: "applied" for n in applied if n != "deferred_reports"}
    assert_truthful(tmpatch.status())


def test_two_edits_of_a_mocked_target_come_apart_from_the_release_function():
    """bincount and logits_check edit _binary_confusion_matrix_format together (up to 1.6.0):
    taking one off under a mock of it rejoins the other's edit to the function tmpatch's layer
    wraps, not to the mock (RewriteError: bincount taken out too); the copy the mock puts back
    on exit runs the layer's new one, without logits_check's edit (it ran both), and revert()
    takes it out (it stayed, and the next apply() found a closure it could not edit)."""
    from tmpatch.audit import audit

    module = sys.modules["torchmetrics.functional.classification.confusion_matrix"]

    def syncs():
        format_ = module._binary_confusion_matrix_format
        report = audit(lambda preds, target: format_(preds, target, 0.5, -1), torch.rand(16),
                       torch.randint(0, 2, (16,)), real=False)
        return {point.op for point in report.sync_points if point.function == "_binary_confusion_matrix_format"}

    release, function = syncs(), module._binary_confusion_matrix_format
    report = tmpatch.apply(["bincount", "logits_check"])
    if {report["bincount"].state, report["logits_check"].state} != {"applied"}:
        pytest.skip("bincount and logits_check do not both apply on this release")
    assert "aten._local_scalar_dense" in release - syncs()  # logits_check's edit at work
    with mock.patch.object(module, "_binary_confusion_matrix_format"):
        report = tmpatch.revert("logits_check")
    assert (report["bincount"].state, report["logits_check"].state) == ("applied", "reverted"), report
    assert syncs() == release  # bincount's edit leaves the release's syncs outside a recorded update
    tmpatch.revert()
    assert module._binary_confusion_matrix_format is function  # the copy the mock put back is taken out too


@needs_torch_2_5
def test_a_shared_target_that_cannot_be_rebuilt_takes_its_other_patch_out_and_says_so(monkeypatch):
    """Should the joined replacement of the patches left on a shared target fail after all, the
    layer goes, and so does each of those patches (a patch is whole or not at all): status names
    the target and why."""
    from torchmetrics import Metric, MetricCollection

    originals = vars(Metric)["_sync_dist"], vars(MetricCollection)["compute"]
    report = tmpatch.apply(["deferred_reports", "coalesced_sync"])
    assert report["coalesced_sync"].state == "applied"

    def refuse(*args, **kwargs):
        raise RuntimeError("cannot join")

    monkeypatch.setattr(gating, "joined", refuse)
    report = tmpatch.revert(["deferred_reports"])
    row = report["coalesced_sync"]
    assert row.state == "failed", row
    assert "torchmetrics.collections.MetricCollection.compute could not be rebuilt without deferred_reports " \
           "(RuntimeError: cannot join)" in row.reason, row.reason
    assert report["deferred_reports"].state == "reverted"
    assert "coalesced_sync could not keep torchmetrics.collections.MetricCollection.compute" in \
        report["deferred_reports"].reason
    assert (vars(Metric)["_sync_dist"], vars(MetricCollection)["compute"]) == originals
    assert_truthful(tmpatch.status())
    monkeypatch.undo()
    assert tmpatch.apply(["coalesced_sync"])["coalesced_sync"].state == "applied"


class _Refusing(types.ModuleType):
    """A module that, once told to, refuses to have ``_bincount`` set (a frozen namespace)."""

    refuse = False

    def __setattr__(self, name, value):
        if self.refuse and name == "_bincount":
            raise AttributeError("read-only module")
        super().__setattr__(name, value)


def test_a_binding_that_refuses_the_original_is_named_and_the_rest_go_back():
    from torchmetrics.utilities import data

    original = data._bincount
    holder = _Refusing("tmpatch_probe_refusing")
    holder._bincount = original
    sys.modules[holder.__name__] = holder
    try:
        if tmpatch.apply("bincount")["bincount"].state != "applied":
            pytest.skip("bincount is not applied on this release")
        assert tmpatch.is_patched(holder._bincount)
        _Refusing.refuse = True
        report = tmpatch.revert()
        assert report["bincount"].state == "reverted"
        assert "tmpatch_probe_refusing._bincount refused the original (AttributeError: read-only module)" in \
            report["bincount"].reason, report["bincount"].reason
        assert data._bincount is original and not tmpatch.is_patched(holder._bincount)
        # it passes through
        assert holder._bincount(__import__("torch").tensor([0, 2]), minlength=3).tolist() == [1, 0, 1]
    finally:
        _Refusing.refuse = False
        del sys.modules[holder.__name__]


# -- os.fork() while another thread holds the engine ------------------------------------------
def _in_child(body) -> int:
    """Fork; run ``body()`` in the child (30 s at most: a stuck child is killed); its exit status."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            signal.alarm(30)
            code = 0 if body() else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) if hasattr(os, "waitstatus_to_exitcode") else status


def _child_works() -> bool:
    tmpatch.status()
    states = tmpatch.apply("mean_default_weight").states()
    tmpatch.revert()
    return states["mean_default_weight"] == "applied" and \
        not tmpatch.is_patched(vars(torchmetrics.MeanMetric)["update"])


@needs_fork
def test_a_fork_while_another_thread_holds_the_lock_gives_the_child_a_lock_of_its_own(monkeypatch):
    """A thread that stays inside apply() past the fork's wait: the child's copy of the lock was
    held by a thread the child does not have, and status() waited for ever."""
    from tmpatch.engine import core as engine

    monkeypatch.setattr(engine, "FORK_WAIT_S", 0.05)
    held, done = threading.Event(), threading.Event()

    def hold():
        with api._engine.lock:
            held.set()
            done.wait(30)

    thread = threading.Thread(target=hold)
    thread.start()
    try:
        assert held.wait(10)
        assert _in_child(_child_works) == 0
    finally:
        done.set()
        thread.join()


@needs_fork
def test_a_fork_during_apply_and_revert_waits_for_them_to_finish():
    """The child starts from a finished apply or revert: status() is what the layers are."""
    stop = threading.Event()

    def churn():
        while not stop.is_set():
            tmpatch.apply(["mean_default_weight", "bincount"])
            tmpatch.revert()

    thread = threading.Thread(target=churn)
    thread.start()
    try:
        codes = [_in_child(lambda: (assert_truthful(tmpatch.status()), _child_works())[1]) for _ in range(3)]
    finally:
        stop.set()
        thread.join()
    assert codes == [0, 0, 0]


# -- apply() before import, then revert() --------------------------------------------------
def test_apply_before_import_then_revert_leaves_no_wrapper_in_a_default():
    """On 1.0-1.5.2 torchmetrics.metric bound gather_autograd's wrapper as _sync_dist's default
    on import, under coalesced_sync's layer where revert did not look; a later
    apply("coalesced_sync") then took the release's uncoalesced path."""
    proc = run_python(r"""
        import sys, types, tempfile, os
        import tmpatch
        tmpatch.apply()
        import torchmetrics
        from torchmetrics.metric import Metric
        from torchmetrics.utilities import distributed
        report = tmpatch.revert()
        assert vars(Metric)["_sync_dist"].__defaults__[0] is distributed.gather_all_tensors

        def ours(value):
            return tmpatch.get_original(value) is not value
        left = []
        for name, module in list(sys.modules.items()):
            if not name.startswith("torchmetrics"):
                continue
            for attr, value in list(vars(module).items()):
                if ours(value):
                    left.append(f"{name}.{attr}")
                members = list(vars(value).values()) if isinstance(value, type) else [value]
                for func in members:
                    while isinstance(func, types.FunctionType):  # the function and those it wraps
                        defaults = list(func.__defaults__ or ()) + list((func.__kwdefaults__ or {}).values())
                        left += [f"{name}.{func.__qualname__}() default" for d in defaults if ours(d)]
                        func = func.__dict__.get("__wrapped__")
        assert left == [], left

        import torch, torch.distributed as dist
        if tmpatch.apply("coalesced_sync")["coalesced_sync"].state == "applied":
            dist.init_process_group("gloo", init_method="file://" + os.path.join(tempfile.mkdtemp(), "store"),
                                    rank=0, world_size=1)
            calls = []
            for op in ("barrier", "all_gather"):
                def counted(*args, _op=op, _fn=getattr(dist, op), **kwargs):
                    calls.append(_op)
                    return _fn(*args, **kwargs)
                setattr(dist, op, counted)
            metric = torchmetrics.SumMetric()
            metric.add_state("other", default=torch.zeros(3), dist_reduce_fx="sum")
            metric.update(torch.tensor([1.0, 2.0]))
            metric.compute()
            assert calls == ["all_gather", "all_gather"], calls  # coalesced: not a barrier per state
            dist.barrier()
            dist.destroy_process_group()
        print("ok")
    """)
    assert proc.stdout.strip().endswith("ok")


# -- the inspection API on odd objects -----------------------------------------------------
class _RaisingGetattr:
    def __getattr__(self, name):
        raise RuntimeError(f"no {name} here")


class _UnhashableKey:
    _self_tmpatch_key = (["torchmetrics.utilities.data"], "_bincount")


class _KeyOfAnother:
    """An object carrying the key of a real layer: not that layer's wrapper."""


@pytest.mark.parametrize("odd", [_RaisingGetattr(), _UnhashableKey(), _KeyOfAnother(), ["a"], None],
                         ids=["getattr_raises", "unhashable_key", "key_of_another", "list", "none"])
def test_inspection_never_raises_for_another_objects_attributes(odd):
    tmpatch.apply("mean_default_weight")
    _KeyOfAnother._self_tmpatch_key = vars(torchmetrics.MeanMetric)["update"]._self_tmpatch_key
    assert tmpatch.is_patched(odd) is False
    assert tmpatch.get_original(odd) is odd


def test_an_unknown_name_in_status_names_the_valid_ones():
    report = tmpatch.status()
    with pytest.raises(KeyError) as caught:
        report["safe_divid"]
    text = str(caught.value)
    assert text.startswith("unknown patch name(s) 'safe_divid' (did you mean 'safe_divide'?); valid names: "), text
    assert ", ".join(catalogue.NAMES) in text
    assert report["safe_divide"].name == "safe_divide" and report[0].name == catalogue.NAMES[0]


# -- a bad batch taken out of the metric before its compute() ------------------------------------
NAN = float("nan")


def _nan_metric():
    from torchmetrics.aggregation import MeanMetric

    return MeanMetric(nan_strategy="error")


def _range_metric():
    from torchmetrics.classification import MulticlassAccuracy

    return MulticlassAccuracy(num_classes=3, validate_args=False)


SPELLING = "Encounted" if release_in("<1.2.1") else "Encountered"

#: the metric, a good batch, a bad one (upstream raises in update()), the deferred error's start:
#: the release's words, then tmpatch's note
BAD_BATCHES = {
    "nan": (_nan_metric, (torch.tensor([2.0, 6.0]),), (torch.tensor([NAN, 4.0]),),
            f"{SPELLING} `nan` values in tensor (tmpatch nan_check: MeanMetric saw NaN in 1 update(s)"),
    "out of range": (_range_metric, (torch.tensor([0, 1, 2]), torch.tensor([0, 1, 2])),
                     (torch.tensor([0, 1, 2]), torch.tensor([0, 3, 2])),
                     "shape '[3, 3]' is invalid for input of size larger than 9 (tmpatch bincount: 1 value(s)"),
}


def _checkpoint(metric, build):
    resumed = build()
    resumed.persistent(True)
    resumed.load_state_dict(metric.state_dict())
    return resumed


def _torch_save(metric, build):
    buffer = io.BytesIO()
    torch.save(metric, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False) if torch_at_least(1, 13) else torch.load(buffer)


def _merged(metric, build):
    other = build()
    other.merge_state(metric)
    return other


def _reset(metric, build):
    metric.reset()
    return metric


#: where the data leaves the metric (or is dropped): what carries it on
JOURNEYS = {
    "state_dict/load_state_dict": _checkpoint,
    "torch.save/torch.load": _torch_save,
    "pickle": lambda metric, build: pickle.loads(pickle.dumps(metric)),
    "merge_state": _merged,
    "reset": _reset,
}


def _journey_after_a_bad_update(case: str, journey: str) -> Tuple[type, str, str]:
    """The error of the bad update (type, words), and what the journey and the computes after it
    did (``.`` done, ``E`` raised)."""
    build, good, bad, _ = BAD_BATCHES[case]
    metric = build()
    metric.persistent(True)
    metric.update(*good)
    with pytest.raises((RuntimeError, IndexError)) as raised:  # IndexError: 0.10.0-0.10.1's index_add_
        metric.update(*bad)
    done = ""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "compute before update" after a reset
        for call in (lambda: JOURNEYS[journey](metric, build).compute(), metric.compute):
            try:
                call()
                done += "."
            except RuntimeError:
                done += "E"
    return type(raised.value), str(raised.value), done


def _has_journey(journey: str) -> None:
    if journey == "merge_state" and not hasattr(torchmetrics.Metric, "merge_state"):
        pytest.skip("merge_state from 1.6.0")


@pytest.mark.parametrize("journey", sorted(JOURNEYS))
@pytest.mark.parametrize("case", sorted(BAD_BATCHES))
def test_on_the_cpu_a_bad_batch_raises_in_its_update_as_the_release(case, journey):
    """On the CPU the release's own check: its error, from the bad update itself; the batch never
    reaches the state, so the journey and the computes after it are silent."""
    _has_journey(journey)
    release = _journey_after_a_bad_update(case, journey)
    assert release[2] == "..", release
    _applied_everything()
    assert _journey_after_a_bad_update(case, journey) == release


@pytest.mark.usefixtures("held_reports")  # the error still pending, as on a GPU before its copy lands
@pytest.mark.parametrize("journey", sorted(JOURNEYS))
@pytest.mark.parametrize("case", sorted(BAD_BATCHES))
def test_a_bad_batch_never_leaves_the_metric_without_its_error(case, journey):
    """The release raises in update(), and the batch never reaches the state. Patched on a device,
    the batch is in the state and its error waits for compute(): taking the data out first gives
    the error there, once; the copy and the original then compute silently (the error was given)."""
    _has_journey(journey)
    build, good, bad, words = BAD_BATCHES[case]
    _applied_everything()
    cpu_shortcuts(False)  # the path a GPU takes (on the CPU: the test above)
    metric = build()
    metric.persistent(True)
    metric.update(*good)
    metric.update(*bad)
    with pytest.raises(RuntimeError) as raised:
        JOURNEYS[journey](metric, build)
    assert str(raised.value).startswith(words), raised.value
    resumed = JOURNEYS[journey](metric, build)  # given once: now the data goes
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "compute before update" after a reset
        resumed.compute()
        metric.compute()
