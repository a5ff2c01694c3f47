"""Backward passes on simulated CUDA: the autograd graph walked in Python (tmpatch/audit/oracle/autograd.py)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from tmpatch.audit import simulated_cuda
from tmpatch.audit.oracle.autograd import SimulatedEngine, installed
from tmpatch.audit.oracle.report import SyncKind

pytestmark = pytest.mark.once  # torch's autograd, not the torchmetrics release

#: whether this torch's autograd nodes say what they expect (torch 2.1: no, the walk leaves backward out)
WALKS = hasattr((torch.ones(1, requires_grad=True) * 2).grad_fn, "_input_metadata")
walks = pytest.mark.skipif(not WALKS, reason="this torch's autograd nodes have no _input_metadata: not walked")


class Scale(torch.autograd.Function):
    """A custom Function with a non-tensor argument and a tensor that needs no grad."""

    @staticmethod
    def forward(ctx, x, factor, offset):
        ctx.factor = factor
        return x * factor + offset

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.factor, None, None


def _graph(seed: int = 0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                          nn.Linear(4 * 5 * 5, 6))
    x = torch.randn(2, 3, 5, 5)
    bias = torch.randn(6, requires_grad=True)  # broadcast over the batch: its gradient is summed
    hidden = model(x)
    hidden.retain_grad()
    seen = []
    hidden.register_hook(lambda g: seen.append(g.clone()) or g * 2)
    bias.register_hook(lambda g: g + 1)
    out = Scale.apply(hidden + bias, 3.0, torch.ones(6))
    loss = out.pow(2).mean()
    return model, bias, hidden, seen, loss


def _walked(inputs=(), accumulate=True):
    """A graph of real CPU tensors (made with the walk's hook registrations in place), run by the walk."""
    with installed() as engine:
        graph = _graph()
        loss = graph[-1]
        return graph, engine._walk((loss,), (torch.ones_like(loss),), False, inputs(graph), accumulate, accumulate)


@walks
def test_the_walk_gives_torchs_gradients_bit_for_bit():
    """On real CPU tensors the walk and torch's engine give the same gradients: broadcast
    (summed to shape), a custom Function with non-tensor arguments, tensor hooks on a leaf
    and on an intermediate tensor, retain_grad."""
    model, bias, hidden, torch_seen, loss = _graph()
    loss.backward()
    torch_grads = [p.grad for p in model.parameters()] + [bias.grad, hidden.grad]
    (model, bias, hidden, walk_seen, _), _ = _walked(lambda graph: ())
    walk_grads = [p.grad for p in model.parameters()] + [bias.grad, hidden.grad]
    assert all(g is not None for g in walk_grads)
    assert all(torch.equal(a, b) for a, b in zip(torch_grads, walk_grads))
    assert len(walk_seen) == len(torch_seen) == 1 and torch.equal(walk_seen[0], torch_seen[0])


@walks
def test_grad_and_backward_inputs_are_torchs():
    _, bias, hidden, _, loss = _graph()
    expected = torch.autograd.grad(loss, (bias, hidden))
    (_, bias2, _, _, _), got = _walked(lambda graph: (graph[1], graph[2]), accumulate=False)
    assert len(got) == 2 and all(torch.equal(a, b) for a, b in zip(expected, got))
    assert bias2.grad is None  # grad() accumulates nothing
    model, bias, _, _, loss = _graph()
    loss.backward(inputs=(bias,))
    (model3, bias3, _, _, _), _ = _walked(lambda graph: (graph[1],))
    assert torch.equal(bias3.grad, bias.grad) and all(p.grad is None for p in model3.parameters())  # only the inputs
    unused = torch.zeros(1, requires_grad=True)
    with pytest.raises(RuntimeError, match="appears to not have been used in the graph"):
        _walked(lambda graph: (unused,), accumulate=False)


def test_a_training_step_runs_backward_on_simulated_cuda():
    """Without the walk torch's engine fails here (CPU-only build: "Cannot access accelerator
    device when none is available"; CUDA build without a GPU: "Backend doesn't support
    acquiring a default stream")."""
    with simulated_cuda() as sim:
        model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                              nn.Linear(4 * 5 * 5, 6)).to("cuda")
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        x, y = torch.randn(2, 3, 5, 5, device="cuda"), torch.randint(0, 6, (2,), device="cuda")
        del sim.sync_points[:]  # building the model on the host and moving it is set-up
        for _ in range(2):
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
        grads = [p.grad for p in model.parameters()]
        assert all(g is not None and g.device == torch.device("cuda", 0) and g.shape == p.shape
                   for g, p in zip(grads, model.parameters()))  # walked, or zeros standing in
        assert (sim.backward_calls, sim.backward_left_out) == ((2, 0) if WALKS else (0, 2))
        assert not [p for p in sim.sync_points if p.is_sync]


def test_a_backward_left_out_leaves_zero_gradients_of_the_right_shapes():
    """What older torch gets (the walk needs ``_input_metadata``): the leaves' gradients as zeros."""
    from tmpatch.audit.oracle.autograd import _stand_in

    with simulated_cuda():
        w, v = torch.randn(3, 2, device="cuda", requires_grad=True), torch.randn(2, device="cuda", requires_grad=True)
        loss = (w * v).sum()
        assert _stand_in((loss,), (), True) == () and w.grad.shape == (3, 2) and v.grad.shape == (2,)
        w.grad = None
        _stand_in((loss,), (w,), True)
        assert w.grad is not None
        grads = _stand_in((loss,), (w, v), False)
        assert [g.shape for g in grads] == [(3, 2), (2,)]


@walks
def test_a_sync_in_a_backward_hook_is_seen_and_queued_callbacks_run():
    from torch.autograd.variable import Variable

    ran = []
    with simulated_cuda() as sim:
        w = torch.randn(3, device="cuda", requires_grad=True)
        w.register_hook(lambda g: ran.append(g.sum().item()))  # a hook that reads the device
        loss = (w * 2).sum()
        loss.register_hook(lambda g: Variable._execution_engine.queue_callback(lambda: ran.append("end")))
        loss.backward()
    assert ran == [1.0, "end"]
    assert [p.kind for p in sim.sync_points if p.is_sync] == [SyncKind.D2H_READ]


def test_real_host_graphs_go_to_torchs_engine_and_everything_is_put_back():
    from torch.autograd.variable import Variable

    engine, register = Variable._execution_engine, torch.Tensor.register_hook
    with simulated_cuda() as sim:
        w = torch.ones(3, requires_grad=True)  # a real CPU tensor: torch's engine runs it
        (w * 3).sum().backward()
        assert isinstance(Variable._execution_engine, SimulatedEngine)
    assert torch.equal(w.grad, torch.full((3,), 3.0)) and sim.backward_calls == 0
    assert Variable._execution_engine is engine and torch.Tensor.register_hook is register
    assert "retain_grad" not in vars(torch.Tensor)


def test_module_to_cuda_gives_simulated_parameters():
    """Older torch set a real parameter's ``.data`` to the simulated tensor (a parameter on the
    meta device, then "found two different devices cuda:0, meta" in the forward pass)."""
    before = torch.__future__.get_overwrite_module_params_on_conversion()
    with simulated_cuda():
        layer = nn.BatchNorm2d(4).to("cuda")
        assert {p.device for p in layer.parameters()} == {torch.device("cuda", 0)}
        layer(torch.randn(2, 4, 3, 3, device="cuda"))
    assert torch.__future__.get_overwrite_module_params_on_conversion() == before
