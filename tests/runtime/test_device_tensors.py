"""_device_tensors: torch.tensor(data, dtype, device) made with fills, the same tensor bit for bit."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

from tests.conftest import assert_bitwise, cpu_shortcuts, examples
from tmpatch.runtime import device_tensors as helper

DTYPES = [None, torch.bool, torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16, torch.bfloat16,
          torch.float32, torch.float64]
NUMBERS = st.one_of(
    st.booleans(),
    st.integers(-2**64, 2**64),
    st.sampled_from([0, 1, -1, 255, 256, -129, 2**31, 2**53 + 1, 2**60 + 2**36 + 1, 2**63 - 1, -2**63, 2**63]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, -0.0, 1e-10, 65504.0, 65520.0, 3.4e38, 3.5e38, 1e300, -1e300]),
)


@pytest.fixture(autouse=True)
def _device_path():
    cpu_shortcuts(False)  # the fill path, on the CPU
    yield
    cpu_shortcuts(True)


def _outcome(build):
    try:
        return build(), None
    except Exception as exc:  # noqa: BLE001 - the error is compared
        return None, (type(exc), str(exc))


@settings(max_examples=examples(300), deadline=None)
@given(st.one_of(NUMBERS, st.lists(NUMBERS, min_size=1, max_size=5), st.tuples(NUMBERS, NUMBERS)),
       st.sampled_from(DTYPES))
def test_same_tensor_or_same_error_as_torch_tensor(data, dtype):
    want, error = _outcome(lambda: torch.tensor(data, dtype=dtype, device="cpu"))
    got, got_error = _outcome(lambda: helper.device_tensor(data, dtype=dtype, device="cpu"))
    assert got_error == error
    if error is None:
        assert_bitwise(got, want)


def test_default_float_dtype_is_read_at_each_call():
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert helper.device_tensor(0.5, device="cpu").dtype == torch.float64
        assert helper.device_tensor([1, 0.5], device="cpu").dtype == torch.float64
    finally:
        torch.set_default_dtype(previous)
    assert helper.device_tensor(0.5, device="cpu").dtype == previous


@pytest.mark.parametrize("data", [torch.tensor(3), [[1, 2]], list(range(helper.MAX_FILLS + 1)), [1j]])
def test_other_data_is_left_to_torch_tensor(data):
    import warnings

    from tmpatch.audit import SyncKind, audit

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.tensor(a tensor) warns, in both
        assert_bitwise(helper.device_tensor(data, device="cpu"), torch.tensor(data, device="cpu"))
        report = audit(lambda: helper.device_tensor(data, device="cuda:0"), real=False)
    assert report.of_kind(SyncKind.H2D_COPY), str(report)  # torch.tensor's copy


@pytest.mark.parametrize("data", [3, 2.5, True, [0.5, 0.25, 0.125], (1, 2)])
def test_numbers_make_no_copy_on_simulated_cuda(data):
    from tmpatch.audit import audit

    cpu_shortcuts(True)  # the flag does not matter on CUDA
    assert audit(lambda: torch.tensor(data, device="cuda:0"), real=False).count == 1
    report = audit(lambda: helper.device_tensor(data, device="cuda:0"), real=False)
    assert report.count == 0, str(report)


def test_swap_changes_the_constructor_only():
    assert helper.swap("total = tensor(target.shape[0], device=target.device)") == \
        "total = _tmpatch_tensor(target.shape[0], device=target.device)"
    assert helper.swap("x = torch.tensor(0, device=d) + torch.as_tensor(y) + my_tensor(1)") == \
        "x = _tmpatch_tensor(0, device=d) + torch.as_tensor(y) + my_tensor(1)"
