"""cumsum_device: the deterministic CPU round trip comes back to the input's GPU."""
from __future__ import annotations

import pytest
import torch
from torchmetrics.utilities import data

import tmpatch
from tests.conftest import assert_bitwise, release_in

pytestmark = pytest.mark.skipif(not release_in(">=1.0.0,<1.4.1"),
                                reason="cumsum_device is not needed on this release (0.10-0.11 have no _cumsum)")


@pytest.fixture
def deterministic():
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(previous)


def cumsum(x):
    return data._cumsum(x, dim=0)


def test_a_tensor_on_cuda_1_stays_on_cuda_1(deterministic):
    from tmpatch.audit import audit

    x = torch.rand(6)
    with pytest.warns(Warning, match="deterministic mode"):
        unpatched = audit(cumsum, x, device="cuda:1")
    assert unpatched.result.device == torch.device("cuda:0")  # the upstream defect, issue #2608
    assert unpatched.of_kind("device mismatch")  # reported apart from the syncs (not one)
    tmpatch.apply(["cumsum_device"])
    with pytest.warns(Warning, match="deterministic mode"):
        patched = audit(cumsum, x, device="cuda:1")
    assert patched.result.device == torch.device("cuda:1")
    assert not patched.of_kind("device mismatch"), str(patched)


def test_the_release_warning_text_is_kept(deterministic):
    from tmpatch.audit import audit

    with pytest.warns(Warning) as upstream:
        audit(cumsum, torch.rand(3), device="cuda:0")
    tmpatch.apply(["cumsum_device"])
    with pytest.warns(Warning) as patched:
        audit(cumsum, torch.rand(3), device="cuda:0")
    texts = lambda record: [str(w.message) for w in record if "cumsum" in str(w.message)]  # noqa: E731
    assert texts(patched) == texts(upstream) != []


@pytest.mark.parametrize("dtype", [None, torch.float64, torch.int64])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cpu_results_are_bitwise_the_releases(dtype, dim, deterministic):
    x = torch.randn(4, 5)
    expected = tmpatch.get_original(data._cumsum)(x, dim=dim, dtype=dtype)
    tmpatch.apply(["cumsum_device"])
    assert_bitwise(data._cumsum(x, dim=dim, dtype=dtype), expected)
    assert_bitwise(data._cumsum(x, dim, dtype), expected)
