"""pearson_update: the Pearson/Concordance update's branch known on the host, the release's results."""
from __future__ import annotations

import copy
import warnings

import pytest
import torch
from hypothesis import given, settings, strategies as st
from torchmetrics.functional.regression import pearson_corrcoef
from torchmetrics.regression import ConcordanceCorrCoef, PearsonCorrCoef

import tmpatch
from tests.conftest import assert_bitwise, examples, release_in

NEEDED = release_in(">=1.0.0,<1.7.4")  # 0.10-0.11: no branch on the counts, no read
needed = pytest.mark.skipif(not NEEDED, reason="fixed upstream in 1.7.4; 0.10-0.11 never read")
CLASSES = {"pearson": PearsonCorrCoef, "concordance": ConcordanceCorrCoef}
STATES = ("mean_x", "mean_y", "var_x", "var_y", "corr_xy", "n_total")


def _apply() -> None:
    row = next(r for r in tmpatch.apply(["pearson_update"]) if r.name == "pearson_update")
    assert row.state == ("applied" if NEEDED else "not-needed"), row


def test_state_on_this_release():
    _apply()


def _reads_per_update(metric, batches, before=None):
    """Sync points of each update of ``metric`` on simulated CUDA (moved there by ``Module._apply``
    with the audit's move), the states kept between them; ``before[step](metric)`` runs before
    the update of that step."""
    from tmpatch.audit import simulated_cuda

    counts = []
    with simulated_cuda("cuda:0") as sim:
        sim.put(metric)
        for step, (preds, target) in enumerate(batches):
            if before and step in before:
                before[step](metric)
            del sim.sync_points[:]
            metric.update(*sim.put((preds, target)))
            counts.append(len(sim.sync_points))
    return counts


@needed
@pytest.mark.parametrize("outputs", [1, 2])
def test_the_condition_is_never_read_across_construction_moves_and_resets(outputs):
    """Unpatched every update reads (the test can fail); patched, the counts are known from
    construction, across the move to the device and reset(), and from each update: no read."""
    shape = (6,) if outputs == 1 else (6, outputs)
    batches = [(torch.rand(shape), torch.rand(shape)) for _ in range(5)]
    for cls in CLASSES.values():
        assert all(_reads_per_update(cls(num_outputs=outputs), batches))
    _apply()
    for cls in CLASSES.values():
        assert _reads_per_update(cls(num_outputs=outputs), batches, {3: lambda m: m.reset()}) == [0] * 5
        assert _reads_per_update(cls(num_outputs=outputs), [(b[0][:1], b[1][:1]) for b in batches]) == [0] * 5
        # moved to the CPU and back by Module.to: zeros stay zeros
        metric = cls(num_outputs=outputs).to(torch.float64).to(torch.float32)
        assert _reads_per_update(metric, batches, {2: lambda m: m.reset()}) == [0] * 5


@pytest.mark.skipif(release_in(">=1.0.0"), reason="0.10-0.11 only")
def test_0x_updates_read_nothing_so_the_patch_is_not_needed():
    batches = [(torch.rand(6), torch.rand(6)) for _ in range(3)]
    for cls in CLASSES.values():
        assert _reads_per_update(cls(), batches) == [0] * 3
    _apply()  # not-needed, with the reason


