"""Compiled updates of the metrics whose patches mark the running update (issue 14's
retrieval, nominal, fairness and Tweedie patches): their marker is a
``compiled.ContextSlot``, so the update traces in one graph (``fullgraph=True``), with no
recompile (but for list states, whose length torch.compile guards on), and the states of
eager updates. A ContextVar there was a graph break inside
the update (dynamo cannot trace one)."""
from __future__ import annotations

from typing import Any, Callable, Dict, Tuple

import pytest
import torch

import tmpatch
from tests.conftest import assert_bitwise, release_in
from tests.patches.test_compiled_update import heavy, pytestmark as _torch_2_5
from tmpatch.runtime.compiled import reset_dynamo

pytestmark = _torch_2_5  # torch 2.5+

dynamo = pytest.importorskip("torch._dynamo")
from torch._dynamo.utils import counters  # noqa: E402

N = 16


def _cases() -> Dict[str, Tuple[Callable[[], Any], Callable[[torch.Generator], Tuple]]]:
    import importlib

    from torchmetrics import classification, regression, retrieval

    def nominal() -> Any:  # 0.11.0+
        return importlib.import_module("torchmetrics.nominal")

    def ints(g: torch.Generator, high: int) -> torch.Tensor:
        return torch.randint(0, high, (N,), generator=g)

    return {
        "RetrievalMAP": (lambda: retrieval.RetrievalMAP(), lambda g: (torch.rand(N, generator=g), ints(g, 2),
                                                                      ints(g, 4))),
        "CramersV": (lambda: nominal().CramersV(4), lambda g: (ints(g, 4), ints(g, 4))),
        "TweedieDevianceScore": (lambda: regression.TweedieDevianceScore(),
                                 lambda g: (torch.rand(N, generator=g) + 0.1, torch.rand(N, generator=g) + 0.1)),
        "BinaryFairness": (lambda: classification.BinaryFairness(2, validate_args=False),
                           lambda g: (torch.rand(N, generator=g), ints(g, 2), ints(g, 2))),
    }


#: the releases that came without them (CramersV: 0.11.0, BinaryFairness: 1.0.0)
_LATER = {"CramersV": "0.11.0", "BinaryFairness": "1.0.0"}


@heavy
@pytest.mark.parametrize("name", ["RetrievalMAP", "CramersV", "TweedieDevianceScore", "BinaryFairness"])
def test_a_marked_update_compiles_in_one_graph(name):
    if name in _LATER and release_in(f"<{_LATER[name]}"):
        pytest.skip(f"{name} came in {_LATER[name]}")
    tmpatch.apply()
    make, inputs = _cases()[name]
    g = torch.Generator().manual_seed(0)
    batches = [inputs(g) for _ in range(3)]
    metric, eager = make(), make()
    reset_dynamo()
    counters.clear()
    step = torch.compile(lambda args: metric.update(*args), backend="eager", fullgraph=True)
    step(batches[0])
    lists = any(isinstance(default, list) for default in metric._defaults.values())
    with dynamo.config.patch(error_on_recompile=not lists):  # a list state's length is a guard (docs/guide/compile.rst)
        for batch in batches[1:]:
            step(batch)
    assert [reason.splitlines()[0][:200] for reason in counters["graph_break"]] == []
    assert metric._update_count == len(batches)
    for batch in batches:
        eager.update(*batch)
    for key in metric._defaults:
        mine, want = getattr(metric, key), getattr(eager, key)
        if isinstance(mine, list):
            assert len(mine) == len(want), key
            for a, b in zip(mine, want):
                assert_bitwise(a, b)
        else:
            assert_bitwise(mine, want)
