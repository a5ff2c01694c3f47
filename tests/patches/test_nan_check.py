"""nan_check: the aggregators' NaN check without a sync in update(); reports later, once (deferred_reports).

Results equal the release's (NaN-free inputs: bit for bit; with NaN: the documented
semantics), the deliberate corrections, the fidelity items of issue #11 item 9 (broadcast
weights, Python ints beyond int64, requires_grad, half-precision imputation), when and how
warn/error reach the user, and sync-freedom on simulated CUDA. DDP: test_deferred_reports_ddp.py.
"""
from __future__ import annotations

import copy
import pickle
import sys
import warnings
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st
from torchmetrics import aggregation
from torchmetrics.aggregation import BaseAggregator, CatMetric, MaxMetric, MeanMetric, MinMetric, SumMetric

import tmpatch
from tests.conftest import assert_bitwise, cpu_shortcuts, examples, release_in, run_python
from tests.patches.eager import same_states
from tmpatch.control import settings as tm_settings
from tmpatch.runtime import policies

#: the Running wrappers (1.0.0+)
RUNNING = [getattr(aggregation, name) for name in ("RunningMean", "RunningSum") if hasattr(aggregation, name)]
RunningMean = getattr(aggregation, "RunningMean", None)

NAN, INF = float("nan"), float("inf")
KINDS = {"sum": SumMetric, "mean": MeanMetric, "max": MaxMetric, "min": MinMetric, "cat": CatMetric}
DISABLE = release_in(">=1.6.2")
STRATEGIES = ["warn", "ignore", "error", 0.0, 2.5] + (["disable"] if DISABLE else [])
SPELLING = "Encounted" if release_in("<1.2.1") else "Encountered"
ERROR_TEXT = f"{SPELLING} `nan` values in tensor"
WARN_TEXT = f"{SPELLING} `nan` values in tensor. Will be removed."


def _note(name: str, updates: int, where: str = "compute()", first: Optional[int] = None) -> str:
    """What tmpatch adds to a deferred report (``first``: the update the first NaN came from, where
    the report names it)."""
    if first is not None:
        where = f"{where} (the first of them came from update #{first})"
    return (f"tmpatch nan_check: {name} saw NaN in {updates} update(s) since the last report; "
            f"reported at {where}; TMPATCH_NAN_CHECK=eager reports in update()")


def _deferred(text: str, name: str, updates: int, where: str = "compute()", first: Optional[int] = None) -> str:
    """The deferred report as the user sees it: a warning in the release's words alone (the note
    goes to the tmpatch logger), an error with the release's words first, then the note."""
    if text == WARN_TEXT:
        return text
    return f"{text} ({_note(name, updates, where, first)})"


DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int64]
FINITE = [0.0, 1.0, -2.5, 3.0, 1000.0]
WEIGHTS = [0.0, 0.5, 1.0, 2.0, 3.0]  # dyadic: sums are exact whatever the order


@pytest.fixture(autouse=True)
def _policy():
    """Every test starts and ends with the default policy."""
    policies.current["nan_check"] = "deferred"
    yield
    policies.current["nan_check"] = "deferred"


def _apply(policy: str = "deferred") -> None:
    report = tmpatch.apply("nan_check", nan_check=policy)
    row = next(r for r in report if r.name == "nan_check")
    assert row.state == "applied", row


def _run(metric, updates: Sequence[Tuple[Any, ...]]):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for args in updates:
            metric.update(*args)
        return metric.compute()


def _clone(updates):
    return [tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args) for args in updates]


def _same_inputs(before, after) -> None:
    for args_before, args_after in zip(before, after):
        for a, b in zip(args_before, args_after):
            if isinstance(a, torch.Tensor):
                assert_bitwise(b, a)


# -- generated inputs ---------------------------------------------------------------
@st.composite
def _updates(draw, kind: str, with_nan: bool):
    pool = FINITE + [INF, -INF] + ([NAN, NAN] if with_nan else [])
    out = []
    for _ in range(draw(st.integers(1, 3))):
        if draw(st.integers(0, 4)) == 0:  # a Python scalar
            value = draw(st.sampled_from(pool + [2, True]))
            shape: Tuple[int, ...] = ()
        else:
            dtype = draw(st.sampled_from(DTYPES))
            shapes = [(), (0,), (1,), (4,)] + ([] if kind == "cat" else [(2, 3)])
            shape = draw(st.sampled_from(shapes))
            elements = FINITE if dtype == torch.int64 else pool
            data = [draw(st.sampled_from(elements)) for _ in range(int(np.prod(shape)))]
            value = torch.tensor(data, dtype=torch.float64).reshape(shape).to(dtype)
        if kind != "mean" or draw(st.booleans()):
            out.append((value,))
            continue
        weights = WEIGHTS + ([NAN] if with_nan else [])
        form = draw(st.sampled_from(["python", "scalar", "full", "row"]))
        if form == "python":
            weight: Any = draw(st.sampled_from(weights))
        elif form == "scalar" or not shape:
            weight = torch.tensor(draw(st.sampled_from(weights)))
        else:
            wshape = shape if form == "full" else shape[-1:]
            weight = torch.tensor([draw(st.sampled_from(weights)) for _ in range(int(np.prod(wshape)))]).reshape(wshape)
        out.append((value, weight))
    return out


