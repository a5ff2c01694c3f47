"""edge_distances: HausdorffDistance's edge distances with fixed shapes, the release's values bit for bit."""
from __future__ import annotations

import importlib

import pytest
import torch
from hypothesis import given, settings, strategies as st

import tmpatch
from tests.conftest import assert_bitwise, cpu_shortcuts, examples, release_in
from tests.patches.eager import assert_eager_is_the_release
from tests.patches.release_calls import assert_calls_are_the_releases
from tmpatch.patches import edge_distances as patch

pytestmark = pytest.mark.skipif(not release_in(">=1.5.0"), reason="HausdorffDistance exists from 1.5.0")

if release_in(">=1.5.0"):
    from torchmetrics.functional.segmentation import hausdorff_distance
    from torchmetrics.segmentation import HausdorffDistance

    UTILS = importlib.import_module("torchmetrics.functional.segmentation.utils")

EDGES = {"check_if_binarized", "mask_edges", "binary_erosion", "surface_distance", "distance_transform"}
METRICS = ["euclidean", "chessboard", "taxicab"]


@pytest.fixture(autouse=True)
def _shortcuts():
    yield
    cpu_shortcuts(True)


def _apply() -> None:
    row = next(r for r in tmpatch.apply(["edge_distances"]) if r.name == "edge_distances")
    assert row.state == "applied", row


def _masks(seed, batch=2, classes=3, size=8, share=0.3, dtype=torch.int64):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(batch, classes, size, size, generator=g) < share).to(dtype)


# -- sync ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("directed", [False, True])
def test_update_and_forward_sync_nothing_on_simulated_cuda(directed):
    """Unpatched, the checks, the emptiness tests and the edge selections sync (the test can fail);
    patched, update() and forward() sync nothing at all."""
    from tmpatch.audit import audit

    preds, target = _masks(0), _masks(1)
    unpatched = audit(HausdorffDistance(num_classes=3, directed=directed).update, preds, target, real=False)
    assert {p.function for p in unpatched.sync_points} & EDGES, str(unpatched)
    _apply()
    for call in (lambda m: m.update, lambda m: m):
        patched = audit(call(HausdorffDistance(num_classes=3, directed=directed)), preds, target, real=False)
        assert patched.count == 0, str(patched)


# -- the same distances -------------------------------------------------------------------------
@st.composite
def _cases(draw):
    size = draw(st.integers(1, 9))
    batch, classes = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    share = draw(st.sampled_from([0.0, 0.05, 0.2, 0.5, 0.9, 1.0]))
    preds = _masks(draw(st.integers(0, 10 ** 6)), batch, classes, size, share)
    target = _masks(draw(st.integers(0, 10 ** 6)), batch, classes, size, draw(st.sampled_from([0.0, 0.1, 0.4, 1.0])))
    if draw(st.booleans()):  # one class empty in both: the release raises
        preds[0, 0], target[0, 0] = 0, 0
    spacing = draw(st.sampled_from([None, [1, 1], [2, 3], [0.5, 1.5], [1, 0.25], [3.0, 3.0]]))
    kwargs = dict(num_classes=classes, include_background=True, distance_metric=draw(st.sampled_from(METRICS)),
                  spacing=spacing, directed=draw(st.booleans()))
    return preds.to(draw(st.sampled_from([torch.int64, torch.bool, torch.uint8]))), target, kwargs


def _release(preds, target, kwargs):
    try:
        return hausdorff_distance(preds, target, **kwargs)
    except RuntimeError as exc:
        return exc


@settings(max_examples=examples(80), deadline=None)
@given(_cases())
def test_distances_equal_the_releases(case):
    """Per sample and class, in a marked update, on the CPU: every metric, integer and float spacings,
    empty and full masks. Where the release raises (a class empty in both masks) the pair is counted."""
    preds, target, kwargs = case
    tmpatch.revert()
    want = _release(preds, target, kwargs)
    _apply()
    update = patch._Update()  # what the class update marks
    token = patch.MARK.slot.set(update)
    try:
        got = hausdorff_distance(preds, target, **kwargs)
    finally:
        patch.MARK.slot.reset(token)
    empty = update.empty is not None and bool(update.empty)
    assert update.binarized is None or not bool(update.binarized)
    if isinstance(want, RuntimeError):
        assert empty
        both = ~(preds.flatten(2).bool().any(-1) | target.flatten(2).bool().any(-1))
        want = hausdorff_distance(preds + both[..., None, None], target + both[..., None, None], **kwargs)
        assert_bitwise(got[~both], want[~both])
        assert bool((got[both] == 0).all())
    else:
        assert not empty
        assert_bitwise(got, want)


@pytest.mark.parametrize("metric", METRICS)
def test_states_equal_the_releases_and_the_device_path_runs(metric, monkeypatch):
    """Through the class (update and forward, larger images): the release's states; the release's
    surface_distance is never called on the device path."""
    kwargs = dict(num_classes=4, distance_metric=metric, spacing=[1, 2])
    batches = [(_masks(s, 3, 4, 24, 0.2), _masks(s + 9, 3, 4, 24, 0.3)) for s in range(2)]
    want = HausdorffDistance(**kwargs)
    outs = [want(*b) for b in batches]
    _apply()
    cpu_shortcuts(False)
    monkeypatch.setattr(UTILS, "surface_distance", None)  # a call would fail
    got = HausdorffDistance(**kwargs)
    for (p, t), out in zip(batches, outs):
        assert_bitwise(got(p, t), out)
    assert_bitwise(got.score, want.score)
    assert_bitwise(got.compute(), want.compute())


