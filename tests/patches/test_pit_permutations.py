"""pit_permutations: PIT's permutation table built on the device, the release's table."""
from __future__ import annotations

import importlib

import pytest
import torch
from torchmetrics.audio import PermutationInvariantTraining
from torchmetrics.functional.audio import scale_invariant_signal_noise_ratio

import tmpatch
from tests.conftest import assert_bitwise, cpu_shortcuts, release_in

PIT = importlib.import_module("torchmetrics.functional.audio.pit")
#: where the release builds its table (0.10-0.11: inside the exhaustive search)
TABLE_FUNCTION = "_gen_permutations" if release_in(">=1.0.0") else "_find_best_perm_by_exhaustive_method"


def _table(n: int) -> torch.Tensor:
    """The table of ``n`` speakers on the CPU, as the release's code caches it."""
    if release_in(">=1.0.0"):
        return PIT._gen_permutations(n, torch.device("cpu"))
    PIT._find_best_perm_by_exhaustive_method(torch.rand(1, n, n), torch.max)
    return PIT._ps_dict[f"{n}cpu"]


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
    assert [p.function for p in unpatched.sync_points] == [TABLE_FUNCTION], str(unpatched)
    PIT._ps_dict.clear()
    _apply()
    for call in (lambda m: m.update, lambda m: m):
        PIT._ps_dict.clear()
        report = audit(call(_metric()), preds, target, real=False)
        assert report.count == 0, str(report)
    PIT._ps_dict.clear()


@pytest.mark.parametrize("shortcuts", [True, False])
def test_the_table_is_the_releases(shortcuts):
    expected = {}
    for n in range(0 if release_in(">=1.0.0") else 1, 7):
        PIT._ps_dict.clear()
        expected[n] = _table(n)
    _apply()
    cpu_shortcuts(shortcuts)
    for n, want in expected.items():
        PIT._ps_dict.clear()
        got = _table(n)
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
