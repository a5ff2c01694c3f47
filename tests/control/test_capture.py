"""tmpatch.control.capture: a metric's or a collection's update compiled (``backend="eager"`` here: the
CPU has no CUDA graph; the logic around the compiled call is what is tested), replayed while
the arguments' signature holds, eager otherwise, with the addresses of the states kept."""
from __future__ import annotations

import warnings
from typing import Any, List, Tuple

import pytest
import torch

import tmpatch
from tests.conftest import assert_bitwise, torch_at_least
from tmpatch.runtime.compiled import reset_dynamo

pytestmark = pytest.mark.skipif(not torch_at_least(2, 5), reason="torch.compile support starts at torch 2.5")

dynamo = pytest.importorskip("torch._dynamo")
from torch._dynamo.utils import counters  # noqa: E402

C = 5


def _batches(n: int, size: int = 16, seed: int = 0) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.rand(size, C, generator=g), torch.randint(0, C, (size,), generator=g)) for _ in range(n)]


def _collection() -> Any:
    from torchmetrics import MetricCollection
    from torchmetrics.classification import MulticlassAccuracy, MulticlassConfusionMatrix, MulticlassF1Score

    return MetricCollection([MulticlassAccuracy(num_classes=C, validate_args=False),
                             MulticlassF1Score(num_classes=C, validate_args=False),
                             MulticlassConfusionMatrix(num_classes=C, validate_args=False)])


def _addresses(target: Any) -> List[int]:
    from torchmetrics import Metric

    return [getattr(m, key).data_ptr() for m in target.modules() if isinstance(m, Metric) for key in m._defaults]


def test_capture_needs_compiled_update():
    from torchmetrics import MeanMetric

    tmpatch.apply(exclude=["compiled_update"])
    with pytest.raises(RuntimeError, match="compiled_update"):
        tmpatch.capture(MeanMetric())


def test_the_compile_options():
    from torchmetrics import MeanMetric

    tmpatch.apply()
    assert tmpatch.capture(MeanMetric()).options == {"fullgraph": True, "dynamic": False, "mode": "reduce-overhead"}
    assert tmpatch.capture(MeanMetric(), backend="eager").options == {"fullgraph": True, "dynamic": False,
                                                                       "backend": "eager"}


def test_a_captured_collection_replays_keeps_its_addresses_and_falls_back_on_a_new_shape():
    tmpatch.apply()
    collection, eager = _collection(), _collection()
    update = tmpatch.capture(collection, backend="eager")
    batches = _batches(5) + _batches(1, size=7, seed=1)
    reset_dynamo()
    counters.clear()
    update(*batches[0])
    eager.update(*batches[0])
    addresses = _addresses(collection)
    with dynamo.config.patch(error_on_recompile=True):
        for batch in batches[1:5]:
            update(*batch)
            eager.update(*batch)
            assert _addresses(collection) == addresses
        update(*batches[5])  # another shape: the eager update, no compile
        eager.update(*batches[5])
    assert (update.replays, update.fallbacks) == (5, 1) and not counters["graph_break"]
    assert [m._update_count for m in collection._modules.values()] == [6, 6, 6]
    got, want = collection.compute(), eager.compute()
    for key in want:
        assert_bitwise(got[key], want[key])


def test_a_replaced_state_is_copied_back_into_its_tensor():
    """MaxMetric's update replaces its state (``torch.max``): a captured graph's output would be
    overwritten by the next replay; the capture copies it into the tensor it replaced."""
    from torchmetrics import MaxMetric

    tmpatch.apply()
    metric, eager = MaxMetric(), MaxMetric()
    update = tmpatch.capture(metric, backend="eager")
    name = next(iter(metric._defaults))  # max_value (value in 1.0.x)
    state = getattr(metric, name)
    for seed in range(4):
        value = torch.rand(8, generator=torch.Generator().manual_seed(seed)) * (seed + 1)
        update(value)
        eager.update(value)
        assert getattr(metric, name) is state
    assert_bitwise(metric.compute(), eager.compute())
    assert metric._update_count == 4


def test_grad_carrying_inputs_are_detached():
    from torchmetrics import MeanMetric

    tmpatch.apply()
    metric, eager = MeanMetric(), MeanMetric()
    update = tmpatch.capture(metric, backend="eager")
    for seed in range(3):
        value = torch.rand(8, generator=torch.Generator().manual_seed(seed), requires_grad=True)
        update(value * 2)
        eager.update(value * 2)
    assert update.replays == 3 and not any(getattr(metric, key).requires_grad for key in metric._defaults)
    assert_bitwise(metric.compute(), eager.compute())


def test_deferred_reports_come_at_compute():
    from torchmetrics import MeanMetric
    from torchmetrics.classification import MulticlassConfusionMatrix

    tmpatch.apply()
    confmat = MulticlassConfusionMatrix(num_classes=C, validate_args=False)
    update = tmpatch.capture(confmat, backend="eager")
    for preds, target in _batches(3):
        target[0] = C + 1  # not a class
        update(preds, target)
    with pytest.raises(RuntimeError, match="3 value"):
        confmat.compute()
    mean = MeanMetric(nan_strategy="warn")
    update = tmpatch.capture(mean, backend="eager")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for seed in range(2):
            value = torch.rand(8, generator=torch.Generator().manual_seed(seed))
            value[seed] = float("nan")
            update(value)
        assert not [w for w in seen if "nan" in str(w.message).lower()]
        mean.compute()
    assert len([w for w in seen if "nan" in str(w.message).lower()]) == 1


def test_list_states_run_eagerly():
    from torchmetrics import CatMetric

    tmpatch.apply()
    metric = CatMetric()
    update = tmpatch.capture(metric, backend="eager")
    update(torch.ones(3))
    update(torch.zeros(2))
    assert "list states" in update.reason and update.fallbacks == 2 and update.replays == 0
    assert torch.equal(metric.compute(), torch.tensor([1.0, 1.0, 1.0, 0.0, 0.0]))


def test_states_and_counter_are_static_inputs_and_captures_keep_apart():
    """What lets a CUDA graph update them in place (a mutated input that is not static makes
    inductor skip the graph): dynamo marks tensors reached through a module static. And each
    capture compiles a code object of its own (one recompile limit each)."""
    from torchmetrics.classification import MulticlassAccuracy

    from tmpatch.patches.compiled_update import tally_of

    tmpatch.apply()
    metrics = [MulticlassAccuracy(num_classes=C, validate_args=False) for _ in range(3)]
    reset_dynamo()
    with dynamo.config.patch(error_on_recompile=True):
        for metric in metrics:
            update = tmpatch.capture(metric, backend="eager")
            for batch in _batches(2):
                update(*batch)
    for metric in metrics:
        tensors = [getattr(metric, key) for key in metric._defaults] + [tally_of(metric).counter]
        assert all(getattr(t, "_dynamo_static_input_type", None) for t in tensors)
        assert metric._update_count == 2
