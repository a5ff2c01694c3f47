"""safe_divide: same results as the release's own function, without its host copy."""
from __future__ import annotations

import os

import pytest
import torch
from hypothesis import given, settings, strategies as st
from torchmetrics.utilities import compute

import tmpatch
from tests.conftest import CallTrace, assert_bitwise, examples, release_in

NEEDED = release_in("<1.9.0")
HAS_ZERO_DIVISION = release_in(">=1.4.0")
HAS_WARN = release_in(">=1.6.2")
pytestmark = pytest.mark.skipif(not NEEDED, reason="safe_divide is not needed on this release")

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int32, torch.int64, torch.uint8,
          torch.bool]
FLOATS = [0.0, -0.0, 1.0, -1.5, 2.0, 3.0, 1e-8, 1e30, float("inf"), -float("inf"), float("nan"), 65504.0, 0.1]
INTS = [0, 1, 2, 3, 7, 100]
SHAPES = [(), (0,), (1,), (3,), (2, 3)]


def original() -> object:
    return tmpatch.get_original(compute._safe_divide)


@st.composite
def tensors(draw, shape):
    dtype = draw(st.sampled_from(DTYPES))
    size = 1
    for dim in shape:
        size *= dim
    pool = FLOATS if dtype.is_floating_point else INTS
    values = draw(st.lists(st.sampled_from(pool), min_size=size, max_size=size))
    base = torch.tensor(values, dtype=torch.float64).reshape(shape)
    return base.to(dtype) if dtype.is_floating_point else base.to(torch.int64).to(dtype)


@st.composite
def operands(draw):
    shape = draw(st.sampled_from(SHAPES))
    denom_shape = draw(st.sampled_from([shape, shape[-1:], ()]))  # broadcasting denominators
    return draw(tensors(shape)), draw(tensors(denom_shape))


ZERO_DIVISIONS = [0.0, 1.0, -1, 0.1, 5, float("nan"), float("inf"), True] + (["warn", "nan"] if HAS_WARN else [])


@settings(max_examples=examples(200), deadline=None)
@given(operands(), st.sampled_from(ZERO_DIVISIONS))
def test_patched_results_are_bitwise_the_releases(pair, zero_division):
    num, denom = pair
    upstream = original()
    args = (zero_division,) if HAS_ZERO_DIVISION else ()
    try:
        expected = upstream(num.clone(), denom.clone(), *args)
    except RuntimeError as exc:  # e.g. a bool denominator upstream cannot divide: same error patched
        tmpatch.apply(["safe_divide"])
        with pytest.raises(type(exc)):
            compute._safe_divide(num, denom.clone(), *args)
        return
    tmpatch.apply(["safe_divide"])
    before = denom.clone()
    got = compute._safe_divide(num, denom, *args)
    assert_bitwise(got, expected)
    assert_bitwise(denom, before)  # the caller's denominator is never written into


@pytest.mark.skipif(HAS_ZERO_DIVISION, reason="0.10-1.3 only")
def test_old_releases_wrote_into_the_callers_denominator_and_the_patch_does_not():
    denom = torch.tensor([0.0, 2.0])
    original()(torch.tensor([1.0, 1.0]), denom)
    assert denom.tolist() == [1.0, 2.0]  # the upstream defect
    tmpatch.apply(["safe_divide"])
    denom = torch.tensor([0.0, 2.0])
    assert compute._safe_divide(torch.tensor([1.0, 1.0]), denom).tolist() == [1.0, 0.5]
    assert denom.tolist() == [0.0, 2.0]


@pytest.mark.skipif(HAS_ZERO_DIVISION or release_in("<0.11.0"),
                    reason="ExactMatch from 0.11.0; 0.11-1.3 write in place")
def test_exact_match_keeps_its_total_state_through_a_compute_before_any_update():
    """0.11-1.3: ExactMatch's compute() hands its ``total`` state to _safe_divide as the
    denominator; a compute before any update wrote 1 into it, and every later result was off."""
    from torchmetrics.classification import MulticlassExactMatch

    def run():
        metric = MulticlassExactMatch(num_classes=3)
        with pytest.warns(UserWarning, match="before the ``update``"):
            metric.compute()
        metric.update(torch.tensor([[0, 1]]), torch.tensor([[0, 1]]))
        return metric.compute(), metric.total

    result, total = run()
    assert (result.item(), total.tolist()) == (0.5, [2])  # the upstream defect: total 0 became 1
    tmpatch.apply(["safe_divide"])
    result, total = run()
    assert (result.item(), total.tolist()) == (1.0, [1])


def test_keyword_arguments_and_default_dtype_float64():
    num, denom = torch.tensor([1.0, 2.0]), torch.tensor([0.0, 4.0])
    kwargs = {"zero_division": 0.25} if HAS_ZERO_DIVISION else {}
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        expected = original()(num=num, denom=denom.clone(), **kwargs)
        tmpatch.apply(["safe_divide"])
        assert_bitwise(compute._safe_divide(num=num, denom=denom, **kwargs), expected)
    finally:
        torch.set_default_dtype(previous)


@pytest.mark.skipif(not HAS_WARN, reason="zero_division='warn' exists from 1.6.2")
def test_warn_still_warns_once_per_call_with_a_zero():
    tmpatch.apply(["safe_divide"])
    with pytest.warns(UserWarning, match="Detected zero division"):
        compute._safe_divide(torch.tensor([1.0]), torch.tensor([0.0]), "warn")


@pytest.mark.skipif(not HAS_ZERO_DIVISION, reason="0.10-1.3 make no host copy (they write in place)")
def test_the_host_to_device_copy_is_gone_on_simulated_cuda():
    from tmpatch.audit import audit

    def divide(num, denom):
        return compute._safe_divide(num, denom)

    num, denom = torch.rand(8), torch.tensor([0.0, 1.0] * 4)
    unpatched = audit(divide, num, denom, device="cuda:1")
    assert unpatched.count >= 1
    assert {str(p.kind) for p in unpatched.sync_points} == {"host-to-device copy"}
    assert any("compute.py" in p.location for p in unpatched.sync_points)
    tmpatch.apply(["safe_divide"])
    patched = audit(divide, num, denom, device="cuda:1")
    assert patched.count == 0, str(patched)
    assert patched.result.device == torch.device("cuda:1")


def test_accuracy_update_and_compute_run_the_patched_function():
    from torchmetrics.classification import MulticlassAccuracy

    preds, target = torch.tensor([0, 1, 2, 2]), torch.tensor([0, 1, 1, 2])
    expected = MulticlassAccuracy(num_classes=3)(preds, target)
    tmpatch.apply(["safe_divide"])
    metric = MulticlassAccuracy(num_classes=3)
    with CallTrace(os.path.join("tmpatch", "patches", "safe_divide.py")) as trace:
        metric.update(preds, target)
        result = metric.compute()
    assert "_safe_divide" in trace.calls
    assert_bitwise(result, expected)


@pytest.mark.skipif(not HAS_ZERO_DIVISION, reason="0.10-1.3 make no host copy in compute")
def test_accuracy_compute_no_longer_copies_from_the_host():
    from torchmetrics.classification import MulticlassAccuracy

    from tmpatch.audit import audit

    def copies(report):
        return [p for p in report.sync_points if str(p.kind) == "host-to-device copy" and "compute.py" in p.location]

    metric = MulticlassAccuracy(num_classes=3, validate_args=False)
    assert copies(audit(metric.compute, device="cuda:0"))
    tmpatch.apply(["safe_divide"])
    metric = MulticlassAccuracy(num_classes=3, validate_args=False)
    assert not copies(audit(metric.compute, device="cuda:0"))
