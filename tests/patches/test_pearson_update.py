"""pearson_update: the Pearson/Concordance update's branch known on the host, the release's results."""
from __future__ import annotations

import copy
import warnings

import pytest
import torch
from hypothesis import given, settings, strategies as st

import tmpatch
from tests.conftest import assert_bitwise, release_in
from torchmetrics.functional.regression import pearson_corrcoef
from torchmetrics.regression import ConcordanceCorrCoef, PearsonCorrCoef

NEEDED = release_in("<1.7.4")
needed = pytest.mark.skipif(not NEEDED, reason="fixed upstream in 1.7.4")
CLASSES = {"pearson": PearsonCorrCoef, "concordance": ConcordanceCorrCoef}
STATES = ("mean_x", "mean_y", "var_x", "var_y", "corr_xy", "n_total")


def _apply() -> None:
    row = next(r for r in tmpatch.apply(["pearson_update"]) if r.name == "pearson_update")
    assert row.state == ("applied" if NEEDED else "not-needed"), row


def test_state_on_this_release():
    _apply()


def _reads_per_update(metric, batches, resets=()):
    """Sync points of each update of ``metric`` on simulated CUDA, the states kept between them."""
    from tmpatch.audit import simulated_cuda

    counts = []
    with simulated_cuda("cuda:0") as sim:
        sim.put(metric)
        for step, (preds, target) in enumerate(batches):
            if step in resets:
                metric.reset()
            del sim.sync_points[:]
            metric.update(*sim.put((preds, target)))
            counts.append(len(sim.sync_points))
    return counts


@needed
@pytest.mark.parametrize("outputs", [1, 2])
def test_the_condition_is_read_once_per_count_state(outputs):
    """Unpatched every update reads (the test can fail); patched, the first update of a count state
    reads once and the next ones not at all, until reset() makes a new state."""
    shape = (6,) if outputs == 1 else (6, outputs)
    batches = [(torch.rand(shape), torch.rand(shape)) for _ in range(5)]
    for cls in CLASSES.values():
        assert all(_reads_per_update(cls(num_outputs=outputs), batches))
    _apply()
    for cls in CLASSES.values():
        assert _reads_per_update(cls(num_outputs=outputs), batches, resets=(3,)) == [1, 0, 0, 1, 0]
        assert _reads_per_update(cls(num_outputs=outputs), [(b[0][:1], b[1][:1]) for b in batches]) == [1, 0, 0, 0, 0]


@needed
def test_functional_api_keeps_the_releases_read():
    from tmpatch.audit import audit

    _apply()
    report = audit(pearson_corrcoef, torch.rand(6), torch.rand(6), real=False)
    assert any(p.function == "_pearson_corrcoef_update" for p in report.sync_points), str(report)


# -- same results -------------------------------------------------------------------------------
@st.composite
def _scripts(draw):
    """A metric kind, its outputs, and a list of steps: update / forward (batch sizes 0-4), reset,
    load (another metric's states), copy (a deep copy goes on), move (``.to``: new tensors)."""
    outputs = draw(st.sampled_from([1, 2]))
    steps = []
    for _ in range(draw(st.integers(1, 7))):
        kind = draw(st.sampled_from(["update", "update", "update", "forward", "reset", "load", "copy", "move"]))
        rows = draw(st.integers(1, 4))
        shape = (rows,) if outputs == 1 else (rows, outputs)
        values = st.lists(st.floats(-4, 4, width=32), min_size=rows * outputs, max_size=rows * outputs)
        batch = (torch.tensor(draw(values)).reshape(shape), torch.tensor(draw(values)).reshape(shape))
        steps.append((kind, batch))
    return draw(st.sampled_from(sorted(CLASSES))), outputs, steps


def _run(script):
    name, outputs, steps = script
    metric = CLASSES[name](num_outputs=outputs)
    seen = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for kind, batch in steps:
            if kind == "update":
                metric.update(*batch)
            elif kind == "forward":
                seen.append(metric(*batch))
            elif kind == "reset":
                metric.reset()
            elif kind == "load":
                other = CLASSES[name](num_outputs=outputs)
                other.update(*batch)
                other.persistent(True)
                metric.persistent(True)
                metric.load_state_dict(other.state_dict())
            elif kind == "copy":
                metric = copy.deepcopy(metric)
            else:
                metric = metric.to(torch.float64).to(torch.float32)
            seen.extend(getattr(metric, s) for s in STATES)
        seen.append(metric.compute())
    return seen


@needed
@settings(max_examples=15, deadline=None)
@given(st.lists(_scripts(), min_size=1, max_size=4))
def test_states_and_results_equal_the_releases(scripts):
    tmpatch.revert()
    expected = [_run(script) for script in scripts]
    _apply()
    for script, want in zip(scripts, expected):
        got = _run(script)
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert_bitwise(a, b)
