"""nominal_bincount: the nominal metrics' tables counted without a sync; NaN rows dropped without one."""
from __future__ import annotations

import re

import pytest
import torch
from hypothesis import given, settings, strategies as st

import tmpatch
from tests.conftest import assert_bitwise, cpu_shortcuts, examples, release_in
from tmpatch.runtime import deferred, policies

if release_in("<0.11.0"):
    pytest.skip("the nominal metrics came in 0.11.0 (test_status_on_0x checks the row)", allow_module_level=True)

from torchmetrics import nominal as N  # noqa: E402
from torchmetrics.functional import nominal as F  # noqa: E402

CLASSES = {
    "CramersV": N.CramersV,
    "PearsonsContingencyCoefficient": N.PearsonsContingencyCoefficient,
    "TheilsU": N.TheilsU,
    "TschuprowsT": N.TschuprowsT,
}
NAN = float("nan")


@pytest.fixture(autouse=True)
def _policy():
    policies.current["bincount"] = "deferred"
    yield
    policies.current["bincount"] = "deferred"
    cpu_shortcuts(True)


def _apply(**kwargs) -> None:
    rows = {r.name: r.state for r in tmpatch.apply(["nominal_bincount"], **kwargs)}
    assert rows["nominal_bincount"] == "applied", rows


def _build(name, num_classes=4, **kwargs):
    return CLASSES[name](num_classes=num_classes, **kwargs)


def _pending(metric) -> int:
    return sum(int(count) for key, count in deferred.local_records(metric).items() if key.startswith("bincount"))


# -- sync ---------------------------------------------------------------------------------------
def test_update_is_sync_free_on_simulated_cuda():
    from tmpatch.audit import audit

    g = torch.Generator().manual_seed(0)
    preds, target = torch.randint(0, 4, (20,), generator=g), torch.randint(0, 4, (20,), generator=g)
    for name in sorted(CLASSES):
        unpatched = audit(_build(name).update, preds, target, real=False)
        assert [(p.function, p.op) for p in unpatched.sync_points] == [("_bincount", "aten.bincount")], name
    _apply()
    for name in sorted(CLASSES):
        patched = audit(_build(name).update, preds, target, real=False)
        assert patched.count == 0, (name, str(patched))


def test_drop_strategy_is_sync_free_on_simulated_cuda():
    from tmpatch.audit import audit

    preds = torch.tensor([0.0, 1.0, NAN, 3.0, 2.0, 1.0])
    target = torch.tensor([1.0, NAN, 2.0, 3.0, 0.0, 1.0])
    for name in ("CramersV", "TheilsU"):
        unpatched = audit(_build(name, nan_strategy="drop").update, preds, target, real=False)
        assert ("_handle_nan_in_data", "aten.index") in {(p.function, p.op) for p in unpatched.sync_points}
    _apply()
    for name in ("CramersV", "TheilsU"):
        patched = audit(_build(name, nan_strategy="drop").update, preds, target, real=False)
        assert patched.count == 0, (name, str(patched))


# -- same results -------------------------------------------------------------------------------
@st.composite
def _cases(draw):
    classes = draw(st.integers(2, 5))
    strategy = draw(st.sampled_from(["replace", "drop"]))
    replace = draw(st.sampled_from([0.0, float(classes - 1)]))
    form = draw(st.sampled_from(["long", "float", "probabilities"]))
    batches = []
    for _ in range(draw(st.integers(1, 3))):
        n = draw(st.integers(1, 12))

        def column(n=n):
            if form == "probabilities":  # (N, C): the update takes the argmax
                return torch.tensor(draw(st.lists(st.floats(0, 1, width=32), min_size=n * classes,
                                                  max_size=n * classes))).reshape(n, classes)
            values = draw(st.lists(st.integers(0, classes - 1), min_size=n, max_size=n))
            if form == "long":
                return torch.tensor(values)
            nan = draw(st.lists(st.booleans(), min_size=n, max_size=n))
            return torch.tensor([NAN if x else float(v) for v, x in zip(values, nan)])

        batches.append((column(), column()))
    return classes, strategy, replace, batches


