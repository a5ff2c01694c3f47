"""The bincount tests check the recorded update itself: its CPU shortcut (valid classes
take the release's update) is off here but in test_host_shortcuts*.py, which check it. Their
reports wait for a settle point, as on a GPU before the evidence's copy lands (when they come
without one: tests/patches/test_deferred_timing.py)."""
from __future__ import annotations

import pytest

from tests.conftest import cpu_shortcuts


@pytest.fixture(autouse=True)
def _recorded_on_the_cpu(request, held_reports):
    cpu_shortcuts("test_host_shortcuts" in request.module.__name__)
    yield
    cpu_shortcuts(True)
