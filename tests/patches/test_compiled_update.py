"""Metric updates inside torch.compile (CPU, ``backend="eager"``), patched and not.

What a compiled step that calls ``metric.update`` must show with tmpatch applied, on
every release: no crash, one graph (``fullgraph=True`` works, no break at all), no
recompile after the first step, states identical to eager updates, update counts equal
to the eager ones once host code reads them (the ``compiled_update`` patch counts on the
metric's device in the graph), and the deferred reports given at ``compute()``. Dynamo's
counters count the breaks; ``error_on_recompile`` catches a recompile.

Every release runs one compiled step over a metric of each family (one compile, a few
seconds) and a thousand steps of a few metrics. The per-family runs, the unpatched
controls and the reports run on COMPILE_RELEASES with torch 2.6+
(``TMPATCH_COMPILE_RELEASES=all`` or a comma list widens the releases). Nothing runs below
torch 2.5, where compiled updates are not supported.
"""
from __future__ import annotations

import os
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import pytest
import torch

import tmpatch
from tests.conftest import assert_bitwise, release_in
from tmpatch.control import settings
from tmpatch.runtime.compiled import reset_dynamo

dynamo = pytest.importorskip("torch._dynamo")
from torch._dynamo.utils import counters  # noqa: E402

#: one release per implementation of the formatters, _bincount and the NaN check, and the last
COMPILE_RELEASES = ("1.0.0", "1.4.0", "1.6.1", "1.9.0")

#: the break compiled_update makes on purpose under ``update_count="outside"``: the count raised eagerly
OWN_BREAK = "_increment"

N, C, L = 16, 5, 4


def _torch_at_least(major: int, minor: int) -> bool:
    return tuple(int(part) for part in torch.__version__.split(".")[:2]) >= (major, minor)


#: the compiled paths are made for torch 2.5+ (docs/guide/compile.rst): on 2.1-2.4 dynamo
#: breaks in torchmetrics' own Metric.__setattr__
pytestmark = pytest.mark.skipif(not _torch_at_least(2, 5), reason="torch.compile support starts at torch 2.5")


def _heavy() -> bool:
    if not _torch_at_least(2, 6):  # older torch of the matrix (2.5.1): the sample step only (CI time)
        return False
    chosen = os.environ.get("TMPATCH_COMPILE_RELEASES", "")
    if chosen == "all":
        return True
    releases = [r.strip() for r in chosen.split(",") if r.strip()] or list(COMPILE_RELEASES)
    return any(release_in(f"=={r}") for r in releases)


heavy = pytest.mark.skipif(not _heavy(), reason="on COMPILE_RELEASES with torch 2.6+ (TMPATCH_COMPILE_RELEASES=all "
                                                "widens the releases)")


# -- the metrics and their inputs ------------------------------------------------------
def _inputs(kind: str, seed: int) -> Tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    if kind == "value":
        return (torch.rand(N, generator=g),)
    if kind == "multiclass":
        return torch.rand(N, C, generator=g), torch.randint(0, C, (N,), generator=g)
    if kind == "binary":
        return torch.rand(N, generator=g), torch.randint(0, 2, (N,), generator=g)
    return torch.rand(N, L, generator=g), torch.randint(0, 2, (N, L), generator=g)


def _build(name: str, **extra: Any) -> Tuple[Any, str]:
    """A metric of torchmetrics by class name, with the arguments a user would give, and
    the kind of inputs its update takes."""
    import torchmetrics
    from torchmetrics import classification

    if hasattr(torchmetrics.aggregation, name):
        return getattr(torchmetrics.aggregation, name)(**extra), "value"
    kwargs: Dict[str, Any] = {"validate_args": False, **extra}
    if "AUROC" in name or "Curve" in name:
        kwargs.setdefault("thresholds", 20)
    cls = getattr(classification, name)
    if name.startswith("Multiclass"):
        return cls(num_classes=C, **kwargs), "multiclass"
    if name.startswith("Multilabel"):
        return cls(num_labels=L, **kwargs), "multilabel"
    return cls(**kwargs), "binary"


FAMILIES = {
    "aggregation": ("MeanMetric", "SumMetric", "MaxMetric", "MinMetric"),
    "multiclass stat scores": ("MulticlassAccuracy", "MulticlassF1Score", "MulticlassStatScores"),
    "binary and multilabel stat scores": ("BinaryAccuracy", "BinaryStatScores", "MultilabelF1Score"),
    "confusion matrices": ("BinaryConfusionMatrix", "MulticlassConfusionMatrix", "MultilabelConfusionMatrix"),
    "binned curves": ("BinaryAUROC", "MulticlassPrecisionRecallCurve", "MultilabelPrecisionRecallCurve"),
}

