"""panoptic_matching: panoptic quality's segment matching on the device, the release's states bit for bit."""
from __future__ import annotations

import importlib

import pytest
import torch
from hypothesis import given, settings, strategies as st

import tmpatch
from tests.conftest import assert_bitwise, examples, release_in

if release_in("<1.0.0"):
    pytest.skip("PanopticQuality came in 1.0.0 (tests/test_api.py checks the 0.x row)", allow_module_level=True)

from torchmetrics.detection import ModifiedPanopticQuality, PanopticQuality  # noqa: E402
from torchmetrics.functional.detection import panoptic_quality  # noqa: E402

COMMON = importlib.import_module("torchmetrics.functional.detection._panoptic_quality_common")
CLASSES = {"pq": PanopticQuality, "modified": ModifiedPanopticQuality}
MATCHING = {"_panoptic_quality_update_sample", "_get_color_areas", "_to_tuple", "_nested_tuple", "_calculate_iou",
            "_filter_false_negatives", "_filter_false_positives"}
STATES = ("iou_sum", "true_positives", "false_positives", "false_negatives")


def _apply() -> None:
    rows = {r.name: r for r in tmpatch.apply(["panoptic_matching"])}
    assert rows["panoptic_matching"].state == "applied", rows["panoptic_matching"]
    assert rows["panoptic_preprocess"].state == "applied", rows["panoptic_preprocess"]  # required: marks the update


def _image(categories, seed=0, batch=2, size=8, instances=3, dtype=torch.int64):
    g = torch.Generator().manual_seed(seed)
    pick = torch.tensor(categories)[torch.randint(0, len(categories), (batch, size, size), generator=g)]
    return torch.stack([pick, torch.randint(0, instances, (batch, size, size), generator=g)], -1).to(dtype)


class _Watch:
    """Counts the release's host matching (``_get_color_areas``, called by the release's sample function)."""

    def __init__(self, monkeypatch):
        self.calls = 0
        original = COMMON._get_color_areas

        def counted(*args, **kwargs):
            self.calls += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(COMMON, "_get_color_areas", counted)


# -- sync ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("things, stuffs", [({0, 1}, {2}), ({1, 3, 5, 7}, {2, 20, 30})])
def test_matching_syncs_nothing_on_simulated_cuda(things, stuffs):
    """Unpatched, the matching reads and copies (the test can fail); patched, update() syncs nothing at all,
    and forward() only in its compute of the batch value."""
    from tmpatch.audit import audit

    categories = sorted(things | stuffs)
    preds, target = _image(categories), _image(categories, 1)
    for name, cls in CLASSES.items():
        unpatched = audit(cls(things=things, stuffs=stuffs).update, preds, target, real=False)
        assert {p.function for p in unpatched.sync_points} & MATCHING, (name, str(unpatched))
    _apply()
    for name, cls in CLASSES.items():
        assert audit(cls(things=things, stuffs=stuffs).update, preds, target, real=False).count == 0, name
        forward = audit(cls(things=things, stuffs=stuffs), preds, target, real=False)
        assert {p.function for p in forward.sync_points} <= {"_panoptic_quality_compute"}, (name, str(forward))


# -- same states and results ----------------------------------------------------------------------
INT_DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]


@st.composite
def _cases(draw):
    ids = draw(st.lists(st.integers(0, 40), min_size=1, max_size=8, unique=True))
    split = draw(st.integers(0, len(ids)))
    things, stuffs = set(ids[:split]), set(ids[split:])
    if not things and not stuffs:
        things = {0}
    dtype = draw(st.sampled_from(INT_DTYPES))
    unknown = draw(st.sampled_from([[], [99], [41, 120]]))
    instances = draw(st.integers(1, 6))
    batches = []
    for _ in range(draw(st.integers(1, 3))):
        batch, height, width = draw(st.integers(1, 3)), draw(st.integers(1, 7)), draw(st.integers(1, 7))
        n = batch * height * width

        def colors(pool, n=n, batch=batch, height=height, width=width):
            cats = draw(st.lists(st.sampled_from(pool), min_size=n, max_size=n))
            inst = draw(st.lists(st.integers(0, instances - 1), min_size=n, max_size=n))
            return torch.stack([torch.tensor(cats), torch.tensor(inst)], -1).reshape(batch, height, width, 2).to(dtype)

        batches.append((colors(ids + unknown), colors(ids + unknown)))
    return things, stuffs, batches


