"""tweedie_checks: TweedieDevianceScore's range checks counted on the device, their errors at compute()."""
from __future__ import annotations

import re
import warnings

import pytest
import torch
from hypothesis import given, settings, strategies as st
from torchmetrics.functional.regression import tweedie_deviance_score
from torchmetrics.regression import TweedieDevianceScore

import tmpatch
from tests.conftest import assert_bitwise, cpu_shortcuts, examples
from tests.patches.eager import assert_eager_is_the_release
from tests.patches.release_calls import assert_calls_are_the_releases
from tmpatch.patches import tweedie_checks as patch
from tmpatch.runtime import deferred

POWERS = {1: "poisson", 2: "positive", -1: "negative_power", 1.5: "compound", 3: "positive"}


@pytest.fixture(autouse=True)
def _device_path():
    yield
    cpu_shortcuts(True)


def _apply() -> None:
    row = next(r for r in tmpatch.apply(["tweedie_checks", "scalar_tensors"]) if r.name == "tweedie_checks")
    assert row.state == "applied", row


def _pending(metric) -> int:
    return sum(int(v) for k, v in deferred.local_records(metric).items() if k.startswith("tweedie_checks"))


def test_checked_updates_read_nothing_on_simulated_cuda():
    from tmpatch.audit import audit

    preds, target = torch.rand(8) + 0.1, torch.rand(8) + 0.1
    for power in POWERS:
        report = audit(TweedieDevianceScore(power=power).update, preds, target, real=False)
        assert any(p.function == "_tweedie_deviance_score_update" and p.op == "aten._local_scalar_dense"
                   for p in report.sync_points), (power, str(report))
    _apply()  # with scalar_tensors: the count is not copied either
    for power in POWERS:
        for call in (lambda m: m.update, lambda m: m):
            report = audit(call(TweedieDevianceScore(power=power)), preds, target, real=False)
            assert report.count == 0, (power, str(report))


@settings(max_examples=examples(5), deadline=None)
@given(st.lists(st.tuples(st.sampled_from(sorted(POWERS) + [0]), st.integers(1, 6), st.integers(0, 2**16),
                          st.booleans(), st.booleans()), min_size=1, max_size=8))
def test_states_and_results_equal_the_releases(cases):
    """Several cases per example: one revert/apply for all of them (the slow part)."""

    def run(power, rows, seed, forward):
        g = torch.Generator().manual_seed(seed)
        metric = TweedieDevianceScore(power=power)
        out = []
        for _ in range(2):
            args = (torch.rand(rows, generator=g) + 0.1, torch.rand(rows, generator=g) + 0.1)
            result = (metric if forward else metric.update)(*args)
            if result is not None:
                out.append(result)
        return out + [metric.sum_deviance_score, metric.num_observations, metric.compute()]

    tmpatch.revert()
    expected = [run(*case[:4]) for case in cases]
    _apply()
    for case, want in zip(cases, expected):
        cpu_shortcuts(case[4])
        for a, b in zip(run(*case[:4]), want):
            assert_bitwise(a, b)


BAD = (torch.tensor([0.5, -1.0, 2.0]), torch.tensor([1.0, 1.0, -2.0]))
GOOD = (torch.tensor([0.5, 1.0, 2.0]), torch.tensor([1.0, 1.5, 2.0]))


@pytest.mark.parametrize("power", sorted(POWERS))
def test_on_the_cpu_every_call_is_the_releases(power):
    """The release's check from the same update (forward included), before the batch is added."""
    calls = [lambda m: m.update(*GOOD), lambda m: m.update(*BAD), lambda m: m.compute(), lambda m: m(*BAD),
             lambda m: m.compute(), lambda m: m.reset(), lambda m: m(*GOOD), lambda m: m.compute()]
    want = assert_calls_are_the_releases(lambda: TweedieDevianceScore(power=power), calls,
                                         ["tweedie_checks", "scalar_tensors"])
    assert want[1] == f"ValueError: For power={power}, {patch.MESSAGES[POWERS[power]]}"


@pytest.mark.usefixtures("held_reports")  # at compute(), as on a GPU before the copy lands
@pytest.mark.parametrize("shortcuts", [False])
def test_out_of_domain_input_raises_the_releases_error_at_the_next_compute_once(shortcuts):
    bad = (torch.tensor([0.5, -1.0, 2.0]), torch.tensor([1.0, 1.0, -2.0]))
    good = (torch.tensor([0.5, 1.0, 2.0]), torch.tensor([1.0, 1.5, 2.0]))
    messages = {}
    for power in POWERS:
        with pytest.raises(ValueError) as raised:
            TweedieDevianceScore(power=power).update(*bad)  # upstream: in update()
        messages[power] = str(raised.value)
    _apply()
    cpu_shortcuts(shortcuts)
    for power, key in POWERS.items():
        assert messages[power] == f"For power={power}, {patch.MESSAGES[key]}"
        metric = TweedieDevianceScore(power=power)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            metric.update(*bad)  # no error here
            metric(*bad)
        metric.update(*good)
        assert _pending(metric) == 2, power
        with pytest.raises(ValueError, match=f"^{re.escape(messages[power])} \\(tmpatch tweedie_checks: 2 upd"):
            metric.compute()
        metric.compute()  # reported once
        metric.update(*bad)
        with pytest.raises(ValueError, match=f"^{re.escape(messages[power])} \\(tmpatch tweedie_checks: 1 upd.*"
                           r"reported at reset\(\)"):
            metric.reset()  # the batch is dropped: its report comes there, once, after the reset
        assert _pending(metric) == 0 and metric.num_observations == 0
        metric.update(*good)
        metric.compute()


def test_functional_api_and_metrics_built_before_apply_raise_in_update():
    early = TweedieDevianceScore(power=2)
    _apply()
    bad = (torch.tensor([0.5, -1.0]), torch.tensor([1.0, 1.0]))
    with pytest.raises(ValueError, match="^For power=2, both"):
        early.update(*bad)
    with pytest.raises(ValueError, match="^For power=2, both"):
        tweedie_deviance_score(*bad, power=2)


@pytest.mark.parametrize("shortcuts", [True, False])
@pytest.mark.parametrize("power", sorted(POWERS))
def test_the_eager_policy_raises_the_releases_error_in_update(power, shortcuts):
    good = (torch.tensor([0.5, 1.0, 2.0]), torch.tensor([1.0, 1.5, 2.0]))
    bad = (torch.tensor([0.5, -1.0, 2.0]), torch.tensor([1.0, 1.0, -2.0]))
    assert_eager_is_the_release(lambda: TweedieDevianceScore(power=power), [good], bad,
                                ["tweedie_checks", "scalar_tensors"], shortcuts)
