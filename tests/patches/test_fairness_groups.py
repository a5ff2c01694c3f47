"""fairness_groups: group-fairness updates split by group on the device; extra groups reported later, once."""
from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import given, settings, strategies as st

import tmpatch
from tests.conftest import assert_bitwise, cpu_shortcuts, examples, release_in
from tests.patches.eager import assert_eager_is_the_release
from tests.patches.release_calls import assert_calls_are_the_releases
from tmpatch.patches import fairness_groups as patch
from tmpatch.runtime import deferred

if release_in("<1.0.0"):
    pytest.skip("BinaryFairness came in 1.0.0 (tests/test_api.py checks the row on 0.10-0.11)", allow_module_level=True)

from torchmetrics.classification import BinaryFairness, BinaryGroupStatRates  # noqa: E402
from torchmetrics.functional.classification import binary_groups_stat_rates  # noqa: E402

STATES = ("tp", "fp", "tn", "fn")


@pytest.fixture(autouse=True)
def _device_path():
    yield
    cpu_shortcuts(True)


def _apply() -> None:
    row = next(r for r in tmpatch.apply(["fairness_groups"]) if r.name == "fairness_groups")
    assert row.state == "applied", row


def _pending(metric) -> int:
    return int(deferred.local_records(metric).get("fairness_groups", 0))


def _build(kind: str, groups: int, **kwargs):
    if kind == "rates":
        return BinaryGroupStatRates(num_groups=groups, **kwargs)
    return BinaryFairness(num_groups=groups, task=kind, **kwargs)


