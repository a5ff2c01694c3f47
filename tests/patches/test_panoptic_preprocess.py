"""panoptic_preprocess: panoptic quality's preprocessing on the device; the unknown-category check at compute()."""
from __future__ import annotations

import importlib

import pytest
import torch
from hypothesis import given, settings, strategies as st

import tmpatch
from tests.conftest import assert_bitwise, cpu_shortcuts, examples, release_in
from tests.patches.eager import assert_eager_is_the_release
from tests.patches.release_calls import assert_calls_are_the_releases
from tmpatch.runtime import deferred

if release_in("<1.0.0"):
    pytest.skip("PanopticQuality came in 1.0.0 (tests/test_api.py checks the 0.x row)", allow_module_level=True)

from torchmetrics.detection import ModifiedPanopticQuality, PanopticQuality  # noqa: E402
from torchmetrics.functional.detection import panoptic_quality  # noqa: E402

COMMON = importlib.import_module("torchmetrics.functional.detection._panoptic_quality_common")
CLASSES = {"pq": PanopticQuality, "modified": ModifiedPanopticQuality}


@pytest.fixture(autouse=True)
def _device_path():
    yield
    cpu_shortcuts(True)


def _apply() -> None:
    row = next(r for r in tmpatch.apply(["panoptic_preprocess"]) if r.name == "panoptic_preprocess")
    assert row.state == "applied", row


def _pending(metric) -> int:
    return int(deferred.local_records(metric).get("panoptic_preprocess", 0))


def _image(categories, seed=0, size=6):
    g = torch.Generator().manual_seed(seed)
    pick = torch.tensor(categories)[torch.randint(0, len(categories), (1, size, size), generator=g)]
    return torch.stack([pick, torch.randint(0, 3, (1, size, size), generator=g)], -1)


# -- sync ---------------------------------------------------------------------------------------
PREPROCESSING = {"_isin", "_prepocess_inputs"}


@pytest.mark.parametrize("things, stuffs", [({0, 1}, {2}), ({1, 3, 5, 7, 9, 11}, {2, 20, 30, 40, 50})])
def test_preprocessing_copies_and_reads_nothing_on_simulated_cuda(things, stuffs):
    """Few runs of ids (range tests) and many (a lookup table): unpatched, copies and a read in the
    preprocessing (the test can fail); patched, none (the segment matching after it is not this patch's)."""
    from tmpatch.audit import audit

    categories = sorted(things | stuffs)
    preds, target = _image(categories), _image(categories, 1)
    for name, cls in CLASSES.items():
        unpatched = audit(cls(things=things, stuffs=stuffs).update, preds, target, real=False)
        assert {p.function for p in unpatched.sync_points} >= PREPROCESSING, (name, str(unpatched))
    _apply()
    for name, cls in CLASSES.items():
        for call in (lambda m: m.update, lambda m: m):
            patched = audit(call(cls(things=things, stuffs=stuffs)), preds, target, real=False)
            assert not {p.function for p in patched.sync_points} & PREPROCESSING, (name, str(patched))


# -- same results -------------------------------------------------------------------------------
INT_DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]


@settings(max_examples=examples(60), deadline=None)
@given(st.sampled_from(INT_DTYPES + [torch.float32]), st.lists(st.integers(-3, 40), max_size=12),
       st.lists(st.integers(-130, 300), max_size=8), st.booleans(), st.booleans())
def test_isin_is_the_releases(dtype, values, table_values, as_tuple, shortcuts):
    arr = torch.tensor(values or [0], dtype=torch.int64).reshape(1, -1)
    arr = arr.clamp(0, 100).to(dtype) if dtype in (torch.uint8,) else arr.to(dtype)
    table = tuple(table_values) if as_tuple else list(table_values)
    _apply()
    cpu_shortcuts(shortcuts)
    original = tmpatch.get_original(COMMON._isin)
    assert COMMON._isin is not original
    try:
        want = original(arr, table)
    except Exception as exc:  # noqa: BLE001 - the same error patched
        with pytest.raises(type(exc)):
            COMMON._isin(arr, table)
        return
    assert_bitwise(COMMON._isin(arr, table), want)


@st.composite
def _cases(draw):
    ids = draw(st.lists(st.integers(0, 30), min_size=2, max_size=9, unique=True))
    split = draw(st.integers(1, len(ids) - 1))
    things, stuffs = set(ids[:split]), set(ids[split:])
    batches = []
    for _ in range(draw(st.integers(1, 2))):
        size = draw(st.integers(1, 4))
        shape = (draw(st.integers(1, 2)), size, size)
        n = shape[0] * size * size
        cats = torch.tensor(draw(st.lists(st.sampled_from(ids), min_size=n, max_size=n))).reshape(shape)
        inst = torch.tensor(draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))).reshape(shape)
        tcats = torch.tensor(draw(st.lists(st.sampled_from(ids + [99]), min_size=n, max_size=n))).reshape(shape)
        batches.append((torch.stack([cats, inst], -1), torch.stack([tcats, inst.flip(-1)], -1)))
    return things, stuffs, batches