# -- reports at compute -------------------------------------------------------------------------
def _good_and_bad(case: str):
    """Two good batches of masks, and a bad one: "both masks empty" or "not binarized"."""
    good = (_masks(2, 1, 2, 8, 0.4), _masks(3, 1, 2, 8, 0.4))
    if case == "both masks empty":
        bad = (good[0].clone(), good[1].clone())
        bad[0][0, 1], bad[1][0, 1] = 0, 0
    else:
        bad = (good[0] * 2, good[1])
    return good, bad


@pytest.mark.parametrize("case", ["both masks empty", "not binarized"])
def test_on_the_cpu_every_call_is_the_releases(case):
    """The release's update from the same call (forward included): its errors there, no batch added."""
    good, bad = _good_and_bad(case)
    calls = [lambda m: m.update(*good), lambda m: m.update(*bad), lambda m: m.compute(), lambda m: m(*bad),
             lambda m: m.compute(), lambda m: m.reset(), lambda m: m(*good), lambda m: m.compute()]
    want = assert_calls_are_the_releases(lambda: HausdorffDistance(num_classes=2, include_background=True), calls,
                                         ["edge_distances"])
    assert want[0] is None and want[1].startswith("RuntimeError: max()" if "empty" in case else "ValueError: Input x")


@pytest.mark.usefixtures("held_reports")  # at compute(), as on a GPU before the copy lands
@pytest.mark.parametrize("shortcuts", [False])
def test_errors_are_the_releases_at_the_next_compute_once(shortcuts):
    good = (_masks(2, 1, 2, 8, 0.4), _masks(3, 1, 2, 8, 0.4))
    absent = (good[0].clone(), good[1].clone())
    absent[0][0, 1], absent[1][0, 1] = 0, 0
    twos = (good[0] * 2, good[1])
    with pytest.raises(RuntimeError) as empty_error:
        HausdorffDistance(num_classes=2, include_background=True).update(*absent)
    with pytest.raises(ValueError, match="^Input x should be binarized$"):
        HausdorffDistance(num_classes=2, include_background=True).update(*twos)
    _apply()
    cpu_shortcuts(shortcuts)
    metric = HausdorffDistance(num_classes=2, include_background=True)
    metric.update(*absent)  # no error here
    metric.update(*good)
    with pytest.raises(RuntimeError, match=r"tmpatch edge_distances: 1 update\(s\) of HausdorffDistance") as caught:
        metric.compute()
    assert str(caught.value).startswith(str(empty_error.value))
    metric.compute()  # reported once
    metric.update(*twos)
    with pytest.raises(ValueError, match=r"^Input x should be binarized \(tmpatch edge_distances: 1 update"):
        metric.compute()
    metric.update(*absent)
    with pytest.raises(RuntimeError, match=r"tmpatch edge_distances: 1 update.*reported at reset\(\)") as caught:
        metric.reset()  # the batch is dropped: its report comes there, once, after the reset
    assert str(caught.value).startswith(f"{empty_error.value} (tmpatch edge_distances")
    assert metric._update_count == 0
    metric.update(*good)
    metric.compute()


# -- where the release runs ---------------------------------------------------------------------
def _outcome(preds, target, **kwargs):
    metric = HausdorffDistance(**kwargs)
    try:
        metric.update(preds, target)
    except Exception as exc:  # noqa: BLE001 - the release's error, raised in update()
        return type(exc)
    return metric.score.clone()


def test_the_release_runs_outside_its_conditions(monkeypatch):
    """Non-square images, a tensor spacing, a float64 default dtype and the functional API keep the
    release's code: the same values, the same errors raised in update()."""
    wide = (_masks(4)[..., :6], _masks(5)[..., :6])
    absent = (_masks(4), _masks(5))
    absent[0][0, 1], absent[1][0, 1] = 0, 0
    want = [_outcome(*wide, num_classes=3), _outcome(*absent, num_classes=3)]
    _apply()
    calls = []
    release = UTILS.surface_distance
    monkeypatch.setattr(UTILS, "surface_distance", lambda *a, **k: calls.append(1) or release(*a, **k))
    got = [_outcome(*wide, num_classes=3)]
    assert calls  # the release's surface_distance ran
    got.append(_outcome(*absent, num_classes=3, spacing=torch.tensor([1.0, 1.0])))
    for a, b in zip(got, want):
        if isinstance(b, type):
            assert a is b
        else:
            assert_bitwise(a, b)
    with pytest.raises(RuntimeError):
        hausdorff_distance(*absent, num_classes=3)  # functional: the release's
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        with pytest.raises(RuntimeError):
            HausdorffDistance(num_classes=3).update(*absent)
    finally:
        torch.set_default_dtype(default)


@pytest.mark.parametrize("shortcuts", [True, False])
@pytest.mark.parametrize("case", ["both masks empty", "not binarized"])
def test_the_eager_policy_raises_the_releases_error_in_update(case, shortcuts):
    good, bad = _good_and_bad(case)
    assert_eager_is_the_release(lambda: HausdorffDistance(num_classes=2, include_background=True), [good], bad,
                                ["edge_distances"], shortcuts)