def _quiet(call, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # demographic_parity warns that it needs no target
        return call(*args)


# -- sync ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["rates", "all"])
def test_update_is_sync_free_on_simulated_cuda(kind):
    """Eight rows, eight groups: the simulation's stand-in group sizes (one row each) fit."""
    from tmpatch.audit import audit

    g = torch.Generator().manual_seed(0)
    preds, target = torch.rand(8, generator=g), torch.randint(0, 2, (8,), generator=g)
    groups = torch.randint(0, 8, (8,), generator=g)
    unpatched = audit(_build(kind, 8, validate_args=False).update, preds, target, groups, real=False)
    ops = {(p.function, p.op) for p in unpatched.sync_points}
    assert ("_binary_groups_stat_scores", "aten._to_copy") in ops and ("_flexible_bincount", "aten._unique2") in ops
    _apply()
    for shortcuts in (True, False):
        cpu_shortcuts(shortcuts)
        patched = audit(_build(kind, 8, validate_args=False).update, preds, target, groups, real=False)
        assert patched.count == 0, str(patched)
    if kind == "rates":  # its compute reads nothing: forward() is sync-free too
        assert audit(_build(kind, 8, validate_args=False), preds, target, groups, real=False).count == 0
        tmpatch.revert()
        assert audit(_build(kind, 8, validate_args=False), preds, target, groups, real=False).count
        _apply()
    with_validation = audit(_build(kind, 8).update, preds, target, groups, real=False)
    from tmpatch.audit.panel.run import label_for

    assert {label_for(p).category for p in with_validation.sync_points} == {"validation"}, str(with_validation)


# -- same results -------------------------------------------------------------------------------
@st.composite
def _cases(draw):
    num_groups = draw(st.integers(2, 5))
    ids = draw(st.lists(st.integers(0, 9), min_size=1, max_size=num_groups, unique=True))  # not always 0..G-1
    form = draw(st.sampled_from(["probabilities", "logits", "labels"]))
    width = draw(st.sampled_from([None, 2]))
    ignore = draw(st.sampled_from([None, -1]))
    batches = []
    for _ in range(draw(st.integers(1, 3))):
        n = draw(st.integers(1, 10))
        shape = (n,) if width is None else (n, width)
        size = n if width is None else n * width
        if form == "labels":
            preds = torch.tensor(draw(st.lists(st.integers(0, 1), min_size=size, max_size=size)))
        else:
            low, high = (0, 1) if form == "probabilities" else (-4, 4)
            preds = torch.tensor(draw(st.lists(st.floats(low, high, width=32), min_size=size, max_size=size)))
        labels = st.integers(0, 1) if ignore is None else st.sampled_from([0, 1, ignore])
        target = torch.tensor(draw(st.lists(labels, min_size=size, max_size=size)))
        groups = torch.tensor(draw(st.lists(st.sampled_from(ids), min_size=n, max_size=n)))
        batches.append((preds.reshape(shape), target.reshape(shape), groups))
    return num_groups, ignore, batches


KINDS = ("rates", "all", "demographic_parity")


def _run(case, kind):
    (num_groups, ignore, batches), forward = case[:2]
    metric = _build(kind, num_groups, ignore_index=ignore, validate_args=False)
    for args in batches:
        _quiet(metric if forward else metric.update, *args)
    return metric


@settings(max_examples=examples(6), deadline=None)
@given(st.lists(st.tuples(_cases(), st.booleans(), st.booleans()), min_size=1, max_size=5))
def test_states_and_results_equal_the_releases(cases):
    """Several cases per example: one revert/apply for all of them (the slow part)."""
    tmpatch.revert()
    expected = [{kind: _run(case, kind) for kind in KINDS} for case in cases]
    _apply()
    for case, want in zip(cases, expected):
        cpu_shortcuts(case[2])
        for kind in KINDS:
            metric = _run(case, kind)
            for state in STATES:
                assert_bitwise(getattr(metric, state), getattr(want[kind], state))
            assert _pending(metric) == 0
            got, exp = metric.compute(), want[kind].compute()
            assert sorted(got) == sorted(exp)
            for key in exp:
                assert_bitwise(got[key], exp[key])


# -- more groups than num_groups ---------------------------------------------------------------------
@pytest.mark.parametrize("validate", [False, True])
@pytest.mark.parametrize("kind", ["rates", "demographic_parity", "all"])
def test_on_the_cpu_every_call_is_the_releases(kind, validate):
    """The release's split from the same update (forward included): its IndexError after adding the
    first num_groups groups, those states, nothing pending."""
    preds = torch.tensor([0.9, 0.1, 0.8, 0.3, 0.7, 0.6])
    target = torch.tensor([1, 0, 1, 1, 0, 1])
    good = (preds[:3], target[:3], torch.tensor([0, 1, 1]))
    bad = (preds, target, torch.tensor([0, 1, 2, 3, 3, 0]))  # four groups, num_groups=3
    calls = [lambda m: m.update(*good), lambda m: m.update(*bad), lambda m: m.compute(), lambda m: m(*bad),
             lambda m: m.compute(), lambda m: m.reset(), lambda m: m(*good), lambda m: m.compute()]
    want = assert_calls_are_the_releases(lambda: _build(kind, 3, validate_args=validate), calls, ["fairness_groups"])
    assert want[0] is None and want[1] == "IndexError: index 3 is out of bounds for dimension 0 with size 3", want


@pytest.mark.usefixtures("held_reports")  # at compute(), as on a GPU before the copy lands
@pytest.mark.parametrize("shortcuts", [False])
def test_more_groups_than_num_groups_leaves_the_releases_states_and_raises_at_compute_once(shortcuts):
    preds = torch.tensor([0.9, 0.1, 0.8, 0.3, 0.7, 0.6])
    target = torch.tensor([1, 0, 1, 1, 0, 1])
    groups = torch.tensor([0, 1, 2, 3, 3, 0])  # four groups, num_groups=3
    upstream = BinaryGroupStatRates(num_groups=3, validate_args=False)
    with pytest.raises(IndexError):
        upstream.update(preds, target, groups)  # after adding groups 0, 1, 2
    _apply()
    cpu_shortcuts(shortcuts)
    metric = BinaryGroupStatRates(num_groups=3, validate_args=False)
    metric.update(preds, target, groups)  # no error here
    for state in STATES:
        assert_bitwise(getattr(metric, state), getattr(upstream, state))
    assert _pending(metric) == 2
    release = r"^index 3 is out of bounds for dimension 0 with size 3 \(tmpatch fairness_groups: 2 row\(s\)"
    with pytest.raises(IndexError, match=release + r" .* num_groups=3"):
        metric.compute()
    metric.compute()  # reported once
    metric.update(preds, target, groups)
    with pytest.raises(IndexError, match=release + r".*reported at reset\(\)"):
        metric.reset()  # the rows are dropped: their report comes there, once, after the reset
    assert all(int(getattr(metric, state).sum()) == 0 for state in STATES)
    metric.update(preds[:3], target[:3], groups[:3])
    metric.compute()


def test_functional_api_and_metrics_built_before_apply_keep_the_release():
    early = BinaryGroupStatRates(num_groups=3, validate_args=False)
    _apply()
    preds, target, groups = torch.tensor([0.9, 0.2, 0.7]), torch.tensor([1, 0, 0]), torch.tensor([0, 2, 2])
    assert sorted(binary_groups_stat_rates(preds, target, groups, 3)) == ["group_0", "group_1"]  # present groups
    with pytest.raises(IndexError):
        early.update(torch.tensor([0.9, 0.2, 0.7, 0.1]), torch.tensor([1, 0, 0, 1]), torch.tensor([0, 1, 5, 7]))


@pytest.mark.parametrize("groups", [torch.tensor([0.0, 1.0, 1.0]), torch.tensor([[0, 1], [1, 1], [0, 0]])])
def test_groups_the_patch_does_not_cover_take_the_releases_path(groups):
    preds, target = torch.tensor([0.9, 0.2, 0.7]), torch.tensor([1, 0, 0])
    outcome = []
    for patched in (False, True):
        if patched:
            _apply()
        metric = BinaryGroupStatRates(num_groups=4, validate_args=False)
        try:
            metric.update(preds, target, groups)
            outcome.append([getattr(metric, s).tolist() for s in STATES])
        except Exception as exc:  # noqa: BLE001 - the release's own error is compared
            outcome.append(f"{type(exc).__name__}: {exc}")
    assert outcome[0] == outcome[1]


def test_the_marked_function_returns_the_releases_tuples_per_slot():
    import importlib

    fn = importlib.import_module("torchmetrics.functional.classification.group_fairness")
    preds, target = torch.tensor([0.9, 0.2, 0.7, 0.4, 0.6]), torch.tensor([1, 0, 0, 1, 1])
    groups = torch.tensor([3, 1, 3, 1, 8])  # three present groups: slots 0, 1, 2
    want = fn._binary_groups_stat_scores(preds, target, groups, 5, validate_args=False)
    _apply()
    token = patch.MARK.slot.set(BinaryGroupStatRates(num_groups=5))
    try:
        got = fn._binary_groups_stat_scores(preds, target, groups, 5, validate_args=False)
    finally:
        patch.MARK.slot.reset(token)
    assert len(got) == 5 and len(want) == 3
    for slot in range(5):
        expected = want[slot] if slot < 3 else (torch.tensor(0),) * 4
        for g, w in zip(got[slot], expected):
            assert_bitwise(g, w)
    assert [len(t) for t in got[1:3]] == [4, 4]


@pytest.mark.parametrize("shortcuts", [True, False])
def test_the_eager_policy_raises_the_releases_error_in_update(shortcuts):
    """The release's IndexError, after adding the first num_groups groups: its states, too."""
    preds = torch.tensor([0.9, 0.1, 0.8, 0.3, 0.7, 0.6])
    target = torch.tensor([1, 0, 1, 1, 0, 1])
    good = (preds[:3], target[:3], torch.tensor([0, 1, 1]))
    bad = (preds, target, torch.tensor([0, 1, 2, 3, 3, 0]))  # four groups, num_groups=3
    assert_eager_is_the_release(lambda: BinaryGroupStatRates(num_groups=3, validate_args=False), [good], bad,
                                ["fairness_groups"], shortcuts)