#: one metric of each family, updated together in the every-release run
SAMPLE = ("MeanMetric", "MulticlassAccuracy", "MultilabelF1Score", "MulticlassConfusionMatrix", "BinaryAUROC")


# -- a compiled run ------------------------------------------------------------------------
class Run:
    """What a compiled run showed: break reasons (-> count), whether a later step
    recompiled, the error that stopped it, and the metrics."""

    def __init__(self, metrics: List[Any]) -> None:
        self.metrics = metrics
        self.breaks: Dict[str, int] = {}
        self.recompiled = False
        self.error: Optional[BaseException] = None

    @property
    def foreign(self) -> List[str]:
        """Break reasons other than compiled_update's own (``update_count="outside"``)."""
        return [reason.splitlines()[0][:200] for reason in self.breaks if OWN_BREAK not in reason]


def compiled_run(names: Sequence[str], steps: int = 4, *, fullgraph: bool = True, holder: bool = False,
                 seeds: Optional[Sequence[int]] = None, inputs: Optional[Callable[[str, int], Tuple]] = None,
                 stop_on_recompile: bool = True, **extra: Any) -> Run:
    """Build the metrics (after ``apply()`` when the test applied it), then update them all
    in one compiled step (``fullgraph=True`` unless told), ``steps`` times with fresh inputs
    of the same shapes. ``holder``: the metrics are attributes of a compiled ``nn.Module``
    (else globals). ``stop_on_recompile``: a recompile after the first step ends the run."""
    built = [_build(name, **extra) for name in names]
    metrics = [metric for metric, _ in built]
    run = Run(metrics)
    make = inputs or _inputs
    batches = [[make(kind, seed * 31 + i) for i, (_, kind) in enumerate(built)] for seed in (seeds or range(steps))]

    def step(batch: List[Tuple]) -> None:
        for metric, args in zip(metrics, batch):
            metric.update(*args)

    if holder:
        class Holder(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.inner = torch.nn.ModuleList(metrics)

            def forward(self, batch: List[Tuple]) -> None:
                for metric, args in zip(self.inner, batch):
                    metric.update(*args)

        target: Callable = Holder()
    else:
        target = step
    reset_dynamo()
    counters.clear()
    fn = torch.compile(target, backend="eager", fullgraph=fullgraph)
    try:
        fn(batches[0])
        with dynamo.config.patch(error_on_recompile=stop_on_recompile):
            for batch in batches[1:]:
                fn(batch)
    except dynamo.exc.RecompileError:
        run.recompiled = True
    except Exception as exc:  # noqa: BLE001 - the run's outcome, asserted by the test
        run.error = exc
    run.breaks = dict(counters["graph_break"])
    run.batches = batches  # type: ignore[attr-defined]
    return run


def eager_metrics(names: Sequence[str], batches: List[List[Tuple]], **extra: Any) -> List[Any]:
    metrics = [_build(name, **extra)[0] for name in names]
    for batch in batches:
        for metric, args in zip(metrics, batch):
            metric.update(*args)
    return metrics


def states(metric: Any) -> Dict[str, Any]:
    return {key: getattr(metric, key) for key in metric._defaults}


def assert_same_states(run: Run, names: Sequence[str], **extra: Any) -> None:
    """The compiled run's states are those of the same updates made eagerly (patched), bit for
    bit, and so are the update counts (read by host code: the fold)."""
    expected = eager_metrics(names, run.batches, **extra)  # type: ignore[attr-defined]
    for name, metric, eager in zip(names, run.metrics, expected):
        want = states(eager)
        for key, value in states(metric).items():
            if isinstance(value, list):
                assert len(value) == len(want[key]), (name, key)
                for a, b in zip(value, want[key]):
                    assert_bitwise(a, b)
            else:
                assert_bitwise(value, want[key])
        assert metric._update_count == eager._update_count == len(run.batches), name  # type: ignore[attr-defined]


def assert_clean(run: Run) -> None:
    """One graph: no break (the run was compiled with ``fullgraph=True``), no recompile."""
    assert run.error is None, f"compiled step failed: {type(run.error).__name__}: {run.error}"
    assert not run.breaks, f"graph breaks: {[reason.splitlines()[0][:200] for reason in run.breaks]}"
    assert not run.recompiled, "a step after the first recompiled"


# -- every release ---------------------------------------------------------------------------
def test_a_compiled_step_over_every_family_is_one_graph():
    """Before the device count: ``fullgraph=True`` failed at the update count's
    ``torch.compiler.disable``-d increment (a break per update)."""
    tmpatch.apply()
    run = compiled_run(SAMPLE, steps=3)
    assert_clean(run)
    assert_same_states(run, SAMPLE)


def test_a_thousand_compiled_steps_recompile_nothing_and_count_every_update():
    names = ("MeanMetric", "MulticlassAccuracy", "MulticlassConfusionMatrix", "BinaryAUROC")
    tmpatch.apply()
    metrics = [_build(name)[0] for name in names]
    kinds = [_build(name)[1] for name in names]
    pool = [[_inputs(kind, seed * 7 + i) for i, kind in enumerate(kinds)] for seed in range(8)]

    def step(batch: List[Tuple]) -> None:
        for metric, args in zip(metrics, batch):
            metric.update(*args)

    reset_dynamo()
    counters.clear()
    fn = torch.compile(step, backend="eager", fullgraph=True)
    fn(pool[0])
    with dynamo.config.patch(error_on_recompile=True):
        for i in range(1, 1000):
            fn(pool[i % len(pool)])
    assert not counters["graph_break"]
    assert [metric._update_count for metric in metrics] == [1000] * len(metrics)
    eager = [_build(name)[0] for name in names]
    for i in range(1000):
        for metric, args in zip(eager, pool[i % len(pool)]):
            metric.update(*args)
    for metric, want in zip(metrics, eager):
        for key, value in states(metric).items():
            assert_bitwise(value, getattr(want, key))



def test_epochs_of_compiled_steps_with_compute_and_reset_between_recompile_nothing():
    """A training loop's epochs: compiled steps, then ``compute()`` and ``reset()`` of a collection
    (its states copied for the compute, then replaced by fresh tensors) and of plain metrics; the
    next epoch's steps run the same graph, and every epoch's results are the eager ones."""
    from torchmetrics import MetricCollection

    tmpatch.apply()

    def make() -> List[Any]:
        return [_build("MeanMetric")[0], MetricCollection([_build(name)[0] for name in COLLECTED]),
                _build("MulticlassConfusionMatrix")[0]]

    metrics, eager = make(), make()
    batches = [_inputs("multiclass", i) for i in range(4)]
    metrics[1].update(*batches[0])  # its compute groups
    eager[1].update(*batches[0])

    def step(held: List[Any], preds: torch.Tensor, target: torch.Tensor) -> None:
        held[0].update(preds.sum(1))
        for metric in held[1:]:
            metric.update(preds, target)

    reset_dynamo()
    counters.clear()
    fn = torch.compile(lambda p, t: step(metrics, p, t), backend="eager", fullgraph=True)
    fn(*batches[1])
    step(eager, *batches[1])
    with dynamo.config.patch(error_on_recompile=True):
        for epoch in range(3):
            for batch in batches[epoch % 2:]:
                fn(*batch)
                step(eager, *batch)
            for metric, want in zip(metrics, eager):
                got, expected = metric.compute(), want.compute()
                for key in expected if isinstance(expected, dict) else [None]:
                    assert_bitwise(got[key] if key else got, expected[key] if key else expected)
                if epoch != 1:  # and once, a compute without a reset
                    metric.reset()
                    want.reset()
    assert not counters["graph_break"]


# -- the update count ------------------------------------------------------------------------
def _compiled_accuracy(steps: int = 3) -> Tuple[Any, Callable[[], None]]:
    tmpatch.apply()
    metric = _build("MulticlassAccuracy")[0]
    batch = _inputs("multiclass", 0)
    reset_dynamo()
    fn = torch.compile(lambda: metric.update(*batch), backend="eager", fullgraph=True)
    for _ in range(steps):
        fn()
    return metric, fn


def test_the_count_waits_on_the_device_until_host_code_reads_it():
    from tmpatch.patches.compiled_update import tally_of
    from tmpatch.runtime.compiled import pending

    metric, _ = _compiled_accuracy(3)
    tally = tally_of(metric)
    assert pending.counts and int(tally.counter) == 3
    assert metric.__dict__["_update_count"] == 0  # what the release keeps, not yet folded
    assert metric._update_count == 3  # the read folds (update_called reads it: 1.0.0+)
    assert not pending.counts and int(tally.counter) == 0
    assert metric.__dict__["_update_count"] == 3


def test_compiled_then_eager_updates_count_both():
    metric, fn = _compiled_accuracy(2)
    metric.update(*_inputs("multiclass", 1))  # the eager increment reads the count: the fold first
    fn()
    assert metric._update_count == 4


def _relational_guards(fn: Callable[[], None]) -> List[str]:
    """The checks of ``fn``'s compiled entry that torch.compile runs as Python (two ways to one object)."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    entries = _debug_get_cache_entry_list(fn.__code__)
    assert len(entries) == 1
    return [line for line in str(entries[0].guard_manager).splitlines() if "LAMBDA_GUARD" in line]


@pytest.mark.skipif(not _torch_at_least(2, 6), reason="the guard manager's text names its Python checks from 2.6")
def test_a_counted_update_reaches_the_metrics_modules_one_way():
    """What compiled_update reads of a metric is reached the way torch's own code reaches it: no Python
    identity check per call (``_hold`` read ``metric._modules`` where ``Module.__setattr__`` reads
    ``metric.__dict__['_modules']``: a check per counted metric on every call)."""
    tmpatch.apply()
    metric = _build("MeanMetric")[0]
    value = _inputs("value", 0)[0]

    def step() -> None:
        metric.update(value)

    reset_dynamo()
    fn = torch.compile(step, backend="eager", fullgraph=True)
    fn()
    fn()
    assert not [line for line in _relational_guards(step) if "_modules" in line]


def test_reset_after_compiled_updates_discards_their_pending_count():
    metric, fn = _compiled_accuracy(3)
    metric.reset()
    assert metric._update_count == 0  # update_called reads it (1.0.0+)
    fn()
    assert metric._update_count == 1


def test_compute_after_compiled_updates_does_not_warn_of_no_update():
    metric, _ = _compiled_accuracy(1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the release warns when compute() comes before any update
        metric.compute()


def test_pickles_and_copies_carry_the_folded_count():
    import copy
    import pickle

    metric, _ = _compiled_accuracy(3)
    assert pickle.loads(pickle.dumps(metric))._update_count == 3
    metric2, _ = _compiled_accuracy(2)
    clone = copy.deepcopy(metric2)
    assert clone._update_count == 2 and "_tmpatch" not in str(sorted(metric2.__getstate__()))


def test_forward_after_compiled_updates_sees_their_count():
    """MeanMetric's forward (reduce-state update) weighs the global state by the count."""
    tmpatch.apply()
    metric, eager = _build("MeanMetric")[0], _build("MeanMetric")[0]
    values = [_inputs("value", i)[0] for i in range(4)]
    reset_dynamo()
    fn = torch.compile(lambda v: metric.update(v), backend="eager", fullgraph=True)
    for v in values[:3]:
        fn(v)
        eager.update(v)
    assert_bitwise(metric(values[3]), eager(values[3]))
    assert metric._update_count == eager._update_count == 4
    assert_bitwise(metric.compute(), eager.compute())


@pytest.mark.parametrize("name", ["MeanMetric", "MulticlassAccuracy"])  # reduce-state and full-state forward
def test_forward_in_compiled_code_counts_as_eager(name):
    """``forward()`` reads and restores the count around its update: in compiled code that read is
    a graph break (the fold) where the release's was a guard; the count is the eager one (the
    update's pending count is not added on top of the count forward writes back)."""
    tmpatch.apply()
    metric, eager = _build(name)[0], _build(name)[0]
    kind = _build(name)[1]
    reset_dynamo()
    fn = torch.compile(lambda args: metric(*args), backend="eager")
    for seed in range(3):
        args = _inputs(kind, seed)
        assert_bitwise(fn(args), eager(*args))
        assert metric._update_count == eager._update_count == seed + 1
    assert_bitwise(metric.compute(), eager.compute())


@pytest.mark.skipif(not release_in(">=1.0.0"), reason="the Running wrappers came in 1.0.0")
def test_a_wrapper_that_resets_its_metric_in_compiled_code_counts_as_eager():
    """RunningMean's update resets its base metric (a write of the count: in the graph on torch
    2.6+, with the tally zeroed) and its compute sets the base's count from its own. Its window
    slots start as one tensor, the base metric's default: no state is written in place there
    (1.0.0's slots all became one accumulating tensor, and the base's default with them)."""
    from torchmetrics.wrappers import Running

    tmpatch.apply()
    metric, eager = Running(_build("MeanMetric")[0], window=3), Running(_build("MeanMetric")[0], window=3)
    reset_dynamo()
    fn = torch.compile(lambda v: metric.update(v), backend="eager")
    for seed in range(5):
        value = _inputs("value", seed)[0]
        fn(value)
        eager.update(value)
    assert metric.base_metric._update_count == eager.base_metric._update_count == 0
    for key, default in eager.base_metric._defaults.items():
        assert_bitwise(metric.base_metric._defaults[key], default)
    assert_bitwise(metric.compute(), eager.compute())
    assert metric.base_metric._update_count == eager.base_metric._update_count


def test_revert_folds_pending_counts_and_takes_the_descriptor_away():
    from torchmetrics import Metric

    metric, _ = _compiled_accuracy(3)
    tmpatch.revert()
    assert "_update_count" not in vars(Metric)
    assert metric.__dict__["_update_count"] == 3 and metric._update_count == 3


def test_a_moved_metric_moves_its_counter():
    from tmpatch.audit import simulated_cuda, to_sim_cuda
    from tmpatch.patches.compiled_update import tally_of

    tmpatch.apply()
    metric = _build("MulticlassAccuracy")[0]
    metric.set_dtype(torch.float64)  # a cast: the counter stays an integer
    assert tally_of(metric).counter.dtype == torch.long
    with simulated_cuda():
        to_sim_cuda(metric)
        counter = tally_of(metric).counter
        assert counter.device.type == "cuda" and counter.dtype == torch.long and counter.dim() == 0


def test_a_new_metric_in_place_of_another_recompiles_nothing_and_counts_for_itself():
    if not _torch_at_least(2, 6):
        pytest.skip("torch 2.5 guards the identity of the metric's update (the release's too)")
    tmpatch.apply()
    box = [_build("MulticlassAccuracy")[0]]
    batch = _inputs("multiclass", 0)
    reset_dynamo()
    fn = torch.compile(lambda: box[0].update(*batch), backend="eager", fullgraph=True)
    fn()
    first = box[0]
    with dynamo.config.patch(error_on_recompile=True):
        box[0] = _build("MulticlassAccuracy")[0]
        fn()
        fn()
    assert first._update_count == 1 and box[0]._update_count == 2


# -- collections ------------------------------------------------------------------------------
COLLECTED = ("MulticlassAccuracy", "MulticlassPrecision", "MulticlassRecall", "MulticlassF1Score",
             "MulticlassConfusionMatrix")


@pytest.mark.parametrize("eager_first", [False, True], ids=["groups-not-formed", "groups-formed"])
def test_a_collection_updates_in_one_graph(eager_first):
    """A collection's first update merges its compute groups (deepcopy, allclose: breaks, and
    another path at the next step); its followers copy the leader's count (a guard)."""
    from torchmetrics import MetricCollection

    tmpatch.apply()

    def make() -> Any:
        return MetricCollection([_build(name)[0] for name in COLLECTED])

    collection, eager = make(), make()
    batches = [_inputs("multiclass", i) for i in range(5)]
    if eager_first:
        collection.update(*batches[0])
    reset_dynamo()
    counters.clear()
    fn = torch.compile(lambda p, t: collection.update(p, t), backend="eager", fullgraph=True)
    fn(*batches[1])
    with dynamo.config.patch(error_on_recompile=True):
        for batch in batches[2:]:
            fn(*batch)
    for batch in batches if eager_first else batches[1:]:
        eager.update(*batch)
    assert not counters["graph_break"]
    assert collection.compute_groups == eager.compute_groups if eager_first else len(collection.compute_groups) == 5
    assert [m._update_count for m in collection.values()] == [m._update_count for m in eager.values()]
    got, want = collection.compute(), eager.compute()
    assert sorted(got) == sorted(want)
    for key in want:
        assert_bitwise(got[key], want[key])


# -- per family (COMPILE_RELEASES) -------------------------------------------------------------
@heavy
def test_every_metric_of_every_family_compiles_cleanly():
    names = [name for family in sorted(FAMILIES) for name in FAMILIES[family]]  # one step: one compile
    tmpatch.apply()
    run = compiled_run(names, steps=3)
    assert_clean(run)
    assert_same_states(run, names)


@heavy
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_unpatched_the_same_step_breaks_elsewhere_or_fails(family):
    """The control: without tmpatch the step crashes or breaks in the update's own code."""
    run = compiled_run(FAMILIES[family], steps=1, fullgraph=False)
    assert run.error is not None or run.foreign


@heavy
def test_ignore_index_compiles_cleanly():
    names = ["MulticlassAccuracy", "MulticlassConfusionMatrix", "BinaryAUROC", "MultilabelConfusionMatrix"]
    tmpatch.apply()
    run = compiled_run(names, steps=3, ignore_index=1)
    assert_clean(run)
    assert_same_states(run, names, ignore_index=1)


@heavy
def test_a_nan_report_waits_for_compute_in_compiled_steps(caplog):
    """The release's words at the user's compute(); the note (how many updates) on the tmpatch logger."""
    tmpatch.apply()

    def with_nan(kind: str, seed: int) -> Tuple:
        values = torch.rand(N)
        values[seed % N] = float("nan")
        return (values,)

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        run = compiled_run(["MeanMetric", "SumMetric"], steps=3, inputs=with_nan, nan_strategy="warn")
        during = [str(w.message) for w in seen if "nan" in str(w.message).lower()]
        mean = run.metrics[0]
        with caplog.at_level("INFO", logger="tmpatch"):
            mean.compute()
        after = [str(w.message) for w in seen if "nan" in str(w.message).lower()]
    assert_clean(run)
    assert during == []
    assert len(after) == 1 and after[0].endswith(" `nan` values in tensor. Will be removed."), after
    assert [r for r in caplog.records if "in 3 update(s)" in r.getMessage()], caplog.records


@heavy
def test_a_wrappers_own_reset_in_a_compiled_update_keeps_the_report():
    """Running.update resets its base metric itself (deferred_reports' internal scope); in a
    compiled update that scope does not reach past the update count's graph break, so a settle
    point there neither reports (a read: a graph break) nor drops: the report waits for compute."""
    from torchmetrics.aggregation import MeanMetric
    from torchmetrics.wrappers import Running

    tmpatch.apply()
    metric = Running(MeanMetric(nan_strategy="error"), window=3)
    step = torch.compile(lambda x: metric.update(x), backend="eager")
    step(torch.tensor([1.0, float("nan")]))
    step(torch.tensor([2.0, 3.0]))
    with pytest.raises(RuntimeError, match="`nan` values"):
        metric.compute()
    metric.compute()


@heavy
def test_an_invalid_class_is_reported_at_compute_after_compiled_steps():
    tmpatch.apply()

    def with_bad_target(kind: str, seed: int) -> Tuple:
        preds, target = _inputs(kind, seed)
        target[0] = C + 2  # not a class
        return preds, target

    run = compiled_run(["MulticlassConfusionMatrix"], steps=3, inputs=with_bad_target)
    assert_clean(run)
    with pytest.raises(RuntimeError, match="3 value"):
        run.metrics[0].compute()
    run.metrics[0].reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the release's "compute before update"
        run.metrics[0].compute()  # reported once: nothing pending after reset


@heavy
def test_the_outside_policy_breaks_once_per_update_and_recompiles_nothing():
    names = ("MeanMetric", "MulticlassAccuracy")
    tmpatch.apply(update_count="outside")
    try:
        run = compiled_run(names, steps=3, fullgraph=False)
        assert run.error is None and not run.recompiled and not run.foreign
        assert any(OWN_BREAK in reason for reason in run.breaks)
        assert_same_states(run, names)
    finally:
        settings.set_policy("update_count", "device")


def test_metrics_built_dropped_or_updated_eagerly_between_steps_recompile_nothing():
    """torch.compile guards the length of a dict a traced closure holds: tmpatch's tables of
    books and of aggregator kinds change whenever a metric is built, collected or updated
    eagerly, so they must not be reachable that way from a traced update."""
    import gc

    from torchmetrics.aggregation import MeanMetric, SumMetric

    tmpatch.apply()
    metric = MeanMetric()

    def step(x: torch.Tensor) -> None:
        metric.update(x)

    reset_dynamo()
    compiled = torch.compile(step, backend="eager", fullgraph=True)
    compiled(torch.rand(N))
    with dynamo.config.patch(error_on_recompile=True):
        for _ in range(3):
            others = [SumMetric(), MeanMetric()]
            for other in others:  # eager updates: the kind cache learns their classes, counts fold
                other.update(torch.rand(4))
            del others
            gc.collect()  # their books and tallies go
            compiled(torch.rand(N))
    assert metric._update_count == 4


def test_the_xla_flag_is_a_bool_while_applied_and_the_releases_object_after_revert():
    import sys

    data = sys.modules["torchmetrics.utilities.data"]
    if not hasattr(data, "_XLA_AVAILABLE"):  # 0.10.0-0.11.1: no XLA branch, nothing to bind
        tmpatch.apply(["compiled_update"])
        assert not hasattr(data, "_XLA_AVAILABLE")
        return
    release = data._XLA_AVAILABLE
    tmpatch.apply(["compiled_update"])
    assert data._XLA_AVAILABLE is bool(release)
    tmpatch.revert()
    assert data._XLA_AVAILABLE is release


def test_compiled_updates_keep_their_states_tensors_as_static_inputs():
    """A CUDA graph (``mode="reduce-overhead"``) overwrites its outputs at the next replay and
    skips a graph that mutates an input that is not static: in compiled code a state an update
    replaces (``self.tp = self.tp + tp``) is written into the tensor it replaced, a static input
    (dynamo marks a module's tensors so). Eager updates replace their states, as released."""
    tmpatch.apply()

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.head = torch.nn.Linear(C, C)
            self.accuracy = _build("MulticlassAccuracy")[0]
            self.maximum = _build("MaxMetric")[0]

        def forward(self, preds: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
            logits = self.head(preds)
            self.accuracy.update(logits, target)
            self.maximum.update(logits.sum(1))
            return logits.sum()

    model, eager = Model(), Model()
    eager.load_state_dict(model.state_dict())
    metrics = (model.accuracy, model.maximum)
    tensors = [getattr(m, key) for m in metrics for key in m._defaults]
    reset_dynamo()
    fn = torch.compile(model, backend="eager", fullgraph=True)
    with torch.no_grad():
        for seed in range(3):
            batch = _inputs("multiclass", seed)
            fn(*batch)
            eager(*batch)
    now = [getattr(m, key) for m in metrics for key in m._defaults]
    assert all(a is b for a, b in zip(now, tensors))  # the same objects
    assert all(getattr(t, "_dynamo_static_input_type", None) for t in tensors)
    for mine, want in zip(metrics, (eager.accuracy, eager.maximum)):
        for key in want._defaults:
            assert_bitwise(getattr(mine, key), getattr(want, key))


@heavy
def test_with_inductor_integer_states_are_bit_for_bit_and_float_states_close():
    """inductor generates its own kernels: integer states (counts) are exact, floating ones
    (MeanMetric's sums) may differ in the last bits, as torch.compile's own results do."""
    names = ("MeanMetric", "MulticlassAccuracy", "MulticlassConfusionMatrix", "MulticlassPrecisionRecallCurve")
    tmpatch.apply()
    metrics = [_build(name)[0] for name in names]
    kinds = [_build(name)[1] for name in names]
    batches = [[_inputs(kind, seed * 7 + i) for i, kind in enumerate(kinds)] for seed in range(3)]

    def step(batch: List[Tuple]) -> None:
        for metric, args in zip(metrics, batch):
            metric.update(*args)

    reset_dynamo()
    counters.clear()
    fn = torch.compile(step, fullgraph=True)  # inductor
    for batch in batches:
        fn(batch)
    assert not counters["graph_break"]
    for metric, eager in zip(metrics, eager_metrics(names, batches)):
        assert metric._update_count == eager._update_count == 3
        for key in eager._defaults:
            got, want = getattr(metric, key), getattr(eager, key)
            if got.is_floating_point():
                torch.testing.assert_close(got, want)
            else:
                assert_bitwise(got, want)


def _labels_step(steps: int) -> Dict[str, Any]:
    """The published step (``benchmarks/compile_validate.py``) given class labels, with the input
    validation on: MeanMetric of the cross-entropy of 64 logits, and multiclass Accuracy, Precision,
    Recall and F1 (10 classes, ``validate_args=True``) updated with the logits' argmax, compiled
    (``backend="eager"``) after one eager update of each classification metric (the release's first
    compiled ``_bincount`` crashes on torch 2.6+ without it); ``steps`` steps. Dynamo's graph breaks
    and graphs at the first step, the graphs it compiled at each later step, and whether a frame
    compiled before was compiled again after the first step (a guard that failed: a recompile)."""
    from torchmetrics import MeanMetric
    from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score, MulticlassPrecision, MulticlassRecall

    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(64, 10, generator=g), torch.randint(0, 10, (64,), generator=g)) for _ in range(steps)]
    made = [MeanMetric()] + [cls(num_classes=10, validate_args=True) for cls in (
        MulticlassAccuracy, MulticlassPrecision, MulticlassRecall, MulticlassF1Score)]
    metrics = made[:1] + [_Labels(metric) for metric in made[1:]]
    with torch.no_grad():
        for metric in metrics[1:]:
            metric.update(*batches[0])

    def step(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            loss = torch.nn.functional.cross_entropy(logits, target)
            metrics[0].update(loss)
            for metric in metrics[1:]:
                metric.update(logits, target)
        return loss

    reset_dynamo()
    counters.clear()
    fn = torch.compile(step, backend="eager")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fn(*batches[0])
        out: Dict[str, Any] = {"breaks": sum(counters["graph_break"].values()), "reasons": sorted(
            reason.splitlines()[0][:100] for reason in counters["graph_break"]), "metrics": made, "later": [],
            "batches": batches, "recompiled": False}
        graphs = out["graphs"] = counters["stats"]["unique_graphs"]
        for batch in batches[1:]:
            try:
                with dynamo.config.patch(error_on_recompile=True):
                    fn(*batch)
            except dynamo.exc.RecompileError:
                out["recompiled"] = True
                break
            out["later"].append(counters["stats"]["unique_graphs"] - graphs)
            graphs = counters["stats"]["unique_graphs"]
    return out


class _Labels:
    """A metric updated with the argmax of the logits it is given (class labels)."""

    def __init__(self, metric: Any) -> None:
        self.metric = metric

    def update(self, logits: torch.Tensor, target: torch.Tensor) -> None:
        self.metric.update(logits.argmax(dim=1), target)


@heavy
def test_a_step_given_class_labels_with_validation_breaks_and_compiles_no_more_than_the_release():
    """Past the validation's data-dependent breaks dynamo runs the update's wrapper eagerly and
    compiles each function it calls as a frame of its own: tmpatch's count descriptor, read there,
    was one (its read a graph break, twice per update, and a recompile at the second step), and so
    was ``Metric.__setattr__``'s replacement (a guard on each name assigned: the recompile limit).
    They are inlined into traced code only (``compiled.inline_only``). One frame is new at the
    second step, not recompiled: MeanMetric's update, compiled at the first step inside
    ``Metric._wrap_update``'s wrapper, until dynamo gave up on that wrapper's code (a break inside
    its ``try``: a labels metric) and left it to run eagerly (the release's MeanMetric breaks in it
    first, at its NaN check)."""
    steps = 5
    release = _labels_step(steps)
    tmpatch.apply()
    patched = _labels_step(steps)
    assert not release["recompiled"]
    assert not patched["recompiled"], "a frame compiled again after the first step"
    assert patched["breaks"] <= release["breaks"], (patched["reasons"], release["reasons"])
    assert patched["graphs"] <= release["graphs"]
    assert patched["graphs"] + sum(patched["later"]) <= release["graphs"] + sum(release["later"])
    assert patched["later"][1:] == [0] * (steps - 2), patched["later"]  # nothing compiled after the second step
    assert not any("disable()" in reason for reason in patched["reasons"]), patched["reasons"]
    # what compiled_update guarantees: the count right after the step, states those of eager updates
    metrics = patched["metrics"]
    assert [metric._update_count for metric in metrics] == [steps] + [steps + 1] * 4
    eager = _labels_step_eager(patched["batches"])
    for mine, want in zip(metrics, eager):
        for key in want._defaults:
            assert_bitwise(getattr(mine, key), getattr(want, key))


def _labels_step_eager(batches: List[Tuple[torch.Tensor, torch.Tensor]]) -> List[Any]:
    """:func:`_labels_step`'s updates, made eagerly."""
    from torchmetrics import MeanMetric
    from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score, MulticlassPrecision, MulticlassRecall

    metrics = [MeanMetric()] + [cls(num_classes=10, validate_args=True) for cls in (
        MulticlassAccuracy, MulticlassPrecision, MulticlassRecall, MulticlassF1Score)]
    for metric in metrics[1:]:
        metric.update(batches[0][0].argmax(dim=1), batches[0][1])
    for logits, target in batches:
        metrics[0].update(torch.nn.functional.cross_entropy(logits, target))
        for metric in metrics[1:]:
            metric.update(logits.argmax(dim=1), target)
    return metrics


def test_revert_folds_while_the_descriptor_is_still_there(monkeypatch):
    """``after_revert`` folds the pending tallies before the engine takes the descriptor away
    (a read in between would otherwise miss the compiled updates' count)."""
    from torchmetrics import Metric

    from tmpatch.patches import compiled_update
    from tmpatch.runtime.compiled import pending

    seen = []
    fold = compiled_update.fold

    def watched() -> None:
        seen.append(vars(Metric).get("_update_count") is compiled_update._SLOT)
        fold()

    monkeypatch.setattr(compiled_update, "fold", watched)
    metric, _ = _compiled_accuracy(2)
    assert pending.counts
    tmpatch.revert(["compiled_update"])  # alone: another patch's revert may read the count first
    assert seen == [True] and "_update_count" not in vars(Metric)
    assert metric.__dict__["_update_count"] == 2


def test_what_another_tool_put_in_place_of_the_descriptor_or_the_flag_is_left_and_said():
    import sys

    from torchmetrics import Metric

    data = sys.modules["torchmetrics.utilities.data"]
    release = vars(data).get("_XLA_AVAILABLE")
    lazy = release is not None and not isinstance(release, bool)  # a RequirementCache the patch replaces
    theirs = property(lambda self: 0)
    assert tmpatch.apply(["compiled_update"])["compiled_update"].state == "applied"
    Metric._update_count = theirs
    if lazy:
        data._XLA_AVAILABLE = not data._XLA_AVAILABLE
    try:
        row = tmpatch.revert()["compiled_update"]
        assert "torchmetrics.metric.Metric._update_count was set again by another tool" in row.reason, row
        assert vars(Metric)["_update_count"] is theirs
        if lazy:
            assert "torchmetrics.utilities.data._XLA_AVAILABLE was set again" in row.reason, row
            assert data._XLA_AVAILABLE is not release
    finally:
        del Metric._update_count
        if lazy:
            data._XLA_AVAILABLE = release
