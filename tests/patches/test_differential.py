"""Differential: every patched metric family on the CPU, the release against tmpatch, in one process.

Each example is a :class:`~tests.patches.differential.Case` (a metric's constructor and its calls,
as source) run on metrics built with tmpatch reverted, then on metrics built after ``tmpatch.apply()``:
per call the results, exceptions (type, message, which call), warnings (message, category, the file
they are attributed to, count), every metric state and the caller's inputs must be the release's,
bit for bit, over ``forward()``, ``update()`` + ``compute()``, ``reset()``, inside a MetricCollection
(shared compute groups) and in torch's deterministic mode, except where a deliberate correction
(:data:`~tests.patches.differential.CORRECTIONS`) accounts for the difference. A failure prints each
difference and a reproducer.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import pytest
from hypothesis import HealthCheck, Phase, event, given, settings, strategies as st

from tests.conftest import EXPLORE, examples, release_in
from tests.patches.differential import Case, accepts, check_all, has, tensor_source

pytestmark = pytest.mark.filterwarnings("ignore")

#: per test: the examples' count (``examples`` scales it); the file's cost is kept in a CI budget
COUNT = 4
BATCH = 4
#: no shrinking but with TMPATCH_HYPOTHESIS=explore: a case is a few calls on small tensors already, and
#: shrinking a batch of them costs minutes; the failure prints each failing case's reproducer
SETTINGS = settings(max_examples=examples(COUNT), deadline=None,
                    phases=tuple(Phase) if EXPLORE else tuple(p for p in Phase if p is not Phase.shrink),
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

NAN, INF = float("nan"), float("inf")
FINITE = [0.0, 1.0, -2.5, 3.0, 0.5]
SPECIAL = [NAN, INF, -INF]


def run(cases: Sequence[Case]) -> None:
    """Check ``cases`` (one apply() for them all); name the corrections they relied on (hypothesis' statistics)."""
    for name in check_all(cases):
        event(f"correction: {name}")


def batch(cases: Any) -> Any:
    """Up to :data:`BATCH` cases per example: tmpatch.apply() and revert() cost more than a case."""
    return st.lists(cases, min_size=1, max_size=BATCH)


def _steps(draw: Any, args: Sequence[str], forward: bool) -> Tuple[Tuple[str, str], ...]:
    """Calls over ``args`` (one argument source per batch): each an update() or a forward(), a
    compute() after them, maybe a reset() and one more batch with its compute()."""
    calls: List[Tuple[str, str]] = []
    for source in args[:-1] if len(args) > 1 else args:
        calls.append(("forward" if forward and draw(st.booleans()) else "update", source))
    calls.append(("compute", ""))
    if len(args) > 1:
        if draw(st.booleans()):
            calls.append(("reset", ""))
        calls.append(("forward" if forward else "update", args[-1]))
        calls.append(("compute", ""))
    return tuple(calls)


# --- aggregators -------------------------------------------------------------------------------------------------

AGGREGATORS = [name for name in ("SumMetric", "MeanMetric", "MaxMetric", "MinMetric", "CatMetric", "RunningMean",
                                 "RunningSum") if has(name)]
STRATEGIES: List[Any] = ["ignore", "warn", "error", 0.0, 2.5, -1.0] + (["disable"] if release_in(">=1.6.2") else [])


@st.composite
def values(draw: Any, shape: Optional[Tuple[int, ...]] = None, special: bool = True) -> Tuple[str, Any]:
    """An aggregator input: a Python scalar, or a float tensor with NaN/inf maybe, maybe requiring grad."""
    pool = FINITE + (SPECIAL if special else [])
    if shape is None and draw(st.integers(0, 5)) == 0:
        value = draw(st.sampled_from(pool))
        return repr(value), [value]
    if shape is None:
        shape = draw(st.sampled_from([(0,), (1,), (3,), (2, 2)]))
    count = 1
    for s in shape:
        count *= s
    flat = draw(st.lists(st.sampled_from(pool), min_size=count, max_size=count))
    nested: Any = flat if len(shape) == 1 else [flat[i * shape[1]:(i + 1) * shape[1]] for i in range(shape[0])]
    dtype = draw(st.sampled_from(["float32", "float32", "float64", "float16"]))
    grad = draw(st.integers(0, 4)) == 0
    return tensor_source(nested, dtype, grad), flat


def _imputed(flat: List[Any], strategy: float) -> List[Any]:
    return [strategy if v != v else v for v in flat]


@st.composite
def aggregator_cases(draw: Any) -> Case:
    name = draw(st.sampled_from(AGGREGATORS))
    strategy = draw(st.sampled_from(STRATEGIES))
    kwargs = [f"nan_strategy={strategy!r}"]
    if name.startswith("Running"):
        kwargs.insert(0, f"window={draw(st.integers(1, 3))}")
    tags = set()
    batches: List[str] = []
    corrected: List[str] = []
    nan_seen = False
    for _ in range(draw(st.integers(1, 3))):
        source, flat = draw(values())
        weight_source = None
        weight_flat: List[Any] = []
        if name == "MeanMetric" and draw(st.booleans()):
            if draw(st.booleans()) and source.startswith("T("):
                shape = _shape_of(flat, source)
                weight_source, weight_flat = draw(values(shape=shape))
            else:
                weight_source = repr(draw(st.sampled_from([0.5, 2.0, NAN])))
                weight_flat = [float(weight_source)] if weight_source != "nan" else [NAN]
                tags.add("broadcast_weight")
        nan_here = any(v != v for v in flat + weight_flat)
        nan_seen = nan_seen or nan_here
        batches.append(source if weight_source is None else f"{source}, {weight_source}")
        if isinstance(strategy, float) and nan_here:
            tags.add("impute")
            nan_at = [v != v for v in flat]
            if weight_source is not None and len(weight_flat) == len(flat):
                nan_at = [a or (w != w) for a, w in zip(nan_at, weight_flat)]
            elif weight_source == "nan":
                nan_at = [True] * len(flat)
            value_fixed = [strategy if bad else v for v, bad in zip(flat, nan_at)]
            fixed = _resourced(source, value_fixed)
            if weight_source is not None:
                if len(weight_flat) == len(flat):
                    fixed += ", " + _resourced(weight_source, [1.0 if bad else w
                                                               for w, bad in zip(weight_flat, nan_at)])
                else:
                    fixed += ", " + ("1.0" if weight_flat[0] != weight_flat[0] else weight_source)
            corrected.append(fixed)
        else:
            corrected.append(batches[-1])
        if strategy == "disable" and weight_source is not None:
            tags.add("disable_weight")
    forward = draw(st.booleans())
    steps = _steps(draw, batches, forward)
    fixed_steps = _steps_like(steps, batches, corrected)
    return Case(f"{name}({', '.join(kwargs)})", steps, draw(st.booleans()), frozenset(tags),
                fixed_steps if "impute" in tags else None)


def _shape_of(flat: List[Any], source: str) -> Tuple[int, ...]:
    return (len(flat),) if not source.startswith("T([[") else (2, 2)


def _resourced(source: str, flat: List[Any]) -> str:
    """``source`` (a scalar or a ``T(...)``) with its values replaced by ``flat``."""
    if not source.startswith("T("):
        return repr(flat[0])
    inner, rest = source[2:].split("]", 1) if not source.startswith("T([[") else (None, None)
    if inner is None:
        nested = [flat[0:2], flat[2:4]]
        rest = source[source.rindex("]]") + 2:]
        return f"T({nested!r}{rest}"
    return f"T({flat!r}{rest}"


def _steps_like(steps: Tuple[Tuple[str, str], ...], batches: List[str], fixed: List[str]) -> Tuple[Tuple[str, str],
                                                                                                       ...]:
    swap = dict(zip(batches, fixed))
    return tuple((call, swap.get(args, args)) for call, args in steps)


@SETTINGS
@given(batch(aggregator_cases()))
def test_aggregators(cases: List[Case]) -> None:
    run(cases)


@st.composite
def aggregator_collection_cases(draw: Any) -> Case:
    """Sum, Mean, Max, Min (and Cat) in one MetricCollection, one nan_strategy, the same tensors."""
    strategy = draw(st.sampled_from(STRATEGIES))
    members = [name for name in ("SumMetric", "MeanMetric", "MaxMetric", "MinMetric", "CatMetric")
               if draw(st.booleans()) or name == "SumMetric"]
    batches = [draw(values(shape=(3,))) for _ in range(draw(st.integers(1, 3)))]
    sources = [source for source, _ in batches]
    impute = isinstance(strategy, float) and any(v != v for _, flat in batches for v in flat)
    make = "MetricCollection([" + ", ".join(f"{m}(nan_strategy={strategy!r})" for m in members) + "])"
    steps = _steps(draw, sources, draw(st.booleans()))
    corrected = _steps_like(steps, sources, [_resourced(s, _imputed(flat, strategy)) if impute else s
                                             for s, flat in batches]) if impute else None
    return Case(make, steps, draw(st.booleans()), frozenset({"impute"} if impute else ()), corrected)


@SETTINGS
@given(batch(aggregator_collection_cases()))
def test_aggregators_in_a_collection(cases: List[Case]) -> None:
    run(cases)


# --- classification: stat scores, confusion matrices, binned curves -------------------------------------------------

C = 3  # classes / labels


def _ints(draw: Any, count: int, low: int, high: int) -> List[int]:
    return draw(st.lists(st.integers(low, high), min_size=count, max_size=count))


def _probs(draw: Any, count: int) -> List[float]:
    return draw(st.lists(st.sampled_from([0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0]), min_size=count, max_size=count))


@st.composite
def classification_cases(draw: Any, collection: bool = False) -> Case:
    task = draw(st.sampled_from(["binary", "multiclass", "multilabel"]))
    kinds = ["Accuracy", "Precision", "StatScores", "ConfusionMatrix", "JaccardIndex", "AUROC", "ROC",
             "PrecisionRecallCurve"]
    prefix = task.capitalize()
    curve_kinds = ("AUROC", "ROC", "PrecisionRecallCurve")
    if collection:
        chosen = [k for k in kinds if draw(st.booleans())] or ["Accuracy", "Precision"]
    else:
        chosen = [draw(st.sampled_from(kinds))]
    chosen = [k for k in chosen if has(prefix + k)]
    curves = any(k in curve_kinds for k in chosen)
    ignore_index = draw(st.sampled_from([None, None, -1, 1]))
    validate = draw(st.booleans())
    common = [] if validate else ["validate_args=False"]
    if ignore_index is not None:
        common.append(f"ignore_index={ignore_index}")
    size = {"binary": [], "multiclass": [f"num_classes={C}"], "multilabel": [f"num_labels={C}"]}[task]
    average = draw(st.sampled_from(["micro", "macro", None])) if task != "binary" else None
    thresholds = draw(st.sampled_from([3, 5, [0.0, 0.5, 1.0]]))
    makes = []
    for kind in chosen:
        args = list(size)
        if kind in ("Accuracy", "Precision", "StatScores", "JaccardIndex") and task != "binary" \
                and accepts(prefix + kind, "average"):
            args.append(f"average={average!r}")
        if kind in curve_kinds:
            args.append(f"thresholds={thresholds!r}")
            if kind == "AUROC" and task != "binary":
                args.append("average='macro'")
        makes.append(f"{prefix}{kind}({', '.join(args + common)})")
    tags = {"checked"}
    label_preds = task == "multiclass" and not curves and draw(st.booleans())
    wide = draw(st.integers(0, 3)) == 0  # values outside the classes
    batches = []
    for _ in range(draw(st.integers(1, 3))):
        n = draw(st.integers(1, 4))
        if task == "binary":
            preds = tensor_source(_probs(draw, n) if not wide else draw(st.lists(
                st.sampled_from([-2.0, 0.3, 0.8, 4.0]), min_size=n, max_size=n)))
            target = tensor_source(_ints(draw, n, -1 if wide else 0, 2 if wide else 1), "int64")
        elif task == "multiclass":
            if label_preds:
                preds = tensor_source(_ints(draw, n, -1 if wide else 0, C + 1 if wide else C - 1), "int64")
            else:
                preds = tensor_source([_probs(draw, C) for _ in range(n)])
            target = tensor_source(_ints(draw, n, -1 if wide else 0, C + 1 if wide else C - 1), "int64")
        else:
            preds = tensor_source([_probs(draw, C) for _ in range(n)])
            target = tensor_source([_ints(draw, C, -1 if wide else 0, 2 if wide else 1) for _ in range(n)], "int64")
        batches.append(f"{preds}, {target}")
    if wide and (task == "multilabel" or curves or average == "micro"):
        tags.add("silent_miscount")
    make = makes[0] if not collection else "MetricCollection([" + ", ".join(makes) + "])"
    forward = draw(st.booleans())
    return Case(make, _steps(draw, batches, forward), draw(st.booleans()), frozenset(tags))


@SETTINGS
@given(batch(classification_cases()))
def test_classification(cases: List[Case]) -> None:
    run(cases)


@SETTINGS
@given(batch(classification_cases(collection=True)))
def test_classification_in_a_collection(cases: List[Case]) -> None:
    run(cases)


# --- retrieval -----------------------------------------------------------------------------------------------------

RETRIEVAL = [name for name in ("RetrievalMAP", "RetrievalMRR", "RetrievalPrecision", "RetrievalRecall",
                               "RetrievalFallOut", "RetrievalHitRate", "RetrievalRPrecision", "RetrievalAUROC",
                               "RetrievalNormalizedDCG") if has(name)]


@st.composite
def retrieval_cases(draw: Any) -> Case:
    name = draw(st.sampled_from(RETRIEVAL))
    args = [f"empty_target_action={draw(st.sampled_from(['neg', 'pos', 'skip', 'error']))!r}"]
    if accepts(name, "ignore_index") and draw(st.booleans()):
        args.append("ignore_index=-1")
    if accepts(name, "top_k") and draw(st.booleans()):
        args.append("top_k=2")
    graded = draw(st.integers(0, 2)) == 0
    boolean = not graded and draw(st.booleans())
    batches = []
    for _ in range(draw(st.integers(1, 3))):
        n = draw(st.integers(1, 5))
        preds = tensor_source(_probs(draw, n))
        if boolean:
            target = tensor_source(draw(st.lists(st.booleans(), min_size=n, max_size=n)), "bool")
        else:
            target = tensor_source(_ints(draw, n, -1 if graded else 0, 3 if graded else 1), "int64")
        indexes = tensor_source(_ints(draw, n, 0, 2), "int64")
        batches.append(f"{preds}, {target}, indexes={indexes}")
    forward = draw(st.booleans())
    return Case(f"{name}({', '.join(args)})", _steps(draw, batches, forward), draw(st.booleans()),
                frozenset({"checked"}))


@SETTINGS
@given(batch(retrieval_cases()))
def test_retrieval(cases: List[Case]) -> None:
    run(cases)


# --- nominal, fairness, hinge losses, regression -------------------------------------------------------------------

NOMINAL = [name for name in ("CramersV", "TheilsU", "TschuprowsT", "PearsonsContingencyCoefficient") if has(name)]


@st.composite
def nominal_cases(draw: Any) -> Case:
    name = draw(st.sampled_from(NOMINAL))
    strategy = draw(st.sampled_from(["replace", "drop"]))
    wide = draw(st.integers(0, 3)) == 0
    floats = draw(st.booleans())
    batches = []
    for _ in range(draw(st.integers(1, 3))):
        n = draw(st.integers(2, 6))
        pair = []
        for _ in range(2):
            if floats:
                pool = [0.0, 1.0, 2.0] + ([NAN, 3.0, -1.0] if wide else [])
                pair.append(tensor_source(draw(st.lists(st.sampled_from(pool), min_size=n, max_size=n))))
            else:
                pair.append(tensor_source(_ints(draw, n, -1 if wide else 0, C if wide else C - 1), "int64"))
        batches.append(", ".join(pair))
    make = f"{name}(num_classes={C}, nan_strategy={strategy!r})"
    return Case(make, _steps(draw, batches, draw(st.booleans())), draw(st.booleans()), frozenset({"checked"}))


@st.composite
def fairness_cases(draw: Any) -> Case:
    name = draw(st.sampled_from(["BinaryFairness", "BinaryGroupStatRates"]))
    args = ["num_groups=2"]
    if name == "BinaryFairness":
        args.append(f"task={draw(st.sampled_from(['all', 'demographic_parity', 'equal_opportunity']))!r}")
    if draw(st.booleans()):
        args.append("validate_args=False")
    batches = []
    for _ in range(draw(st.integers(1, 3))):
        n = draw(st.integers(1, 5))
        groups = tensor_source(_ints(draw, n, 0, 2 if draw(st.integers(0, 3)) == 0 else 1), "int64")
        batches.append(f"{tensor_source(_probs(draw, n))}, {tensor_source(_ints(draw, n, 0, 1), 'int64')}, {groups}")
    return Case(f"{name}({', '.join(args)})", _steps(draw, batches, draw(st.booleans())), draw(st.booleans()),
                frozenset({"checked"}))


@st.composite
def hinge_cases(draw: Any) -> Case:
    kind = draw(st.sampled_from(["binary", "crammer-singer", "one-vs-all", "coverage"]))
    grad = draw(st.booleans())
    batches = []
    for _ in range(draw(st.integers(1, 3))):
        n = draw(st.integers(1, 4))
        if kind == "binary":
            preds = tensor_source(draw(st.lists(st.sampled_from([-1.5, -0.25, 0.0, 0.5, 2.0]), min_size=n,
                                                max_size=n)), "float32", grad)
            target = tensor_source(_ints(draw, n, 0, 1), "int64")
        elif kind == "coverage":
            preds = tensor_source([_probs(draw, C) for _ in range(n)])
            target = tensor_source([_ints(draw, C, 0, 1) for _ in range(n)], "int64")
        else:
            preds = tensor_source([draw(st.lists(st.sampled_from([-1.0, 0.0, 0.2, 0.5, 3.0]), min_size=C,
                                                 max_size=C)) for _ in range(n)], "float32", grad)
            target = tensor_source(_ints(draw, n, 0, C - 1), "int64")
        batches.append(f"{preds}, {target}")
    common = ", validate_args=False" if draw(st.booleans()) else ""
    if kind == "binary":
        make = f"BinaryHingeLoss(squared={draw(st.booleans())}{common})"
    elif kind == "coverage":
        make = f"MultilabelCoverageError(num_labels={C}{common})"
    else:
        make = f"MulticlassHingeLoss(num_classes={C}, multiclass_mode={kind!r}{common})"
    return Case(make, _steps(draw, batches, draw(st.booleans())), draw(st.booleans()), frozenset({"checked"}))


@st.composite
def regression_cases(draw: Any) -> Case:
    name = draw(st.sampled_from(["PearsonCorrCoef", "TweedieDevianceScore"]))
    pool = [-1.0, 0.0, 0.5, 1.0, 2.0, 3.0]
    batches = []
    for _ in range(draw(st.integers(1, 3))):
        n = draw(st.integers(1, 4)) if name != "PearsonCorrCoef" else draw(st.integers(2, 4))
        pair = [tensor_source(draw(st.lists(st.sampled_from(pool), min_size=n, max_size=n))) for _ in range(2)]
        batches.append(", ".join(pair))
    make = "PearsonCorrCoef()" if name == "PearsonCorrCoef" else \
        f"TweedieDevianceScore(power={draw(st.sampled_from([0.0, 1.0, 1.5, 2.0, 3.0, -1.0]))})"
    return Case(make, _steps(draw, batches, draw(st.booleans())), draw(st.booleans()), frozenset({"checked"}))


@pytest.mark.skipif(not NOMINAL, reason="the nominal metrics came in 0.11.0")
@SETTINGS
@given(batch(nominal_cases()))
def test_nominal(cases: List[Case]) -> None:
    run(cases)


@pytest.mark.skipif(not has("BinaryFairness"), reason="BinaryFairness came in 1.0.0")
@SETTINGS
@given(batch(fairness_cases()))
def test_fairness(cases: List[Case]) -> None:
    run(cases)


@SETTINGS
@given(batch(hinge_cases()))
def test_hinge_losses(cases: List[Case]) -> None:
    run(cases)


@SETTINGS
@given(batch(regression_cases()))
def test_regression(cases: List[Case]) -> None:
    run(cases)


# --- wrappers, full_state_update forward -----------------------------------------------------------------------------

@st.composite
def wrapper_cases(draw: Any) -> Case:
    kind = draw(st.sampled_from(["minmax", "bootstrap-mean", "bootstrap-accuracy"]))
    batches, flats = [], []
    for _ in range(draw(st.integers(1, 3))):
        n = draw(st.integers(1, 4))
        if kind == "bootstrap-mean":
            source, flat = draw(values(shape=(n,)))
            batches.append(source)
            flats.append(flat)
        else:
            batches.append(f"{tensor_source(_probs(draw, n))}, {tensor_source(_ints(draw, n, 0, 1), 'int64')}")
    if kind == "minmax":
        make = "MinMaxMetric(BinaryAccuracy())"
    else:
        base = f"MeanMetric(nan_strategy={draw(st.sampled_from(STRATEGIES))!r})" if kind == "bootstrap-mean" \
            else "BinaryAccuracy()"
        strategy = draw(st.sampled_from(["poisson", "multinomial"]))
        make = f"BootStrapper({base}, num_bootstraps=3, sampling_strategy={strategy!r})"
    steps = _steps(draw, batches, True)
    nan_strategy = _strategy_in(make)
    if isinstance(nan_strategy, float) and any(v != v for flat in flats for v in flat):
        fixed = _steps_like(steps, batches, [_resourced(b, _imputed(f, nan_strategy)) for b, f in zip(batches, flats)])
        return Case(make, steps, draw(st.booleans()), frozenset({"checked", "impute"}), fixed)
    return Case(make, steps, draw(st.booleans()), frozenset({"checked"}))


def _strategy_in(make: str) -> Any:
    if "nan_strategy=" not in make:
        return None
    return eval(make.split("nan_strategy=", 1)[1].split(")", 1)[0])  # noqa: S307 - our own source


# 0.10.x warns at a metric's construction when its class sets no ``full_state_update`` and does not override
# forward, asking ``is_overridden``, which unwraps the instance's forward (``__wrapped__``) but not
# Metric.forward: tmpatch's forward layer reads as an override there, and the warning is not given. A
# known difference of those releases (MinMaxMetric and users' own metrics), not a deliberate one
@pytest.mark.xfail(release_in("<0.11"), reason="0.10.x: the full_state_update warning is lost under tmpatch's "
                   "forward layer", strict=True)
@SETTINGS
@given(batch(wrapper_cases()))
def test_wrappers(cases: List[Case]) -> None:
    """MinMaxMetric (full_state_update), BootStrapper (seeded: torch.manual_seed(0) before each run)."""
    run(cases)
