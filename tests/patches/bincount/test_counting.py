"""bincount's ``_bincount``: fixed-size counts on the device inside a recorded update, the
release's function everywhere else."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st
from torchmetrics import classification as cls
from torchmetrics.utilities import data

import tmpatch
from tests.conftest import assert_bitwise, examples
from tests.patches.bincount import cases
from tmpatch.patches.bincount import counting
from tmpatch.runtime import deferred

DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]


@pytest.fixture(autouse=True)
def _deterministic_off():
    yield
    torch.use_deterministic_algorithms(False)


def _recorded(x, minlength, vouch=False, counted=True):
    """``_bincount(x, minlength)`` as a recorded update calls it; ``(counts, reported)``, ``reported``
    the negative values and those past the bins noted for the report, added (``counted``: by
    tmpatch's fixed-size count, not the release's function)."""
    metric = cls.MulticlassStatScores(num_classes=3, validate_args=False)  # built applied: it has a book
    update = counting.Update(metric)
    update.vouch = vouch
    token = counting.current.set(update)
    try:
        out = data._bincount(x, minlength=minlength)
    finally:
        counting.current.reset(token)
    assert update.counted is counted and update.vouch is (vouch and not counted)  # a vouch serves one call
    pending = deferred.local_records(metric)
    return out, sum(int(pending.get(key, 0)) for key in ("bincount", "bincount_bins"))


@st.composite
def _in_range(draw):
    minlength = draw(st.integers(1, 40))
    dtype = draw(st.sampled_from(DTYPES))
    top = min(minlength, 128) if dtype == torch.int8 else minlength
    size = draw(st.integers(0, 60))
    values = draw(st.lists(st.integers(0, top - 1), min_size=size, max_size=size))
    return torch.tensor(values, dtype=torch.int64).to(dtype), minlength


@settings(max_examples=examples(40), deadline=None)
@given(_in_range(), st.booleans())
def test_in_range_counts_are_bitwise_torch_bincount_and_the_releases(case, deterministic):
    x, minlength = case
    expected = torch.bincount(x, minlength=minlength)
    cases.apply()
    torch.use_deterministic_algorithms(deterministic)  # the release: a loop (1.0-1.2.0) or a mesh (1.2.1+)
    comparable = not cases.INDEX_ADD or x.dtype == torch.int64  # index_add_: int64 (every caller's) only
    release = tmpatch.get_original(data._bincount)(x, minlength=minlength) if comparable else None
    got, reported = _recorded(x, minlength)
    torch.use_deterministic_algorithms(False)
    assert_bitwise(got, expected)
    if comparable:
        assert_bitwise(got, release)
    assert reported == 0


@settings(max_examples=examples(40), deadline=None)
@given(st.lists(st.integers(-30, 60), max_size=40), st.integers(1, 30), st.booleans())
def test_out_of_range_values_are_left_out_and_reported_unless_vouched_for(values, minlength, vouch):
    """Reported: what the release's torch.bincount raises on (a negative value) or gives a count longer
    than ``minlength`` for (which its callers' ``reshape`` raises on)."""
    if vouch:  # a caller vouches for values in range or negative (positions it left out)
        values = [v for v in values if v < minlength]
    x = torch.tensor(values, dtype=torch.int64)
    cases.apply()
    got, reported = _recorded(x, minlength, vouch)
    inside = [v for v in values if 0 <= v < minlength]
    assert_bitwise(got, torch.bincount(torch.tensor(inside, dtype=torch.int64), minlength=minlength))
    assert reported == (0 if vouch else len(values) - len(inside))


def test_in_deterministic_mode_out_of_range_values_are_left_out_unreported():
    """The release's mesh drops them without an error."""
    cases.apply()
    torch.use_deterministic_algorithms(True)
    got, reported = _recorded(torch.tensor([0, -1, 2, 7]), 3)
    torch.use_deterministic_algorithms(False)
    assert_bitwise(got, torch.tensor([1, 0, 1]))
    assert reported == 0


def test_outside_a_recorded_update_the_release_runs():
    cases.apply()
    original = tmpatch.get_original(data._bincount)
    with pytest.raises(cases.NEGATIVE[0], match=cases.NEGATIVE[1]):
        data._bincount(torch.tensor([0, -1]), minlength=3)  # functional path: the release's error
    x = torch.tensor([0, 2, 2])
    assert_bitwise(data._bincount(x, minlength=5), original(x, minlength=5))
    for odd in [(x, None), (x, 0), (x.float(), 3), (x.reshape(1, 3), 3)]:  # no minlength, floats, 2-D
        try:
            want = original(*odd)
        except Exception as exc:  # noqa: BLE001 - the release's error, compared
            want = repr(exc)
        try:
            got = _recorded(*odd, counted=False)[0]
        except Exception as exc:  # noqa: BLE001
            got = repr(exc)
        if isinstance(want, str):
            assert got == want
        else:
            assert_bitwise(got, want)


def test_deterministic_mode_makes_no_mesh():
    """Upstream in deterministic mode counts with an N x minlength mesh (here 4096 x 10^6
    booleans, 4 GB); patched: 10^6 int64 counts."""
    cases.apply()
    torch.use_deterministic_algorithms(True)
    metric = cls.MulticlassF1Score(num_classes=1000, average=None, validate_args=False)
    preds, target = torch.randint(0, 1000, (4096,)), torch.randint(0, 1000, (4096,))
    metric.update(preds, target)
    torch.use_deterministic_algorithms(False)
    cases.unpatched()
    reference = cls.MulticlassF1Score(num_classes=1000, average=None, validate_args=False)
    reference.update(preds, target)
    assert_bitwise(metric.compute(), reference.compute())
