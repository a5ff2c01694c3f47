"""The bincount tests check the recorded update itself: its CPU shortcut (valid classes
take the release's update) is off here but in test_cpu_fast*.py, which check it."""
from __future__ import annotations

import pytest

from tmpatch.patches.bincount import metrics


@pytest.fixture(autouse=True)
def _recorded_on_the_cpu(request):
    metrics.CPU_FAST = "test_cpu_fast" in request.module.__name__
    yield
    metrics.CPU_FAST = True
