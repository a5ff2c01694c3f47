"""mean_default_weight: MeanMetric's scalars made on the device, identical results."""
from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import given, settings, strategies as st
from torchmetrics import MeanMetric

import tmpatch
from tests.conftest import assert_bitwise, cpu_shortcuts, examples, release_in

DEFAULT_WEIGHT_COPIES = release_in("<1.6.2")
VALUES = [0.0, 1.0, -2.5, 3.0, 1e30, float("inf"), float("nan")]


def host_copies(report):
    return [p for p in report.sync_points if str(p.kind) == "host-to-device copy"]


def run(metric, updates):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for args in updates:
            metric.update(*args)
        return metric.compute()


@st.composite
def updates(draw, nan: bool = True):
    pool = VALUES if nan else [v for v in VALUES if v == v]

    def value():
        if draw(st.booleans()):
            return draw(st.sampled_from(pool + [2, True]))
        dtype = draw(st.sampled_from([torch.float32, torch.float64, torch.float16, torch.int64]))
        n = draw(st.integers(0, 4))
        values = [draw(st.sampled_from(VALUES[:5] if dtype == torch.int64 else pool)) for _ in range(n)]
        tensor = torch.tensor(values, dtype=torch.float64)
        return tensor.to(dtype) if dtype != torch.int64 else tensor.clamp(-5, 5).to(dtype)

    out = []
    for _ in range(draw(st.integers(1, 3))):
        v = value()
        kind = draw(st.sampled_from(["default", "scalar", "tensor"]))
        if kind == "default":
            out.append((v,))
        elif kind == "scalar":
            out.append((v, draw(st.sampled_from([0.5, 2, 1.0, 0.0]))))
        else:
            shape = v.shape if isinstance(v, torch.Tensor) else ()
            out.append((v, torch.full(shape, 2.0)))
    return out


@settings(max_examples=examples(120), deadline=None)
@given(updates(), st.sampled_from(["warn", "ignore", "error", 0.0]))
def test_results_are_bitwise_the_releases(sequence, nan_strategy):
    upstream = MeanMetric(nan_strategy=nan_strategy)  # built before apply: keeps the release's update
    tmpatch.apply(["mean_default_weight"])
    patched = MeanMetric(nan_strategy=nan_strategy)
    copies = [tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args) for args in sequence]
    try:
        expected = run(upstream, sequence)
    except (RuntimeError, ValueError) as exc:
        with pytest.raises(type(exc)):
            run(patched, copies)
        return
    assert_bitwise(run(patched, copies), expected)


def _outcome(metric, sequence):
    try:
        return run(metric, sequence)
    except (RuntimeError, ValueError) as exc:
        return type(exc)


@settings(max_examples=examples(80), deadline=None)
@given(updates(nan=False), st.sampled_from(["warn", "ignore", "error", 0.0]))
def test_with_nan_check_nan_free_results_are_bitwise_the_releases(sequence, nan_strategy):
    """Both patches (the update body run by the replacement, the check by nan_check)."""
    upstream = MeanMetric(nan_strategy=nan_strategy)
    tmpatch.apply(["mean_default_weight", "nan_check"])
    patched = MeanMetric(nan_strategy=nan_strategy)
    copies = [tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args) for args in sequence]
    assert_bitwise(run(patched, copies), run(upstream, sequence))


@settings(max_examples=examples(80), deadline=None)
@given(updates(), st.sampled_from(["warn", "ignore", "error", 0.0]))
def test_with_nan_check_results_are_nan_checks_alone(sequence, nan_strategy):
    """With NaN too: the replacement's body changes nothing that nan_check decides."""
    tmpatch.apply(["nan_check"])
    alone = MeanMetric(nan_strategy=nan_strategy)  # the release's update, nan_check's check
    tmpatch.apply(["mean_default_weight", "nan_check"])
    both = MeanMetric(nan_strategy=nan_strategy)
    copies = [tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args) for args in sequence]
    expected, actual = _outcome(alone, sequence), _outcome(both, copies)
    if isinstance(expected, type):
        assert actual is expected
    else:
        assert_bitwise(actual, expected)


@pytest.mark.parametrize("on_the_cpu", [True, False], ids=["cpu", "device"])
@pytest.mark.parametrize("nan_strategy", ["warn", "ignore"])
def test_with_nan_check_the_default_weight_broadcasts_to_a_value_without_its_nan(nan_strategy, on_the_cpu):
    """Up to 1.0.0 the release checks the value on its own, its NaN removed, and broadcasts the
    default weight to what is left: patched, no error where the release raises none, its result."""
    value = torch.tensor([1.0, float("nan"), 3.0])
    expected = run(MeanMetric(nan_strategy=nan_strategy), [(value,), (value, 1.0)])
    tmpatch.apply(["mean_default_weight", "nan_check"])
    cpu_shortcuts(on_the_cpu)
    assert_bitwise(run(MeanMetric(nan_strategy=nan_strategy), [(value,), (value, 1.0)]), expected)


@pytest.mark.parametrize("nan_strategy", [0.0, "warn"])
def test_with_nan_check_callers_tensors_are_not_written_into(nan_strategy):
    tmpatch.apply(["mean_default_weight", "nan_check"])
    value, weight = torch.tensor([1.0, float("nan"), 3.0]), torch.tensor([2.0, 1.0, float("nan")])
    before = (value.clone(), weight.clone())
    run(MeanMetric(nan_strategy=nan_strategy), [(value, weight), (value,), (value[0], weight[0])])
    assert_bitwise(value, before[0])
    assert_bitwise(weight, before[1])


def test_a_class_with_its_own_setattr_gets_the_releases_update():
    seen = []

    class Logged(MeanMetric):
        def __setattr__(self, name, value):
            seen.append(name)
            super().__setattr__(name, value)

    tmpatch.apply(["mean_default_weight"])
    metric = Logged()
    seen.clear()
    metric.update(torch.tensor([1.0, 3.0]), torch.tensor([1.0, 3.0]))
    assert "weight" in seen and ("mean_value" in seen or "value" in seen)  # "value" on 1.0.0
    assert metric.compute().item() == 2.5


def test_metrics_built_while_patched_pass_through_after_revert():
    tmpatch.apply(["mean_default_weight"])
    metric = MeanMetric()
    metric.update(2.0)
    tmpatch.revert()
    metric.update(4.0)  # the release's own update again
    assert metric.compute().item() == 3.0


@pytest.mark.skipif(not DEFAULT_WEIGHT_COPIES, reason="the default weight is made with ones_like from 1.6.2")
def test_the_default_weight_no_longer_copies_from_the_host():
    from tmpatch.audit import audit

    unpatched = audit(MeanMetric().update, torch.rand(8))
    assert host_copies(unpatched), str(unpatched)
    assert any("aggregation.py" in p.location for p in host_copies(unpatched))
    tmpatch.apply(["mean_default_weight"])
    patched = audit(MeanMetric().update, torch.rand(8))
    assert not host_copies(patched), str(patched)


@pytest.mark.parametrize("args", [(3.5,), (torch.rand(4), 2.0), (7,), (1.5, 0.5)],
                         ids=["value", "weight", "int", "both"])
def test_python_scalars_no_longer_copy_from_the_host(args):
    from tmpatch.audit import audit

    assert host_copies(audit(MeanMetric().update, *args))
    tmpatch.apply(["mean_default_weight"])
    patched = audit(MeanMetric().update, *args)
    assert not host_copies(patched), str(patched)
