"""legacy_dice_checks: the legacy Dice's checks counted on the device, their errors at compute(), results kept."""
from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import given, settings, strategies as st

import tmpatch
from tests.conftest import assert_bitwise, cpu_shortcuts, examples, release_in
from tests.patches.eager import assert_eager_is_the_release
from tests.patches.release_calls import assert_calls_are_the_releases
from tmpatch.patches import legacy_dice_checks as patch
from tmpatch.runtime import deferred

pytestmark = [pytest.mark.skipif(release_in(">=1.7.0"), reason="Dice was removed in 1.7.0"),
              pytest.mark.skipif(release_in("<0.11.0"), reason="0.10 is declined (test_api checks the row)"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::UserWarning")]

if release_in("<1.7.0"):
    from torchmetrics.classification import Dice
    from torchmetrics.functional import dice


@pytest.fixture(autouse=True)
def _device_path():
    yield
    cpu_shortcuts(True)
    cpu_shortcuts(True)


def _apply() -> None:
    row = next(r for r in tmpatch.apply(["legacy_dice_checks"]) if r.name == "legacy_dice_checks")
    assert row.state == "applied", row


def _pending(metric) -> int:
    return sum(int(v) for k, v in deferred.local_records(metric).items() if k.startswith("legacy_dice_checks"))


def _g(seed=0):
    return torch.Generator().manual_seed(seed)


#: Dice arguments and valid inputs of each kind the legacy formatter tells apart
CONFIGS = {
    "multiclass": (dict(num_classes=3),
                   lambda: (torch.rand(8, 3, generator=_g()), torch.randint(0, 3, (8,), generator=_g()))),
    "macro": (dict(num_classes=3, average="macro"),
              lambda: (torch.rand(8, 3, generator=_g()), torch.randint(0, 3, (8,), generator=_g()))),
    "labels": (dict(num_classes=3), lambda: (torch.randint(0, 3, (8,), generator=_g()),
                                             torch.randint(0, 3, (8,), generator=_g(1)))),
    "binary": (dict(), lambda: (torch.rand(8, generator=_g()), torch.randint(0, 2, (8,), generator=_g()))),
    "binary-multiclass-false": (dict(multiclass=False), lambda: (torch.rand(8, generator=_g()),
                                                                 torch.randint(0, 2, (8,), generator=_g()))),
    "multilabel": (dict(num_classes=3), lambda: (torch.rand(8, 3, generator=_g()),
                                                 torch.randint(0, 2, (8, 3), generator=_g()))),
    "samplewise": (dict(num_classes=3, mdmc_average="samplewise"),
                   lambda: (torch.rand(4, 3, 5, generator=_g()), torch.randint(0, 3, (4, 5), generator=_g()))),
}
CHECKS = {"_basic_input_validation", "_check_shape_and_type_consistency", "_check_classification_inputs",
          "_check_num_classes_mc"}


def test_updates_and_forward_read_nothing_on_simulated_cuda():
    from tmpatch.audit import audit

    for name, (kwargs, inputs) in CONFIGS.items():
        unpatched = audit(Dice(**kwargs).update, *inputs(), real=False)
        assert {p.function for p in unpatched.sync_points} & CHECKS, (name, str(unpatched))
    _apply()
    for name, (kwargs, inputs) in CONFIGS.items():
        report = audit(Dice(**kwargs).update, *inputs(), real=False)
        assert report.count == 0, (name, str(report))
        if "average" not in kwargs:  # compute with average="macro"/"none" drops absent classes by a mask
            report = audit(Dice(**kwargs), *inputs(), real=False)
            assert report.count == 0, (name, str(report))


def test_labels_without_num_classes_keep_the_inherent_read():
    from tmpatch.audit import audit
    from tmpatch.audit.panel.run import label_for

    _apply()
    report = audit(Dice().update, torch.randint(0, 3, (8,)), torch.randint(0, 3, (8,)), real=False)
    assert report.count and {label_for(p).category for p in report.sync_points} == {"inherent"}, str(report)


# -- same results -------------------------------------------------------------------------------
def _run(config, steps, forward):
    kwargs, _ = CONFIGS[config]
    metric = Dice(**kwargs)
    out = []
    for preds, target in steps:
        result = (metric if forward else metric.update)(preds, target)
        if result is not None:
            out.append(result)
    return out + [metric.tp, metric.fp, metric.tn, metric.fn] + [metric.compute()] \
        if not isinstance(metric.tp, list) else out + [metric.compute()]


@st.composite
def _steps(draw, config):
    _, inputs = CONFIGS[config]
    preds, target = inputs()
    steps = []
    for _ in range(draw(st.integers(1, 3))):
        seed = draw(st.integers(0, 2**16))
        g = _g(seed)
        p = torch.rand(preds.shape, generator=g) if preds.is_floating_point() else torch.randint(
            0, 3, preds.shape, generator=g)
        high = 2 if config.startswith("binary") or config == "multilabel" else 3
        t = torch.randint(0, high, target.shape, generator=g)
        steps.append((p, t))
    return steps


@settings(max_examples=examples(10), deadline=None)
@given(st.data())
def test_states_and_results_equal_the_releases(data):
    cases = []
    for _ in range(data.draw(st.integers(1, 4))):
        config = data.draw(st.sampled_from(sorted(CONFIGS)))
        cases.append((config, data.draw(_steps(config)), data.draw(st.booleans()), data.draw(st.booleans())))
    tmpatch.revert()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = [_run(config, steps, forward) for config, steps, forward, _ in cases]
        _apply()
        for (config, steps, forward, shortcuts), want in zip(cases, expected):
            cpu_shortcuts(shortcuts)
            got = _run(config, steps, forward)
            assert len(got) == len(want)
            for a, b in zip(got, want):
                assert_bitwise(a, b)


# -- the checks, at compute ---------------------------------------------------------------------------
BAD = {  # check key: Dice arguments, an update failing it (and only checks after it)
    "target_negative": (dict(num_classes=3), torch.rand(4, 3), torch.tensor([0, -1, 2, 1])),
    "preds_negative": (dict(num_classes=3), torch.tensor([0, -1, 2, 1]), torch.tensor([0, 1, 2, 1])),
    "target_binary": (dict(multiclass=False), torch.rand(4), torch.tensor([0, 1, 2, 1])),
    "preds_binary": (dict(multiclass=False), torch.tensor([0, 1, 2, 1]), torch.tensor([0, 1, 1, 0])),
    "float_target": (dict(), torch.rand(4), torch.tensor([0, 1, 2, 1])),
    "implied_classes": (dict(num_classes=3), torch.rand(4, 3), torch.tensor([0, 1, 3, 1])),
    "num_classes": (dict(num_classes=3), torch.tensor([0, 1, 2, 1]), torch.tensor([0, 1, 5, 1])),
}


@pytest.mark.parametrize("key", sorted(BAD))
def test_on_the_cpu_every_call_is_the_releases(key):
    """The release's check statements from the same update (forward included), before the batch is added."""
    kwargs, preds, target = BAD[key]
    if "num_classes" in kwargs:  # a valid batch of the same kind
        good = CONFIGS["multiclass" if preds.is_floating_point() else "labels"][1]()
    else:
        labels = (torch.tensor([0, 1, 1]), torch.tensor([0, 1, 0]))
        good = CONFIGS["binary"][1]() if preds.is_floating_point() else labels
    calls = [lambda m: m.update(*good), lambda m: m.update(preds, target), lambda m: m.compute(),
             lambda m: m(preds, target), lambda m: m.compute(), lambda m: m.reset(), lambda m: m(*good),
             lambda m: m.compute()]
    want = assert_calls_are_the_releases(lambda: Dice(**kwargs), calls, ["legacy_dice_checks"])
    assert want[0] is None and want[1] == f"ValueError: {patch.MESSAGES[key]}", want


@pytest.mark.usefixtures("held_reports")  # at compute(), as on a GPU before the copy lands
@pytest.mark.parametrize("shortcuts", [False])
def test_each_check_raises_the_releases_error_at_the_next_compute_once(shortcuts):
    import re

    for key, (kwargs, preds, target) in BAD.items():
        with pytest.raises(ValueError, match=f"^{re.escape(patch.MESSAGES[key])}$"):
            Dice(**kwargs).update(preds, target)  # upstream: in update()
    _apply()
    cpu_shortcuts(shortcuts)
    for key, (kwargs, preds, target) in BAD.items():
        metric = Dice(**kwargs)
        metric.update(preds, target)  # no error here
        metric(preds, target)
        assert _pending(metric) >= 2, key
        with pytest.raises(ValueError, match=f"^{re.escape(patch.MESSAGES[key])} \\(tmpatch legacy_dice_checks: 2 upd"):
            metric.compute()
        metric.compute()  # reported once
        metric.update(preds, target)
        with pytest.raises(ValueError, match=f"^{re.escape(patch.MESSAGES[key])} \\(tmpatch legacy_dice_checks: 1 "
                           r"upd.*reported at reset\(\)"):
            metric.reset()  # the batch is dropped: its report comes there, once, after the reset
        assert _pending(metric) == 0 and int(metric.tp.sum()) == 0 and metric._update_count == 0


def test_functional_api_and_metrics_built_before_apply_raise_in_update():
    kwargs, preds, target = BAD["implied_classes"]
    early = Dice(**kwargs)
    _apply()
    with pytest.raises(ValueError, match="^The highest label"):
        early.update(preds, target)
    with pytest.raises(ValueError, match="^The highest label"):
        dice(preds, target, num_classes=3)


@pytest.mark.parametrize("shortcuts", [True, False])
@pytest.mark.parametrize("key", sorted(BAD))
def test_the_eager_policy_raises_the_releases_error_in_update(key, shortcuts):
    kwargs, preds, target = BAD[key]
    assert_eager_is_the_release(lambda: Dice(**kwargs), [], (preds, target), ["legacy_dice_checks"], shortcuts)
