"""Simulated CUDA on every kind of torch build: no CUDA initialisation, everything put back."""
import subprocess
import sys
import textwrap

import pytest
import torch

from tests.audit.helpers import once_per_torch
from tmpatch.audit import audit, simulated_cuda
from tmpatch.audit.oracle import guard

pytestmark = pytest.mark.once  # nothing here depends on the torchmetrics release


def _registry_cuda() -> int:
    return guard._registry()[guard._device_index("CUDA")]


def test_simulation_leaves_the_registry_and_torch_cuda_as_found():
    before = (_registry_cuda(), torch.cuda._lazy_init, torch.cuda.current_device, torch.cuda.synchronize)
    with simulated_cuda():
        assert _registry_cuda() and _registry_cuda() != before[0]
        with simulated_cuda("cuda:1"):
            torch.ones(2, device="cuda")[0]
        assert guard._state["installed"]
    assert (_registry_cuda(), torch.cuda._lazy_init, torch.cuda.current_device, torch.cuda.synchronize) == before
    assert guard._state["users"] == 0 and not guard._state["installed"]
    assert guard.guard_kind() in ("python", "meta")


@pytest.mark.skipif(not once_per_torch(), reason="once per torch of the matrix")
def test_no_cuda_initialisation_on_this_build():
    """On a CUDA build without a GPU (and on a CPU-only one) every probe runs simulated
    without initialising CUDA: the driver is never asked for a device."""
    code = textwrap.dedent("""
        import torch
        from tmpatch.audit import audit
        from tmpatch.audit.calibrate.probes import PROBES
        calls = []
        if hasattr(torch._C, "_cuda_init"):  # a CUDA build: what torch.cuda._lazy_init runs
            torch._C._cuda_init = lambda: calls.append("_cuda_init")
        for probe in PROBES:
            try:
                audit(probe.fn, *probe.make(), real=False)
            except Exception as exc:
                assert probe.raises is not None and isinstance(exc, probe.raises), (probe.name, exc)
        assert not calls, calls
        print("initialized", torch.cuda.is_initialized(), "compiled", torch.cuda._is_compiled())
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "initialized False" in out.stdout, out.stdout


def test_cuda_tensors_without_an_index_land_on_cuda0():
    def moves(x):
        return torch.ones(2).cuda(), torch.ones(2).to("cuda"), torch.ones(2).cuda(1), \
            torch.full((), 1.0, device=torch.device("cuda")), torch.tensor([1.0], device="cuda")

    report = audit(moves, torch.ones(1), device="cuda:1")
    assert [str(d) for d in report.result_devices] == ["cuda:0", "cuda:0", "cuda:1", "cuda:0", "cuda:0"]


def test_metric_with_parameters_moves_to_the_simulated_device():
    layer = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    report = audit(layer, torch.randn(4, 3), device="cuda:1")
    assert report.result_devices == [torch.device("cuda:1")]
    assert next(layer.parameters()).device.type == "cpu"  # the caller's module: a copy was audited

