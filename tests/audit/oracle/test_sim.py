"""simulated_cuda, to_sim_cuda and the simulated CUDA device guard."""
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor

from tmpatch.audit import simulated_cuda, to_sim_cuda
from tmpatch.audit.oracle import guard
from tmpatch.audit.oracle.sim import cuda_device

pytestmark = pytest.mark.once  # nothing here depends on the torchmetrics release


def test_cuda_device_normalises():
    assert cuda_device("cuda") == torch.device("cuda:0")
    assert cuda_device(1) == torch.device("cuda:1")
    with pytest.raises(ValueError):
        cuda_device("cpu")


def test_tensors_become_fake_cuda_tensors_of_the_same_shape():
    x = torch.arange(6.0).view(2, 3).requires_grad_()
    with simulated_cuda("cuda:1") as sim:
        y = sim.put({"a": [x], "b": 3})
        assert isinstance(y["a"][0], FakeTensor) and y["b"] == 3
        assert y["a"][0].device == torch.device("cuda:1") and y["a"][0].shape == (2, 3)
        assert y["a"][0].requires_grad
        z = torch.zeros(2, device="cuda")
        assert isinstance(z, FakeTensor) and z.device == torch.device("cuda:0")
        assert y["a"][0][0, 1:].shape == (2,)  # indexing works on the simulated device
    assert sim.sync_points == []


def test_to_sim_cuda_needs_the_simulation():
    with pytest.raises(RuntimeError, match="simulated_cuda"):
        to_sim_cuda(torch.zeros(1))


def test_metric_states_and_device_move():
    from torchmetrics import MeanMetric, SumMetric

    metric = MeanMetric()
    other = SumMetric()
    with simulated_cuda("cuda:1") as sim:
        moved = sim.put(metric)
        to_sim_cuda([other], "cuda:1")
        assert moved is metric
        assert metric.device == torch.device("cuda:1") and other.device == torch.device("cuda:1")
        states = [getattr(metric, key) for key in metric._defaults]
        assert states and all(isinstance(s, FakeTensor) and s.device == torch.device("cuda:1") for s in states)
        assert all(v.device == torch.device("cuda:1") for v in metric._defaults.values())


def test_sync_points_collected_and_on_sync_called():
    seen = []
    with simulated_cuda(on_sync=seen.append) as sim:
        torch.ones(3, device="cuda").sum().item()
    assert len(sim.sync_points) == 1 and seen == sim.sync_points


def test_guard_and_tolist_restored_after_the_block():
    tolist = FakeTensor.__dict__.get("tolist")
    with simulated_cuda():
        with simulated_cuda("cuda:1"):
            assert FakeTensor.__dict__.get("tolist") is not tolist
        torch.zeros(2, device="cuda")[0]
    assert FakeTensor.__dict__.get("tolist") is tolist
    assert guard._state["users"] == 0
    if not torch.cuda._is_compiled():
        assert not guard._state["installed"]
        reg = guard._registry()
        assert not reg[int(torch._C._autograd.DeviceType.CUDA.value)]


@pytest.mark.parametrize("data", [[1, 2], (3, 4, 5)])
def test_legacy_new_with_values_is_a_host_to_device_copy(data):
    """``t.new(values)`` (panoptic quality's ``_isin``) builds on the host and copies, as on a
    GPU; torch 2.1's fake tensors alone would build a meta tensor, with no copy seen."""
    from tmpatch.audit.oracle.report import SyncKind

    with simulated_cuda("cuda:1") as sim:
        x = sim.put(torch.zeros(3, dtype=torch.int32))
        y = x.new(data)
        assert isinstance(y, FakeTensor) and y.device == torch.device("cuda:1")
        assert y.dtype == torch.int32 and y.shape == (len(data),)
        assert x.new(torch.Size([2, 2])).shape == (2, 2)  # a size, not values: no copy
        assert x.new(2, 3).shape == (2, 3)
    assert [p.kind for p in sim.sync_points] == [SyncKind.H2D_COPY]


@pytest.mark.usefixtures("held_reports")  # pending, as on a GPU before the evidence's copy lands
def test_the_audits_copy_of_a_metric_leaves_its_pending_report_with_it():
    """copy_modules deep-copies the caller's metric: a copy tmpatch makes for itself is no settle
    point of the deferred reports (the caller's metric keeps its report for its own compute)."""
    from torchmetrics.aggregation import MeanMetric

    import tmpatch
    from tests.conftest import cpu_shortcuts
    from tmpatch.audit.oracle.sim import copy_modules

    tmpatch.apply("nan_check")
    cpu_shortcuts(False)  # the device path (on the CPU the release's own check raises in update())
    try:
        metric = MeanMetric(nan_strategy="error")
        metric.update(torch.tensor([float("nan"), 1.0]))
        fn, _, _ = copy_modules(metric.update, (), {})
        assert fn is not metric.update  # the twin's
        with pytest.raises(RuntimeError, match="nan"):
            metric.compute()
    finally:
        cpu_shortcuts(True)
        tmpatch.revert()