def _reference(kind: str, strategy, updates) -> np.ndarray:
    """The documented semantics, in float64 numpy: NaN elements removed, or imputed
    with weight 1 (an element counts as NaN if its value or, for Mean, its weight is;
    an integer value takes the strategy truncated, as the release's write stores it from 1.0.1;
    before, the release writes no value where only the weight is NaN)."""
    values, weights = [], []
    for args in updates:
        v = np.asarray(args[0].double().numpy() if isinstance(args[0], torch.Tensor) else float(args[0]), np.float64)
        w = np.ones_like(v)
        if kind == "mean" and len(args) > 1:
            raw = args[1].double().numpy() if isinstance(args[1], torch.Tensor) else float(args[1])
            w = np.broadcast_to(np.asarray(raw, np.float64), v.shape).copy()
        v, w = v.reshape(-1).copy(), w.reshape(-1).copy()
        nan = np.isnan(v) | np.isnan(w)
        if isinstance(strategy, float):  # written into the value's dtype (an integer value truncates it)
            integral = isinstance(args[0], torch.Tensor) and not args[0].is_floating_point() and release_in(">=1.0.1")
            v[nan], w[nan] = (np.trunc(strategy) if integral else strategy), 1.0
        else:
            v, w = v[~nan], w[~nan]
        values.append(v)
        weights.append(w)
    v, w = np.concatenate(values), np.concatenate(weights)
    with np.errstate(all="ignore"):
        if kind == "sum":
            return np.asarray(v.sum())
        if kind == "mean":
            return np.asarray((v * w).sum() / w.sum())
        if kind == "max":
            return np.asarray(max([-INF] + list(v)))
        if kind == "min":
            return np.asarray(min([INF] + list(v)))
        return v


def _release_reports(kind: str, updates) -> Tuple[int, Optional[int]]:
    """How many of ``updates`` the release itself (unpatched, ``nan_strategy="warn"``) reports
    NaN for, and the first of them (1 for the first update). Which NaN counts differs by release:
    1.0.0 checks a Mean's weight on its own, so a NaN weight of an empty value is reported there
    and nowhere later."""
    tmpatch.revert()  # an earlier example of the same test may have applied it
    metric = KINDS[kind](nan_strategy="warn")
    count, first = 0, None
    for index, args in enumerate(_clone(updates), 1):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            try:
                metric.update(*args)
            except RuntimeError:  # 1.0.0: a scalar value with a NaN weight, filtered to nothing, fails
                pass  # to broadcast after the warning (tmpatch removes the element: documented)
        if any(SPELLING in str(w.message) for w in seen):
            count += 1
            first = index if first is None else first
    return count, first