def _run(case, kind, forward):
    things, stuffs, batches = case
    metric = CLASSES[kind](things=things, stuffs=stuffs, allow_unknown_preds_category=True)
    outs = [(metric if forward else metric.update)(p, t) for p, t in batches]
    return [getattr(metric, name) for name in STATES] + [o for o in outs if o is not None] + [metric.compute()]


@settings(max_examples=examples(40), deadline=None)
@given(st.lists(st.tuples(_cases(), st.sampled_from(sorted(CLASSES)), st.booleans()), min_size=1, max_size=3))
def test_states_and_results_equal_the_releases(cases):
    """On the CPU (the device path runs there too): integer dtypes, void and unknown categories, 1 to 3 samples."""
    tmpatch.revert()
    expected = [_run(case, kind, forward) for case, kind, forward in cases]
    _apply()
    for (case, kind, forward), want in zip(cases, expected):
        got = _run(case, kind, forward)
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert_bitwise(a, b)


@pytest.mark.parametrize("kind", sorted(CLASSES))
def test_many_matches_sum_as_the_release(kind, monkeypatch):
    """Large samples with many matched segments (IoUs just above 0.5 and near 1) and modified stuffs (small
    IoUs): the device path runs (the release's host matching is not called) and the sums are the release's."""
    things, stuffs = set(range(0, 12)), set(range(12, 16))
    g = torch.Generator().manual_seed(5)
    target = _image(sorted(things | stuffs), seed=7, batch=3, size=48, instances=40)
    noise = torch.rand(target.shape[:-1], generator=g) < 0.3
    preds = target.clone()
    preds[..., 1] = torch.where(noise, (preds[..., 1] + 1) % 40, preds[..., 1])  # every IoU about 0.5-0.9
    preds[..., 0] = torch.where(torch.rand(target.shape[:-1], generator=g) < 0.05, 16, preds[..., 0])  # void
    want = CLASSES[kind](things=things, stuffs=stuffs, allow_unknown_preds_category=True)
    want.update(preds, target)
    want.update(target, preds)
    _apply()
    watch = _Watch(monkeypatch)
    got = CLASSES[kind](things=things, stuffs=stuffs, allow_unknown_preds_category=True)
    got.update(preds, target)
    got.update(target, preds)
    assert watch.calls == 0
    assert int(got.true_positives.sum()) > 100
    for name in STATES:
        assert_bitwise(getattr(got, name), getattr(want, name))
    assert_bitwise(got.compute(), want.compute())


# -- where the release's function runs -----------------------------------------------------------------
def test_the_release_runs_outside_its_conditions(monkeypatch):
    """The functional API, float colours, a float64 default dtype and deterministic mode take the
    release's matching (the same results); a marked integer update, on the CPU too, does not."""
    things, stuffs = {0, 1}, {2}
    preds, target = _image([0, 1, 2], seed=3), _image([0, 1, 2], seed=4)
    _apply()
    watch = _Watch(monkeypatch)

    def calls(fn):
        before = watch.calls
        fn()
        return watch.calls - before

    assert calls(lambda: PanopticQuality(things=things, stuffs=stuffs).update(preds, target)) == 0
    assert calls(lambda: panoptic_quality(preds, target, things=things, stuffs=stuffs)) > 0
    assert calls(lambda: PanopticQuality(things=things, stuffs=stuffs).update(preds.float(), target.float())) > 0
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert calls(lambda: PanopticQuality(things=things, stuffs=stuffs).update(preds, target)) > 0
    finally:
        torch.set_default_dtype(default)
    deterministic = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert calls(lambda: ModifiedPanopticQuality(things=things, stuffs=stuffs).update(preds, target)) > 0
    finally:
        torch.use_deterministic_algorithms(deterministic)


def test_a_failing_update_leaves_no_mark(monkeypatch):
    """An error inside the marked matching does not leave the mark set for the code that follows."""
    from tmpatch.patches.panoptic_preprocess import MATCHING

    _apply()
    seen = []

    def failing(*args, **kwargs):
        seen.append(MATCHING.get())
        raise RuntimeError("boom")

    monkeypatch.setattr(COMMON, "_get_color_areas", failing)  # the release's matching runs for float colours
    metric = PanopticQuality(things={0, 1}, stuffs={2})
    with pytest.raises(RuntimeError, match="boom"):
        metric.update(_image([0, 1, 2]).float(), _image([0, 1, 2], seed=1).float())
    assert seen == [metric]
    assert MATCHING.get() is None