def _run(case, kind, forward):
    things, stuffs, batches = case
    metric = CLASSES[kind](things=things, stuffs=stuffs)
    outs = [(metric if forward else metric.update)(p, t) for p, t in batches]
    states = [metric.iou_sum, metric.true_positives, metric.false_positives, metric.false_negatives]
    return states + [o for o in outs if o is not None] + [metric.compute()]


@settings(max_examples=examples(8), deadline=None)
@given(st.lists(st.tuples(_cases(), st.sampled_from(sorted(CLASSES)), st.booleans(), st.booleans()),
                min_size=1, max_size=4))
def test_states_and_results_equal_the_releases(cases):
    tmpatch.revert()
    expected = [_run(case, kind, forward) for case, kind, forward, _ in cases]
    _apply()
    for (case, kind, forward, shortcuts), want in zip(cases, expected):
        cpu_shortcuts(shortcuts)
        got = _run(case, kind, forward)
        for a, b in zip(got, want):
            assert_bitwise(a, b)


# -- the check, at compute ---------------------------------------------------------------------------
@pytest.mark.parametrize("kind", sorted(CLASSES))
def test_on_the_cpu_every_call_is_the_releases(kind):
    """The release's check from the same update (forward included), its message listing the ids,
    before the batch is added."""
    things, stuffs = {0, 1}, {2}
    good, bad = _image([0, 1, 2]), _image([0, 1, 2, 7], seed=3)
    calls = [lambda m: m.update(good, good), lambda m: m.update(bad, good), lambda m: m.compute(),
             lambda m: m(bad, good), lambda m: m.compute(), lambda m: m.reset(), lambda m: m(good, good),
             lambda m: m.compute()]
    want = assert_calls_are_the_releases(lambda: CLASSES[kind](things=things, stuffs=stuffs), calls,
                                         ["panoptic_preprocess"])
    assert want[0] is None and want[1].startswith("ValueError: Unknown categories found: tensor("), want


@pytest.mark.usefixtures("held_reports")  # at compute(), as on a GPU before the copy lands
@pytest.mark.parametrize("shortcuts", [False])
def test_unknown_categories_raise_the_releases_error_at_the_next_compute_once(shortcuts):
    things, stuffs = {0, 1}, {2}
    good, bad = _image([0, 1, 2]), _image([0, 1, 2, 7], seed=3)
    with pytest.raises(ValueError, match="^Unknown categories found: "):
        PanopticQuality(things=things, stuffs=stuffs).update(bad, good)
    _apply()
    cpu_shortcuts(shortcuts)
    for cls in CLASSES.values():
        metric = cls(things=things, stuffs=stuffs)
        metric.update(bad, good)  # no error here
        metric.update(good, good)
        metric(bad, good)
        assert _pending(metric) == 2
        with pytest.raises(ValueError, match=r"^Unknown categories found \(tmpatch panoptic_preprocess: 2 upd"):
            metric.compute()
        metric.compute()  # reported once
        metric.update(bad, good)
        with pytest.raises(ValueError, match=r"^Unknown categories found \(tmpatch .*reported at reset\(\)"):
            metric.reset()  # the batch is dropped: its report comes there, once, after the reset
        assert _pending(metric) == 0 and int(metric.true_positives.sum()) == 0
        metric.update(good, good)
        metric.compute()
        allowed = cls(things=things, stuffs=stuffs, allow_unknown_preds_category=True)
        allowed.update(bad, good)
        assert _pending(allowed) == 0


@pytest.mark.usefixtures("held_reports")  # at compute(), as on a GPU before the copy lands
def test_the_batch_is_counted_as_with_unknown_categories_allowed():
    things, stuffs = {0, 1}, {2}
    bad, good = _image([0, 1, 2, 7], seed=3), _image([0, 1, 2])
    allowed = PanopticQuality(things=things, stuffs=stuffs, allow_unknown_preds_category=True)
    allowed.update(bad, good)
    _apply()
    cpu_shortcuts(False)
    metric = PanopticQuality(things=things, stuffs=stuffs)
    metric.update(bad, good)
    for name in ("iou_sum", "true_positives", "false_positives", "false_negatives"):
        assert_bitwise(getattr(metric, name), getattr(allowed, name))


def test_functional_api_and_metrics_built_before_apply_raise_in_update():
    things, stuffs = {0, 1}, {2}
    early = PanopticQuality(things=things, stuffs=stuffs)
    bad, good = _image([0, 1, 2, 7], seed=3), _image([0, 1, 2])
    _apply()
    with pytest.raises(ValueError, match="^Unknown categories found: "):
        early.update(bad, good)
    with pytest.raises(ValueError, match="^Unknown categories found: "):
        panoptic_quality(bad, good, things=things, stuffs=stuffs)


@pytest.mark.parametrize("shortcuts", [True, False])
@pytest.mark.parametrize("kind", sorted(CLASSES))
def test_the_eager_policy_raises_the_releases_error_in_update(kind, shortcuts):
    things, stuffs = {0, 1}, {2}
    good, bad = _image([0, 1, 2]), _image([0, 1, 2, 7], seed=3)
    assert_eager_is_the_release(lambda: CLASSES[kind](things=things, stuffs=stuffs), [(good, good)], (bad, good),
                                ["panoptic_preprocess"], shortcuts)