# -- results ------------------------------------------------------------------------
@settings(max_examples=examples(30), deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_nan_free_results_are_bitwise_the_releases(data):
    kind = data.draw(st.sampled_from(sorted(KINDS)))
    strategy = data.draw(st.sampled_from(STRATEGIES))
    updates = data.draw(_updates(kind, with_nan=False))
    if strategy == "disable" and kind == "mean":  # a user weight is honoured there (#3434): below
        updates = [args[:1] for args in updates]
    expected = _run(KINDS[kind](nan_strategy=strategy), _clone(updates))
    _apply()
    actual = _run(KINDS[kind](nan_strategy=strategy), _clone(updates))
    if isinstance(expected, list):  # CatMetric that kept nothing
        assert actual == expected == []
    else:
        assert_bitwise(actual, expected)


class _OffCpu(torch.Tensor):
    """A CPU tensor that says it is elsewhere: nan_check's device path, on real values."""

    @property
    def is_cpu(self) -> bool:  # type: ignore[override]
        return False


def _off_cpu(updates):
    return [tuple(a.as_subclass(_OffCpu) if isinstance(a, torch.Tensor) else a for a in args) for args in updates]


def _plain_states(metric) -> List[Any]:
    out = []
    for name in metric._defaults:
        state = getattr(metric, name)
        items = state if isinstance(state, list) else [state]
        out.append([t.as_subclass(torch.Tensor) for t in items])
    return out


def _shortcut_cases():
    g = torch.Generator().manual_seed(7)
    big = torch.randn(67, 33, generator=g)
    return {
        "broadcast weight": (big, torch.broadcast_to(torch.tensor(0.1), big.shape)),
        "item 9's broadcast weight": (torch.ones(2, 3), torch.broadcast_to(torch.tensor([0.1, 3.0, -7.25]), (2, 3))),
        "broadcast row weight": (big, torch.broadcast_to(torch.rand(33, generator=g), big.shape)),
        "transposed value": (big.t(), torch.rand(33, 67, generator=g)),
        "transposed value, no weight": (big.t(),),
        "transposed weight": (big, torch.rand(33, 67, generator=g).t()),
        "expanded value": (torch.broadcast_to(torch.randn(33, generator=g), (67, 33)),),
        "float16 value, float64 weight": (big.half(), torch.rand(67, 33, generator=g, dtype=torch.float64)),
    }


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("strategy", ["warn", 0.5])
@pytest.mark.parametrize("case", sorted(_shortcut_cases()))
def test_the_cpu_path_keeps_the_releases_or_the_device_paths_summation_order(kind, strategy, case):
    """Random values, big enough for the order of a sum to show in the last bits. A removing
    strategy runs the release's own check on the CPU: its bits; a float one (the corrections)
    the device path's."""
    args = _shortcut_cases()[case]
    if kind != "mean":
        args = args[:1]
    there = KINDS[kind](nan_strategy=strategy)
    if isinstance(strategy, str):
        there.update(*args)  # the release's
    _apply()
    here = KINDS[kind](nan_strategy=strategy)
    here.update(*args)  # as they are: a clone would materialise the broadcast views
    if not isinstance(strategy, str):
        there = KINDS[kind](nan_strategy=strategy)
        there.update(*_off_cpu([args])[0])
    for got, want in zip(_plain_states(here), _plain_states(there)):
        for a, b in zip(got, want):
            assert_bitwise(a, b)


def _transposed(args):
    value = args[0]
    if not (isinstance(value, torch.Tensor) and value.dim() == 2):
        return args
    weight = args[1] if len(args) > 1 else None
    if isinstance(weight, torch.Tensor) and weight.dim() == 2:
        return value.t(), weight.t()
    if isinstance(weight, torch.Tensor) and weight.dim() == 1:
        return (value.t(),)  # a row weight does not broadcast to the transposed value
    return (value.t(),) + tuple(args[1:])


@settings(max_examples=examples(40), deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_the_cpu_shortcut_gives_the_device_paths_tensors(data):
    """On the CPU, an update without NaN skips the neutralising ``where`` (no sync to save
    there): the states are those of the device path, bit for bit, whatever the layout
    (transposed values, broadcast weights)."""
    kind = data.draw(st.sampled_from(sorted(KINDS)))
    strategy = data.draw(st.sampled_from(STRATEGIES))
    updates = data.draw(_updates(kind, with_nan=False))
    if data.draw(st.booleans()):  # non-contiguous values (and weights)
        updates = [_transposed(args) for args in updates]
    if kind == "mean" and data.draw(st.booleans()):  # weights that are broadcast views of the value's shape
        updates = [(v, torch.broadcast_to(w, v.shape)) if isinstance(v, torch.Tensor) and isinstance(w, torch.Tensor)
                   and torch.broadcast_shapes(w.shape, v.shape) == v.shape else (v, w) for v, w in
                   [(args[0], args[1] if len(args) > 1 else None) for args in updates]]
        updates = [tuple(a for a in args if a is not None) for args in updates]
    _apply()
    here, there = KINDS[kind](nan_strategy=strategy), KINDS[kind](nan_strategy=strategy)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for args, off in zip(updates, _off_cpu(updates)):  # not cloned: that materialises broadcast views
            here.update(*args)
            there.update(*off)
    for got, want in zip(_plain_states(here), _plain_states(there)):
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert_bitwise(a, b)


@pytest.mark.usefixtures("on_a_device")  # at a settle point, as on a GPU before the copy lands
@settings(max_examples=examples(30), deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_nan_results_follow_the_documented_semantics(data):
    kind = data.draw(st.sampled_from(sorted(KINDS)))
    strategy = data.draw(st.sampled_from(["warn", "ignore", "error", 0.0, 2.5]))
    updates = data.draw(_updates(kind, with_nan=True))
    count, first = _release_reports(kind, updates)  # what the release reports, before tmpatch is applied
    seen = count > 0
    _apply()
    before = _clone(updates)
    metric = KINDS[kind](nan_strategy=strategy)
    with warnings.catch_warnings(record=True) as during_update:
        warnings.simplefilter("always")
        for args in updates:
            metric.update(*args)
    assert not [w for w in during_update if SPELLING in str(w.message)]
    _same_inputs(before, updates)  # the caller's tensors are never written into
    with warnings.catch_warnings(record=True) as at_compute:
        warnings.simplefilter("always")
        if strategy == "error" and seen:
            with pytest.raises(RuntimeError, match=ERROR_TEXT):
                metric.compute()
        result = metric.compute()  # after an error the state is clean and compute() carries on
    reported = [str(w.message) for w in at_compute if SPELLING in str(w.message)]
    assert reported == ([_deferred(WARN_TEXT, KINDS[kind].__name__, count, first=first)]
                        if strategy == "warn" and seen else [])
    expected = _reference(kind, strategy, updates)
    if isinstance(result, list):  # CatMetric with nothing kept: the empty state
        result = torch.cat(result) if result else torch.zeros(0)
    actual = result.double().numpy()
    if kind == "cat":
        actual, expected = actual.reshape(-1), expected.reshape(-1)
    np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5, equal_nan=True)


@pytest.mark.parametrize("weight", [NAN, torch.tensor(NAN)])
def test_a_nan_weight_of_an_empty_value_is_reported_as_the_release_does(weight):
    """Found by hypothesis: 1.0.0 reports it (the weight is checked on its own), later releases do
    not (the weight is broadcast to the value first)."""
    updates = [(torch.tensor([], dtype=torch.float16), weight)]
    expected, _ = _release_reports("mean", updates)
    _apply()
    metric = MeanMetric(nan_strategy="warn")
    with warnings.catch_warnings(record=True) as reported:  # at the update on the CPU, at compute on a GPU
        warnings.simplefilter("always")
        metric.update(*_clone(updates)[0])
        metric.compute()
    assert len([w for w in reported if SPELLING in str(w.message)]) == expected


@pytest.mark.parametrize("kind", ["mean", "sum", "max"])
@pytest.mark.parametrize("weight", [None, 2.0, torch.tensor([1.0, 3.0]), torch.tensor([1 + 0j, 3 + 0j])])
def test_complex_values_are_taken_as_the_release_takes_them(kind, weight):
    """A complex value (or weight) is cast as the release casts it (torch's warning about the
    discarded imaginary part comes once per process, so it is not compared here): the check's
    NaN test has no complex kernel to fall over (``maximum`` has none)."""
    if kind != "mean" and weight is not None:
        pytest.skip("a weight is MeanMetric's")
    value = torch.tensor([1 + 1j, 2 + 0j])
    updates = [(value,) if weight is None else (value, weight)]

    def run():
        metric = KINDS[kind]()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            metric.update(*_clone(updates)[0])
            result = metric.compute()
        return result, {name: getattr(metric, name).clone() for name in metric._defaults}

    expected = run()
    _apply()
    actual = run()
    assert_bitwise(actual[0], expected[0])
    for name, state in expected[1].items():
        assert_bitwise(actual[1][name], state)


@pytest.mark.parametrize("policy", ["deferred", "eager", "off"])
def test_policies_give_the_same_values(policy):
    values = [torch.tensor([1.0, NAN, 3.0]), torch.tensor([NAN]), torch.tensor([5.0])]
    _apply(policy)
    for kind, expected in [("sum", 9.0), ("mean", 3.0), ("max", 5.0), ("min", 1.0)]:
        metric = KINDS[kind](nan_strategy="ignore")
        assert float(_run(metric, [(v,) for v in values])) == expected


# -- the upstream bugs it corrects ------------------------------------------------------
def test_imputation_gives_imputed_elements_weight_one():
    _apply()
    metric = MeanMetric(nan_strategy=0.0)
    metric.update(torch.tensor([1.0, NAN, 3.0]))
    assert float(metric.compute()) == pytest.approx(4 / 3)  # upstream <= 1.6.1: nan
    metric = MeanMetric(nan_strategy=0.0)
    metric.update(torch.tensor([1.0, NAN, 3.0]), 2.0)
    metric.update(torch.tensor([10.0]), 1.0)
    assert float(metric.compute()) == pytest.approx((2 + 0 + 6 + 10) / (2 + 1 + 2 + 1))  # upstream 1.6.2+: 3.5


@pytest.mark.parametrize("strategy", ["ignore", 0.0, 2.5])
@pytest.mark.parametrize("value", [1.0, INF, -4.0])
def test_a_nan_weight_makes_its_element_nan(strategy, value):
    """Mean: an element whose weight is NaN is removed (ignore) or imputed with weight 1,
    whatever its value (up to 1.0.0 the value and the weight are checked in two separate calls: on the CPU
    its own check runs there, for a removing strategy, so the device path is what is shown)."""
    _apply()
    if release_in("<=1.0.0") and isinstance(strategy, str):
        cpu_shortcuts(False)
    metric = MeanMetric(nan_strategy=strategy)
    metric.update(torch.tensor([value, 3.0]), torch.tensor([NAN, 1.0]))
    metric.update(value, NAN)  # Python scalars
    expected = 3.0 if strategy == "ignore" else (2 * strategy + 3.0) / 3
    assert float(metric.compute()) == pytest.approx(expected)


@pytest.mark.parametrize("strategy", [0.0, "warn", "ignore"])
def test_callers_tensors_are_not_written_into(strategy):
    _apply()
    value, weight = torch.tensor([1.0, NAN, 3.0]), torch.tensor([2.0, 1.0, NAN])
    before = (value.clone(), weight.clone())
    _run(MeanMetric(nan_strategy=strategy), [(value, weight)])
    _run(SumMetric(nan_strategy=strategy), [(value,)])
    assert_bitwise(value, before[0])
    assert_bitwise(weight, before[1])


@pytest.mark.skipif(not DISABLE, reason="nan_strategy='disable' exists from 1.6.2")
def test_disable_keeps_the_users_weight():
    _apply()
    metric = MeanMetric(nan_strategy="disable")
    metric.update(torch.tensor([1.0, 3.0]), torch.tensor([3.0, 1.0]))
    assert float(metric.compute()) == 1.5  # upstream (#3434): 2.0


# -- issue #11 item 9: fidelity -------------------------------------------------------------
def _states(metric) -> List[torch.Tensor]:
    return [getattr(metric, name) for name in metric._defaults]


def test_item9_a_broadcast_weight_is_summed_as_a_full_tensor():
    """Documented difference on a device: to neutralise NaN elements without a sync, a weight
    that broadcasts to the value's shape (a scalar, or fewer dimensions) is materialised, so
    the total weight is the sum of a full tensor where the release sums the broadcast
    view, in another order: it can differ in the last bits (never more than summation
    rounding). The weighted values, and any weight of the value's own shape, are the
    release's bit for bit. On the CPU the release's own check runs: its bits, every case."""
    cases = [(torch.ones(2, 3), torch.tensor([0.1, 3.0, -7.25])),  # the example
             (torch.linspace(0, 1, 101), torch.tensor(0.1))]
    torch.manual_seed(0)
    full = [(torch.rand(7, 5), torch.rand(7, 5)), (torch.randn(64), torch.rand(64))]
    expected = []
    for value, weight in cases + full:
        metric = MeanMetric()
        metric.update(value, weight)
        expected.append(_states(metric))
    _apply()
    for (value, weight), states in zip(cases + full, expected):
        metric = MeanMetric()
        metric.update(value, weight)
        for got, want in zip(_states(metric), states):
            assert_bitwise(got, want)
    cpu_shortcuts(False)
    for (value, weight), (value_sum, weight_sum) in zip(cases, expected):
        metric = MeanMetric()
        metric.update(value, weight)
        assert_bitwise(_states(metric)[0], value_sum)
        assert_bitwise(_states(metric)[1], torch.broadcast_to(weight, value.shape).contiguous().sum())
        assert float(_states(metric)[1]) == pytest.approx(float(weight_sum), rel=1e-6)
    first = MeanMetric()
    first.update(*cases[0])
    assert float(_states(first)[1]) == -8.299999237060547 != float(expected[0][1]) == -8.300000190734863
    for (value, weight), states in zip(full, expected[len(cases):]):
        metric = MeanMetric()
        metric.update(value, weight)
        for got, want in zip(_states(metric), states):
            assert_bitwise(got, want)


BIG = [2**70, -(2**70), 2**63, -(2**63), 2**60 + 2**36 + 1, 2**62 + 2**38 + 1, 3, True]


@pytest.mark.parametrize("cls", [SumMetric, MeanMetric, MaxMetric, MinMetric, CatMetric])
def test_item9_python_ints_of_any_size_are_the_releases(cls):
    """``update(2**70)`` works as in the release (no OverflowError), and an int that a
    float32 cannot hold rounds as the release rounds it (through a Python float)."""
    updates = [(value,) for value in BIG]
    if cls is MeanMetric:
        updates += [(1.5, value) for value in BIG]
    expected = [_states(_fed(cls, args)) for args in updates]
    tmpatch.apply(["nan_check", "mean_default_weight"])
    for args, states in zip(updates, expected):
        same_states(_states(_fed(cls, args)), states)


def _fed(build, args):
    """A metric from ``build()``, updated once with ``args``."""
    metric = build()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        metric.update(*args)
    return metric


@pytest.mark.parametrize("strategy", [0.0, 1.5])
def test_item9_imputation_keeps_requires_grad(strategy):
    x = torch.tensor([1.0, NAN, 3.0], requires_grad=True)
    expected = _run(CatMetric(nan_strategy=strategy), [(x.detach().clone().requires_grad_(True),)])
    _apply()
    actual = _run(CatMetric(nan_strategy=strategy), [(x,)])
    assert actual.requires_grad is expected.requires_grad is True
    assert_bitwise(actual.detach(), expected.detach())
    assert torch.isnan(x[1])  # the caller's tensor untouched


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("strategy", [0.1, 1.0 / 3.0, 70000.0, -2.5])
def test_item9_half_precision_imputation_is_the_releases_bit_for_bit(dtype, strategy):
    """The release writes the value into the input's own dtype (rounded there), then
    casts: tmpatch imputes in that dtype too (70000 is inf in float16 on torch 2.6-2.14;
    torch before 2.6 and from 2.15 on refuse it, and so does tmpatch there: the expected
    outcome is the release's own, run on the torch under test)."""
    value = torch.tensor([0.3, NAN, -1.7, NAN, 2.0], dtype=dtype)
    kinds = [SumMetric, MaxMetric, MinMetric, CatMetric] + ([MeanMetric] if release_in(">=1.6.2") else [])

    def outcome(cls):  # the states, or the error
        try:
            return _states(_fed(lambda: cls(nan_strategy=strategy), (value.clone(),)))
        except RuntimeError as exc:
            return f"{type(exc).__name__}: {exc}"

    expected = {cls: outcome(cls) for cls in kinds}
    _apply()
    for cls in kinds:
        got = outcome(cls)
        if isinstance(expected[cls], str) or isinstance(got, str):
            assert got == expected[cls], cls
        else:
            same_states(got, expected[cls])


def _outcome(build, args, off_cpu: bool = False):
    """The states after one update of ``build()`` with ``args`` (cloned; ``off_cpu``: through the
    device path), or the error it raised, as text."""
    args = _clone([args])[0]
    try:
        return _plain_states(_fed(build, _off_cpu([args])[0] if off_cpu else args))
    except RuntimeError as exc:
        return f"{type(exc).__name__}: {exc}"


@pytest.mark.parametrize("off_cpu", [False, True], ids=["cpu", "device path"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.int8, torch.uint8,
                                   torch.int64, torch.bool])
@pytest.mark.parametrize("strategy", [0.5, -2.5, 300.0, 70000.0, 1e39, INF])
def test_a_float_strategy_is_stored_or_refused_in_the_inputs_dtype_as_the_release_does(strategy, dtype, off_cpu):
    """The release imputes by writing into the input (``x[nans] = strategy``): an integer input
    stores the value truncated (its NaN is the weight's, 1.0.1+), a float one rounded; where
    torch refuses the value in that dtype (out of an integer's range; out of a float's on torch
    before 2.6 and from 2.15 on) the update raises torch's error, once a NaN is there, and not
    without one. The expected outcome is the release's own, on the torch under test. MeanMetric
    below 1.6.2: the weight of an imputed element is a deliberate correction (1), the outcome's
    kind and any error are the release's."""
    floating = dtype.is_floating_point
    raw = [1.0, NAN, 3.0, 4.0] if floating else [1, 0, 1, 1]
    value = torch.tensor(raw, dtype=torch.float64).to(dtype) if floating else torch.tensor(raw, dtype=dtype)
    clean = torch.tensor([1, 0, 1, 1], dtype=dtype)
    weight = torch.tensor([2.0, 1.0, NAN, 1.0])
    cases = [(cls, (value,)) for cls in (SumMetric, MaxMetric, MinMetric, CatMetric, MeanMetric) if floating]
    cases += [(cls, (clean,)) for cls in (SumMetric, MeanMetric)]  # nothing to impute: no error
    cases += [(MeanMetric, (value, weight)), (MeanMetric, (clean, weight))]

    def all_outcomes():
        return [_outcome(lambda c=cls: c(nan_strategy=strategy), args, off_cpu) for cls, args in cases]

    expected = all_outcomes()
    _apply()
    got = all_outcomes()
    for (cls, args), want, have in zip(cases, expected, got):
        label = (cls.__name__, [a.dtype for a in args])
        if isinstance(want, str) or isinstance(have, str):
            assert have == want, label
        elif cls is MeanMetric and not release_in(">=1.6.2"):
            continue
        else:
            same_states(have, want)


# -- when warn/error reach the user -------------------------------------------------------
def _messages(records) -> List[str]:
    return [str(w.message) for w in records if SPELLING in str(w.message)]


@pytest.mark.usefixtures("on_a_device")  # at a settle point, as on a GPU before the copy lands
def test_warn_once_per_compute_then_afresh():
    _apply()
    metric = MeanMetric(nan_strategy="warn")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        metric.update(torch.tensor([1.0, NAN]))
        metric.update(torch.tensor([NAN, 3.0]))
        assert _messages(seen) == []
        assert float(metric.compute()) == 2.0
        assert _messages(seen) == [_deferred(WARN_TEXT, "MeanMetric", 2, first=1)]
        metric.compute()  # cached: nothing new
        metric.update(torch.tensor([5.0]))
        metric.compute()  # the record started afresh
        assert len(_messages(seen)) == 1
        metric.update(torch.tensor([NAN]))
        metric.reset()  # the NaN batch is dropped: its warning comes there, once
        assert _messages(seen)[1:] == [_deferred(WARN_TEXT, "MeanMetric", 1, "reset()", first=4)]
        metric.update(torch.tensor([1.0]))
        metric.compute()
        assert len(_messages(seen)) == 2


@pytest.mark.usefixtures("on_a_device")  # at a settle point, as on a GPU before the copy lands
@pytest.mark.parametrize("cls", [SumMetric, MeanMetric, MaxMetric, MinMetric, CatMetric])
def test_forward_never_reports_compute_does(cls):
    _apply()
    metric = cls(nan_strategy="error")
    batch = metric(torch.tensor([1.0, NAN, 3.0]))  # no raise inside forward
    assert not torch.isnan(batch).any()
    metric(torch.tensor([4.0]))
    with pytest.raises(RuntimeError) as raised:
        metric.compute()
    # forward's two updates count once (a full-state forward's count says nothing of which update it was)
    assert str(raised.value) == _deferred(ERROR_TEXT, cls.__name__, 1, first=None if cls.full_state_update else 1)
    clean = metric.compute()
    assert not torch.isnan(clean).any()


@pytest.mark.usefixtures("on_a_device")  # at a settle point, as on a GPU before the copy lands
@pytest.mark.skipif(not RUNNING, reason="RunningMean and RunningSum from 1.0.0")
@pytest.mark.parametrize("cls", RUNNING, ids=lambda c: c.__name__)
def test_running_wrappers(cls):
    _apply()
    metric = cls(window=3, nan_strategy="warn")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        metric(torch.tensor([1.0, NAN]))
        metric.update(torch.tensor([5.0]))
        assert _messages(seen) == []
        first = float(metric.compute())
        assert _messages(seen) == [_deferred(WARN_TEXT, f"{cls.__name__} (MeanMetric inside)"
                                             if cls is RunningMean else f"{cls.__name__} (SumMetric inside)", 1)]
        metric.update(torch.tensor([6.0]))  # the NaN update is still in the window
        second = float(metric.compute())
        assert len(_messages(seen)) == 1
    assert (first, second) == ((3.0, 4.0) if cls is RunningMean else (6.0, 12.0))


def test_eager_policy_reports_in_update_without_writing():
    _apply("eager")
    value = torch.tensor([1.0, NAN])
    metric = SumMetric(nan_strategy="warn")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        metric.update(value)
        assert _messages(seen) == [WARN_TEXT]
        assert float(metric.compute()) == 1.0
        assert len(_messages(seen)) == 1
    with pytest.raises(RuntimeError, match=ERROR_TEXT):
        MeanMetric(nan_strategy="error").update(value)
    assert torch.isnan(value[1])


def test_off_policy_reports_nothing():
    _apply("off")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for strategy in ("warn", "error"):
            metric = MeanMetric(nan_strategy=strategy)
            metric.update(torch.tensor([1.0, NAN, 3.0]))
            assert float(metric.compute()) == 2.0
    assert _messages(seen) == []


def test_policy_argument_and_environment(monkeypatch):
    with pytest.raises(ValueError, match="deferred, eager, off"):
        tmpatch.apply("nan_check", nan_check="later")
    for raw, expected in [("", "deferred"), ("eager", "eager"), (" OFF ", "off"), ("later", "deferred")]:
        monkeypatch.setenv("TMPATCH_NAN_CHECK", raw)
        assert tm_settings._from_env("nan_check") == expected
    code = """
        import warnings, torch, tmpatch
        from torchmetrics.aggregation import SumMetric
        tmpatch.apply("nan_check")
        m = SumMetric(nan_strategy="warn")
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            m.update(torch.tensor([float("nan")]))
            print(len([w for w in seen if "nan" in str(w.message)]))
    """
    assert run_python(code, env={"TMPATCH_NAN_CHECK": "eager"}).stdout.strip() == "1"


def test_metric_built_before_apply_reports_eagerly():
    metric = SumMetric(nan_strategy="warn")
    _apply()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        metric.update(torch.tensor([2.0, NAN]))
        assert _messages(seen) == [WARN_TEXT]
    assert float(metric.compute()) == 2.0


def test_unknown_subclasses_keep_the_release_code():
    class Product(BaseAggregator):
        def __init__(self) -> None:
            super().__init__("sum", torch.tensor(1.0), nan_strategy="warn")

        def update(self, value) -> None:
            out = self._cast_and_nan_check_input(value)
            value = out[0] if isinstance(out, tuple) else out
            self.value = self.value * value.prod()

    class LoudSum(SumMetric):
        def update(self, value) -> None:
            super().update(value)

    _apply()
    for metric in (Product(), LoudSum()):
        assert not any(n.startswith("_tmpatch") for n in metric._defaults)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            metric.update(torch.tensor([2.0, NAN, 3.0]))
            assert _messages(seen) == [WARN_TEXT]  # upstream: at once, during update
        assert float(metric.compute()) == (6.0 if isinstance(metric, Product) else 5.0)


@pytest.mark.usefixtures("on_a_device")  # at a settle point, as on a GPU before the copy lands
def test_the_pending_report_is_no_metric_state_and_goes_before_its_data():
    _apply()
    metric = MeanMetric(nan_strategy="error")
    metric.update(torch.tensor([NAN, 1.0]))
    metric.persistent(True)
    with pytest.raises(RuntimeError) as raised:  # the data would leave in the state_dict: reported first
        metric.state_dict()
    assert str(raised.value) == _deferred(ERROR_TEXT, "MeanMetric", 1, "state_dict()", first=1)
    assert sorted(metric.state_dict()) == sorted(metric._defaults) == sorted(name for name in vars(metric)["_defaults"]
                                                                           if not name.startswith("_"))
    metric.update(torch.tensor([NAN]))
    with pytest.raises(RuntimeError) as raised:
        pickle.dumps(metric)
    assert str(raised.value) == _deferred(ERROR_TEXT, "MeanMetric", 1, "pickling", first=2)
    assert b"tmpatch" not in pickle.dumps(metric)
    for twin in (copy.deepcopy(metric), metric.clone()):
        assert float(twin.compute()) == 1.0  # a copy starts with nothing pending
    metric.compute()


@pytest.mark.usefixtures("on_a_device")  # at a settle point, as on a GPU before the copy lands
def test_the_report_counts_updates_not_elements():
    _apply()
    metric = MeanMetric(nan_strategy="warn")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        metric.update(torch.tensor([NAN, NAN, 1.0]), torch.tensor([1.0, NAN, NAN]))  # NaN in value and weight
        metric.update(torch.tensor([2.0]), torch.tensor([NAN]))  # in the weight only
        metric.update(torch.tensor([3.0]))
        metric.compute()
    assert _messages(seen) == [_deferred(WARN_TEXT, "MeanMetric", 2, first=1)]


def test_patch_reverts_cleanly():
    _apply()
    metric = SumMetric(nan_strategy="warn")
    tmpatch.revert()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        metric.update(torch.tensor([NAN]))
        assert _messages(seen) == [WARN_TEXT]  # the release's code again


# -- syncs (simulated CUDA) ------------------------------------------------------------------
SYNC_FREE = [SumMetric, MeanMetric, MaxMetric, MinMetric, *RUNNING]


def _syncs(metric, method: str, *args) -> int:
    from tmpatch.audit import audit

    report = audit(getattr(metric, method), *args)
    assert report.complete, report
    return report.count


@pytest.mark.parametrize("cls", SYNC_FREE, ids=lambda c: c.__name__)
def test_update_and_forward_are_sync_free(cls):
    value = torch.tensor([1.0, NAN, 3.0])
    for strategy in STRATEGIES:
        if strategy != "disable":
            assert _syncs(cls(nan_strategy=strategy), "update", value) >= 1, strategy  # the release
    _apply()
    tmpatch.apply("mean_default_weight")  # MeanMetric.update's own default-weight copy (<= 1.6.1)
    for strategy in STRATEGIES:
        metric = cls(nan_strategy=strategy)
        assert _syncs(metric, "update", value) == 0, strategy
        assert _syncs(metric, "forward", value) == 0, strategy
        if cls is MeanMetric:
            assert _syncs(metric, "update", value, torch.tensor([1.0, 2.0, NAN])) == 0, strategy


def test_python_scalars_are_made_on_the_device():
    from tmpatch.audit import audit

    def copies(metric) -> int:
        return len(audit(metric.update, 3.5).of_kind("host-to-device copy"))

    assert copies(SumMetric()) >= 1
    _apply()
    for cls in (SumMetric, MaxMetric, MinMetric, CatMetric):
        assert copies(cls(nan_strategy=0.0)) == 0


def test_cat_keeps_its_one_inherent_sync():
    _apply()
    value = torch.tensor([1.0, NAN])
    for strategy in ("warn", "ignore", "error"):
        assert _syncs(CatMetric(nan_strategy=strategy), "update", value) == 1
    assert _syncs(CatMetric(nan_strategy=0.0), "update", value) == 0


def test_eager_policy_is_the_releases_path():
    """``eager``: the release's own check, its syncs included, for the removing strategies."""
    value = torch.tensor([1.0, NAN])
    release = {s: _syncs(SumMetric(nan_strategy=s), "update", value) for s in ("warn", "ignore")}
    assert min(release.values()) >= 1
    _apply("eager")
    for strategy, syncs in release.items():
        assert _syncs(SumMetric(nan_strategy=strategy), "update", value) == syncs


# -- indistinguishable from the release: the CPU path, the deferred words ------------------
def _seen(make, calls) -> List[Any]:
    """What a user sees of ``calls`` on a metric ``make()`` builds: per call, the value (or
    None), the exception's type and words, and each warning's words, category, file and line."""
    metric = make()
    seen: List[Any] = []
    for name, args in calls:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                value = getattr(metric, name)(*args)
                error = None
            except Exception as exc:  # noqa: BLE001 - compared with the release's
                value, error = None, (type(exc), str(exc))
        words = [(str(w.message), w.category, w.filename, w.lineno) for w in caught]
        seen.append((name, _detached(value), error, words))
    seen.append(("states", [_detached(getattr(metric, n)) for n in metric._defaults], None, []))
    return seen


def _detached(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return (value.dtype, tuple(value.shape), value.requires_grad, value.detach().clone())
    if isinstance(value, list):
        return [_detached(v) for v in value]
    return value


def _same_seen(patched: List[Any], release: List[Any]) -> None:
    assert len(patched) == len(release)
    for got, want in zip(patched, release):
        assert got[0] == want[0] and got[2] == want[2] and got[3] == want[3], (got, want)
        pairs = [(got[1], want[1])]
        while pairs:
            a, b = pairs.pop()
            if isinstance(a, list):
                assert isinstance(b, list) and len(a) == len(b), (a, b)
                pairs.extend(zip(a, b))
            elif isinstance(a, tuple):
                assert a[:3] == b[:3], (a, b)
                assert_bitwise(a[3], b[3])
            else:
                assert a == b, (a, b)


@st.composite
def _calls(draw, kind: str):
    calls = []
    for args in draw(_updates(kind, with_nan=True)):
        if draw(st.booleans()) and all(isinstance(a, torch.Tensor) for a in args):
            if draw(st.booleans()):  # a value that requires grad: what the release's removal keeps of it
                args = tuple(a.requires_grad_() if a.is_floating_point() else a for a in args)
        calls.append((draw(st.sampled_from(["update", "forward"])), args))
    calls.append(("compute", ()))
    return calls


@settings(max_examples=examples(60), deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_on_the_cpu_a_removing_strategy_is_the_release_bit_for_bit(data):
    """On the CPU a read costs nothing: ``ignore``/``warn``/``error`` run the release's own check.
    Values and states bit for bit (their dtype, shape and requires_grad), each warning's words,
    category, file and line, each error's type and words from the same call: forward()'s inner
    updates warn as the release's do (twice for a full-state metric), a NaN that requires grad is
    removed without its graph."""
    kind = data.draw(st.sampled_from(sorted(KINDS)))
    strategy = data.draw(st.sampled_from(["warn", "ignore", "error"]))
    calls = data.draw(_calls(kind))
    tmpatch.revert()
    release = _seen(lambda: KINDS[kind](nan_strategy=strategy), _clone_calls(calls))
    _apply()
    _same_seen(_seen(lambda: KINDS[kind](nan_strategy=strategy), _clone_calls(calls)), release)


def _clone_calls(calls):
    return [(name, tuple(a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a
                         for a in args)) for name, args in calls]


@pytest.mark.parametrize("policy", ["deferred", "eager"])
def test_cat_metric_drops_a_nan_that_requires_grad_as_the_release(policy):
    """The release removes NaN under update()'s no_grad: compute() holds no graph."""
    value = torch.tensor([1.0, NAN, 2.0], requires_grad=True)
    _apply(policy)
    metric = CatMetric(nan_strategy="ignore")
    metric.update(value)
    assert metric.compute().numpy().tolist() == [1.0, 2.0]


def test_eager_is_the_releases_path_on_a_device_too():
    """``eager``: the release's own check also where the values are not on the host."""
    updates = [(torch.tensor([1.0, NAN, 3.0]),), (torch.tensor([2.5]),)]
    want = _seen(lambda: MeanMetric(nan_strategy="warn"), [("update", a) for a in updates])
    _apply("eager")
    cpu_shortcuts(False)
    _same_seen(_seen(lambda: MeanMetric(nan_strategy="warn"), [("update", a) for a in updates]), want)


def _release_warning_place() -> Tuple[str, int]:
    """Where the release's NaN warning is attributed (file, line)."""
    tmpatch.revert()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        SumMetric(nan_strategy="warn").update(torch.tensor([NAN]))
    (only,) = caught
    return only.filename, only.lineno


@pytest.mark.usefixtures("on_a_device")
def test_a_deferred_warning_is_the_releases_words_from_the_releases_place(caplog):
    """Words, category, file and line as the release's (a filter on the module or an anchored
    regex silences it as it silences the release's); what tmpatch adds goes to its logger."""
    place = _release_warning_place()
    _apply()
    metric = SumMetric(nan_strategy="warn")
    metric.update(torch.tensor([1.0, NAN]))
    with caplog.at_level("INFO", logger="tmpatch"), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        metric.compute()
    assert [(str(w.message), w.category, w.filename, w.lineno) for w in caught] == [(WARN_TEXT, UserWarning) + place]
    assert any(_note("SumMetric", 1, first=1) in r.getMessage() for r in caplog.records)
    metric.update(torch.tensor([NAN]))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", message=r".*Will be removed\.$")
        metric.compute()
    assert caught == []


@pytest.mark.usefixtures("on_a_device")
def test_a_deferred_warning_shows_once_per_place_under_the_default_filter():
    """Python's ``default`` action shows the release's warning once per place: so tmpatch's."""
    _apply()
    metric = MeanMetric(nan_strategy="warn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.resetwarnings()
        warnings.simplefilter("default")
        module = sys.modules[warnings.WarningMessage.__module__]
        module._filters_mutated() if hasattr(module, "_filters_mutated") else None
        for _ in range(3):
            metric.update(torch.tensor([NAN, 1.0]))
            metric.compute()
    assert len(_messages(caught)) == 1


@pytest.mark.skipif(release_in("<1.0.0"), reason="0.10-0.11 warn on every rank (warnings.warn)")
@pytest.mark.usefixtures("on_a_device")
def test_a_deferred_warning_keeps_the_releases_rank_rule(monkeypatch):
    """rank_zero_warn: a NaN seen on rank 1 prints nothing there, as the release's."""
    from torchmetrics.utilities import prints

    monkeypatch.setattr(prints.rank_zero_only, "rank", 1)
    _apply()
    metric = SumMetric(nan_strategy="warn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        metric.update(torch.tensor([NAN]))
        metric.compute()
    assert _messages(caught) == []


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.float32])
def test_an_imputed_input_that_requires_grad_keeps_grad_only_where_the_releases_cast_keeps_it(dtype):
    """The release writes into the caller's tensor under update()'s no_grad, then casts: its own
    tensor (float32: requires grad) or a cast made without grad (any other dtype)."""
    value = torch.tensor([1.0, NAN], dtype=dtype, requires_grad=True)
    release = CatMetric(nan_strategy=2.5)
    release.update(value.detach().clone().requires_grad_())
    _apply()
    patched = CatMetric(nan_strategy=2.5)
    patched.update(value)
    got, want = (m.value[0] if isinstance(m.value, list) else m.value for m in (patched, release))
    assert got.requires_grad == want.requires_grad == (dtype == torch.float32)
    assert_bitwise(got.detach(), want.detach())
