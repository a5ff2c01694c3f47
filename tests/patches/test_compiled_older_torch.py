"""Compiled updates on torch 2.1-2.4, below the compiled paths' floor (docs/guide/compile.rst: Inside
torch.compile): dynamo there breaks in torchmetrics' own ``Metric.__setattr__``, so the
break counts of test_compiled_update.py do not apply, but a patched compiled step must
still run, recompile no more after its first step, and give the states of eager updates."""
from __future__ import annotations

import pytest

import tmpatch
from tests.conftest import torch_at_least
from tests.patches.test_compiled_update import SAMPLE, assert_same_states, compiled_run

pytestmark = [
    pytest.mark.skipif(torch_at_least(2, 5), reason="torch 2.5+: test_compiled_update.py counts the breaks"),
    # torch 2.0 compiles nothing on Python 3.11 ("Python 3.11+ not yet supported for torch.compile")
    pytest.mark.skipif(not torch_at_least(2, 1), reason="torch.compile of torch 2.0 runs no Python 3.11 code"),
]


def test_a_patched_compiled_step_runs_and_keeps_the_eager_states() -> None:
    tmpatch.apply()
    run = compiled_run(SAMPLE, steps=3)
    assert run.error is None, f"compiled step failed: {type(run.error).__name__}: {run.error}"
    assert not run.recompiled, "a step after the first recompiled"
    assert_same_states(run, SAMPLE)