@needed
def test_a_count_state_the_patch_does_not_know_is_read_once():
    """Loaded counts, and counts moved by a function that may change values, are read by the
    first update after it (the release's condition), then known again. A reset after a load makes
    the counts a copy of the default, still known; after such a move the default is not known
    either, and the first update after the reset reads once."""
    batches = [(torch.rand(6), torch.rand(6)) for _ in range(6)]
    other = PearsonCorrCoef()
    other.update(torch.rand(4), torch.rand(4))
    other.persistent(True)

    def load(metric):
        metric.persistent(True)
        metric.load_state_dict(other.state_dict())  # real CPU tensors: moved with the metric's states below
        from tmpatch.audit.oracle.sim import to_sim_cuda

        to_sim_cuda(metric)

    _apply()
    plus_zero = {1: lambda m: m._apply(lambda t: t + 0), 4: lambda m: m.reset()}
    assert _reads_per_update(PearsonCorrCoef(), batches, plus_zero) == [0, 1, 0, 0, 1, 0]
    assert _reads_per_update(PearsonCorrCoef(), batches, {2: load, 4: lambda m: m.reset()}) == [0, 0, 1, 0, 0, 0]


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
    load (another metric's states), copy (a deep copy goes on), move (``.to``: new tensors), apply
    (``_apply`` of a function that doubles every state and default: counts the patch cannot know)."""
    outputs = draw(st.sampled_from([1, 2]))
    steps = []
    for _ in range(draw(st.integers(1, 7))):
        kind = draw(st.sampled_from(["update", "update", "update", "forward", "reset", "load", "copy", "move",
                                     "apply"]))
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
            elif kind == "apply":  # a function the patch does not know: what it knew is dropped
                metric._apply(lambda t: t * 2 if t.dim() else t)
            else:
                metric = metric.to(torch.float64).to(torch.float32)
            seen.extend(getattr(metric, s) for s in STATES)
        seen.append(metric.compute())
    return seen


@needed
@settings(max_examples=examples(15), deadline=None)
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


@needed
def test_counts_copied_or_loaded_on_the_cpu_are_known_before_the_move():
    """A copy or a load made on the CPU is read there (free) before the move to the device: zero
    counts are known, counts with values are read once by the first update on the device."""
    batches = [(torch.rand(6), torch.rand(6)) for _ in range(3)]
    _apply()
    fresh = PearsonCorrCoef()
    assert _reads_per_update(copy.deepcopy(fresh), batches) == [0, 0, 0]
    loaded = PearsonCorrCoef()
    fresh.persistent(True)
    loaded.persistent(True)
    loaded.load_state_dict(fresh.state_dict())
    assert _reads_per_update(loaded, batches) == [0, 0, 0]
    used = PearsonCorrCoef()
    used.update(torch.rand(4), torch.rand(4))
    assert _reads_per_update(copy.deepcopy(used), batches) == [1, 0, 0]


def test_cpu_zeros_reads_only_plain_contiguous_cpu_tensors():
    from tmpatch.patches.pearson_update.knowledge import cpu_zeros as _cpu_zeros

    assert _cpu_zeros(torch.zeros(3), torch.Tensor)
    assert _cpu_zeros(torch.zeros(4)[1:], torch.Tensor)  # an offset into the storage
    assert not _cpu_zeros(torch.tensor([0.0, 0.0, 2.0])[:3], torch.Tensor)
    assert not _cpu_zeros(torch.tensor([0.0, -0.0]), torch.Tensor)  # -0.0: not known, read later
    assert not _cpu_zeros(torch.zeros(2, 2).t()[0], torch.Tensor)  # not contiguous
    assert not _cpu_zeros(torch.zeros(0), torch.Tensor)
    assert not _cpu_zeros(torch.zeros(3, device="meta"), torch.Tensor)
    assert not _cpu_zeros(torch.nn.Parameter(torch.zeros(2)), torch.Tensor)  # not a plain tensor
    assert not _cpu_zeros(None, torch.Tensor)


@needed
def test_a_loop_of_forward_calls_reads_only_in_compute():
    """forward() saves the states, updates on the batch alone and puts them back: the counts are
    known throughout (unpatched: two or more update reads per call; the test can fail). The reads left
    are compute()'s, which forward() makes for the batch value."""
    from tmpatch.audit import simulated_cuda

    def update_reads(patched):
        tmpatch.revert()
        if patched:
            _apply()
        metric = PearsonCorrCoef()
        reads = []
        with warnings.catch_warnings(), simulated_cuda("cuda:0") as sim:
            warnings.simplefilter("ignore")
            sim.put(metric)
            for _ in range(4):
                del sim.sync_points[:]
                metric(*sim.put((torch.rand(6), torch.rand(6))))
                reads.append(sum(1 for p in sim.sync_points if p.is_sync and "compute" not in p.function))
        return reads

    assert all(n >= 2 for n in update_reads(False))
    assert update_reads(True) == [0] * 4
