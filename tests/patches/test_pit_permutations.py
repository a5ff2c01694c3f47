"""pit_permutations: PIT's permutation table built on the device, the release's table."""
from __future__ import annotations

import importlib

import pytest
import torch

import tmpatch
from tests.conftest import assert_bitwise, cpu_shortcuts
from torchmetrics.audio import PermutationInvariantTraining
from torchmetrics.functional.audio import scale_invariant_signal_noise_ratio

PIT = importlib.import_module("torchmetrics.functional.audio.pit")


@pytest.fixture(autouse=True)
def _fresh_cache(monkeypatch):
    """A cache of the tables of its own for each test (simulated tensors must not stay in it)."""
    monkeypatch.setattr(PIT, "_ps_dict", {})
    yield
    cpu_shortcuts(True)


def _apply() -> None:
    row = next(r for r in tmpatch.apply(["pit_permutations"]) if r.name == "pit_permutations")
    assert row.state == "applied", row


def _metric():
    return PermutationInvariantTraining(scale_invariant_signal_noise_ratio, eval_func="max")


def test_first_update_copies_no_table_to_simulated_cuda(monkeypatch):
    from tmpatch.audit import audit

    # three speakers take the table only without scipy (with it, scipy's solver on the host):
    # the test's path must not depend on what else the environment holds
    if hasattr(PIT, "_SCIPY_AVAILABLE"):
        monkeypatch.setattr(PIT, "_SCIPY_AVAILABLE", False)

    preds, target = torch.randn(2, 3, 20), torch.randn(2, 3, 20)
    unpatched = audit(_metric().update, preds, target, real=False)
    assert [p.function for p in unpatched.sync_points] == ["_gen_permutations"], str(unpatched)
    PIT._ps_dict.clear()
    _apply()
    for call in (lambda m: m.update, lambda m: m):
        PIT._ps_dict.clear()
        report = audit(call(_metric()), preds, target, real=False)
        assert report.count == 0, str(report)
    PIT._ps_dict.clear()


@pytest.mark.parametrize("cpu_fast", [True, False])
def test_the_table_is_the_releases(cpu_fast):
    expected = {n: PIT._gen_permutations(n, torch.device("cpu")) for n in range(0, 7)}
    _apply()
    cpu_shortcuts(cpu_fast)
    for n, want in expected.items():
        PIT._ps_dict.clear()
        got = PIT._gen_permutations(n, torch.device("cpu"))
        assert got is not want
        assert_bitwise(got, want)


def test_results_equal_the_releases():
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randn(3, 4, 16, generator=g), torch.randn(3, 4, 16, generator=g)) for _ in range(2)]

    def run():
        PIT._ps_dict.clear()
        metric = _metric()
        out = [metric(*batches[0])]
        metric.update(*batches[1])
        return out + [metric.compute()]

    want = run()
    _apply()
    cpu_shortcuts(False)
    for a, b in zip(run(), want):
        assert_bitwise(a, b)
