"""The audit panel, run once per test session (per release in the matrix) and shared."""
from __future__ import annotations

import pytest

import tmpatch


@pytest.fixture(scope="session")
def panel_result():
    """``run_panel(real=False)`` of the whole panel (several seconds): read it, never change it."""
    from tmpatch.audit.panel.run import run_panel

    tmpatch.revert()
    return run_panel(real=False)