def _run(case, name):
    (classes, strategy, replace, batches), forward = case[:2]
    metric = _build(name, classes, nan_strategy=strategy, nan_replace_value=replace)
    for p, t in batches:
        (metric if forward else metric.update)(p, t)
    return metric


@settings(max_examples=examples(6), deadline=None)
@given(st.lists(st.tuples(_cases(), st.booleans(), st.booleans()), min_size=1, max_size=5))
def test_tables_and_results_equal_the_releases(cases):
    """Several cases per example: one revert/apply for all of them (the slow part)."""
    tmpatch.revert()
    expected = [{name: _run(case, name) for name in CLASSES} for case in cases]
    _apply()
    for case, want in zip(cases, expected):
        cpu_shortcuts(case[2])  # False: the counting path that CUDA takes
        for name in CLASSES:
            metric = _run(case, name)
            assert_bitwise(metric.confmat, want[name].confmat)
            assert _pending(metric) == 0
            with torch.no_grad():
                assert_bitwise(metric.compute(), want[name].compute())


# -- values outside the categories ----------------------------------------------------------------
@pytest.mark.usefixtures("held_reports")  # at compute(), as on a GPU before the copy lands
@pytest.mark.parametrize("shortcuts", [True, False])
def test_a_category_outside_the_table_is_the_releases_error(shortcuts):
    """On the CPU the release's update raises it; on a device its codes in the table are counted and
    its error comes at compute(), in its words."""
    preds = torch.tensor([0, 1, 2, 3, 1])
    bad_targets = [torch.tensor([0, 1, 2, -1, 1]), torch.tensor([0, 1, 2, 4, 1])]  # negative, too large
    errors = []
    for target in bad_targets:
        with pytest.raises(RuntimeError) as raised:  # upstream: bincount's error, or the reshape after it
            N.CramersV(num_classes=4).update(preds, target)
        errors.append(str(raised.value))
    _apply()
    cpu_shortcuts(shortcuts)
    reference = torch.zeros(4, 4, dtype=torch.int64)
    for p, t in [(0, 0), (1, 1), (2, 2), (1, 1)]:  # the codes in the table
        reference[t, p] += 1  # rows: target, columns: preds (the release's layout)
    for target, error in zip(bad_targets, errors):
        metric = N.CramersV(num_classes=4)
        if shortcuts:
            with pytest.raises(RuntimeError, match=f"^{re.escape(error)}$"):
                metric.update(preds, target)
            continue
        metric.update(preds, target)
        assert _pending(metric) == 1
        assert_bitwise(metric.confmat, reference.to(metric.confmat.dtype))
        words = error.split(" is invalid for input of size ")[0]
        note = r" \(tmpatch bincount: 1 value\(s\) .* of CramersV"
        with pytest.raises(RuntimeError, match=f"^{re.escape(words)}.*{note}"):
            metric.compute()
        metric.compute()  # reported once


def test_bincount_excluded_or_eager_keeps_the_releases_update():
    from tmpatch.audit import audit

    preds = torch.tensor([0.0, 1.0, NAN, 3.0])
    target = torch.tensor([1.0, NAN, 2.0, 3.0])
    tmpatch.apply(["nominal_bincount"], exclude=["bincount"])
    metric = N.CramersV(num_classes=4, nan_strategy="drop")
    metric.update(preds, target)
    assert int(metric.confmat.sum()) == 2  # NaN rows removed by the release, not counted as 0
    assert audit(N.CramersV(num_classes=4).update, preds.nan_to_num(), target.nan_to_num(), real=False).count
    tmpatch.revert()
    _apply(bincount="eager")
    with pytest.raises(RuntimeError):
        N.CramersV(num_classes=4).update(torch.tensor([0, 1]), torch.tensor([0, -1]))


def test_functional_api_keeps_the_release():
    _apply()
    with pytest.raises(RuntimeError):
        F.cramers_v(torch.tensor([0, 1, 2]), torch.tensor([0, -1, 2]))
    preds, target = torch.tensor([0.0, NAN, 1.0, 1.0]), torch.tensor([0.0, 1.0, 1.0, 0.0])
    want = tmpatch.get_original(F.utils._handle_nan_in_data)(preds, target, "drop")
    for got, exp in zip(F.utils._handle_nan_in_data(preds, target, "drop"), want):
        assert_bitwise(got, exp)
