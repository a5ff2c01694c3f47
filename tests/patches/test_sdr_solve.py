"""sdr_solve: SignalDistortionRatio's solve without reading the solver's error code, a singular
system reported at compute()."""
from __future__ import annotations

import re
import warnings

import pytest
import torch
from hypothesis import given, settings, strategies as st
from torchmetrics.audio import SignalDistortionRatio
from torchmetrics.functional.audio import signal_distortion_ratio

import tmpatch
from tests.conftest import assert_bitwise, cpu_shortcuts, examples
from tests.patches.eager import assert_eager_is_the_release
from tests.patches.release_calls import assert_calls_are_the_releases
from tmpatch.patches import sdr_solve as patch
from tmpatch.runtime import deferred


@pytest.fixture(autouse=True)
def _device_path():
    yield
    cpu_shortcuts(True)


def _apply() -> None:
    row = next(r for r in tmpatch.apply(["sdr_solve"]) if r.name == "sdr_solve")
    assert row.state == "applied", row


def _pending(metric) -> int:
    return int(deferred.local_records(metric).get("sdr_solve", 0))


def _signals(seed: int, batch: int = 2, length: int = 200, dtype: torch.dtype = torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(batch, length, generator=g, dtype=dtype),
            torch.randn(batch, length, generator=g, dtype=dtype))


def test_an_update_reads_nothing_on_simulated_cuda():
    from tmpatch.audit import audit

    preds, target = _signals(0)
    report = audit(SignalDistortionRatio(filter_length=32).update, preds, target, real=False)
    assert any(p.function == "signal_distortion_ratio" and p.op == "aten._linalg_check_errors"
               for p in report.sync_points), str(report)
    _apply()
    for call in (lambda m: m.update, lambda m: m):
        report = audit(call(SignalDistortionRatio(filter_length=32)), preds, target, real=False)
        assert report.count == 0, str(report)


@settings(max_examples=examples(5), deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**16), st.integers(1, 3), st.sampled_from([4, 16, 64]), st.booleans(),
                          st.sampled_from([None, 1e-3]), st.booleans(), st.sampled_from([torch.float32, torch.float64]),
                          st.booleans()), min_size=1, max_size=6))
def test_states_and_results_equal_the_releases(cases):
    """Several cases per example: one revert/apply for all of them (the slow part). Float64 signals
    keep the solution's last bits in the result (float32 ones round them away)."""

    def run(seed, batch, filter_length, zero_mean, load_diag, forward, dtype):
        metric = SignalDistortionRatio(filter_length=filter_length, zero_mean=zero_mean, load_diag=load_diag)
        out = []
        for step in range(2):
            result = (metric if forward else metric.update)(*_signals(seed + step, batch, 96, dtype))
            if result is not None:
                out.append(result)
        return out + [metric.sum_sdr, metric.total, metric.compute()]

    tmpatch.revert()
    expected = [run(*case[:7]) for case in cases]
    _apply()
    for case, want in zip(cases, expected):
        cpu_shortcuts(case[7])
        for a, b in zip(run(*case[:7]), want):
            assert_bitwise(a, b)


@settings(max_examples=examples(10), deadline=None)
@given(st.integers(0, 2**16), st.integers(1, 3), st.sampled_from([4, 16, 64]), st.booleans(),
       st.sampled_from([None, 1e-3]), st.booleans())
def test_the_solve_in_a_marked_update_is_the_releases_bit_for_bit(seed, batch, filter_length, zero_mean, load_diag,
                                                                  shortcuts):
    """The per-signal SDR (float64: the solution's last bits reach the result; a state rounds them
    to float32) of the functional code as a marked update runs it."""
    import torchmetrics.functional.audio.sdr as module

    preds, target = _signals(seed, batch, 96, torch.float64)
    kwargs = dict(filter_length=filter_length, zero_mean=zero_mean, load_diag=load_diag)
    tmpatch.revert()
    want = module.signal_distortion_ratio(preds, target, **kwargs)
    _apply()
    cpu_shortcuts(shortcuts)
    token = patch.MARK.slot.set(SignalDistortionRatio())
    try:
        got = module.signal_distortion_ratio(preds, target, **kwargs)
    finally:
        patch.MARK.slot.reset(token)
    assert got.dtype == torch.float64
    assert_bitwise(got, want)


@pytest.mark.parametrize("batch", [0, 3])
def test_on_the_cpu_every_call_is_the_releases(batch):
    """The release's solve from the same update (forward included): torch's error there, its batch
    element named, no batch added."""
    good = _signals(1, max(batch, 1))
    silent = (good[0], good[1].clone())
    silent[1][-1] = 0  # a silent target: a zero autocorrelation, singular (the last batch element)
    if not batch:
        good, silent = (good[0][0], good[1][0]), (silent[0][0], silent[1][0])
    calls = [lambda m: m.update(*good), lambda m: m.update(*silent), lambda m: m.compute(), lambda m: m(*silent),
             lambda m: m.compute(), lambda m: m.reset(), lambda m: m(*good), lambda m: m.compute()]
    want = assert_calls_are_the_releases(lambda: SignalDistortionRatio(filter_length=16), calls, ["sdr_solve"])
    assert want[0] is None and want[1].startswith(f"{torch.linalg.LinAlgError.__name__}: torch.linalg.solve: "), want
    assert ("(Batch element 2)" in want[1]) is bool(batch), want


@pytest.mark.usefixtures("held_reports")  # at compute(), as on a GPU before the copy lands
@pytest.mark.parametrize("shortcuts", [False])
def test_a_singular_system_raises_torchs_error_at_the_next_compute_once(shortcuts):
    good = _signals(1)
    silent = (good[0], torch.zeros_like(good[1]))  # a silent target: a zero autocorrelation, singular
    with pytest.raises(torch.linalg.LinAlgError, match="singular"):
        SignalDistortionRatio(filter_length=16).update(*silent)  # upstream: in update()
    _apply()
    cpu_shortcuts(shortcuts)
    metric = SignalDistortionRatio(filter_length=16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        metric.update(*silent)  # no error here
        metric(*silent)
    metric.update(*good)
    assert _pending(metric) == 2
    with pytest.raises(torch.linalg.LinAlgError, match=f"^{re.escape(patch.MESSAGE)} \\(tmpatch sdr_solve: 2 upd"):
        metric.compute()
    metric.compute()  # reported once
    metric.update(*silent)
    with pytest.raises(torch.linalg.LinAlgError,
                       match=f"^{re.escape(patch.MESSAGE)} \\(tmpatch sdr_solve: 1 upd.*reported at reset\\(\\)"):
        metric.reset()  # the batch is dropped: its report comes there, once, after the reset
    assert _pending(metric) == 0 and int(metric.total) == 0
    metric.update(*good)
    assert torch.isfinite(metric.compute())


def test_functional_api_and_metrics_built_before_apply_raise_in_update():
    early = SignalDistortionRatio(filter_length=16)
    _apply()
    preds, target = _signals(2)
    silent = torch.zeros_like(target)
    with pytest.raises(torch.linalg.LinAlgError):
        early.update(preds, silent)
    with pytest.raises(torch.linalg.LinAlgError):
        signal_distortion_ratio(preds, silent, filter_length=16)


@pytest.mark.parametrize("shortcuts", [True, False])
def test_the_eager_policy_raises_the_releases_error_in_update(shortcuts):
    good = _signals(1)
    silent = (good[0], torch.zeros_like(good[1]))  # a silent target: a zero autocorrelation, singular
    assert_eager_is_the_release(lambda: SignalDistortionRatio(filter_length=16), [good], silent, ["sdr_solve"],
                                shortcuts)
