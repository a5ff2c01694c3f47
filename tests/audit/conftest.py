"""The audit panel, run once per test session (per release in the matrix) and shared."""
from __future__ import annotations

import os

import pytest

import tmpatch
from tmpatch.audit import support

#: below the audit's torch floor (torch 2.0): its tests cannot import it; test_support.py checks the message
UNSUPPORTED = support.problem()


def pytest_ignore_collect(collection_path, config):
    if UNSUPPORTED is None:
        return None
    name = os.path.basename(str(collection_path))
    return True if name.startswith("test_") and name != "test_support.py" else None


def pytest_report_header(config):
    if UNSUPPORTED is not None:
        return f"tests/audit: not collected but test_support.py ({UNSUPPORTED.split(':')[0]})"
    return None


@pytest.fixture(scope="session")
def panel_result():
    """``run_panel(real=False)`` of the whole panel (several seconds): read it, never change it."""
    from tmpatch.audit.panel.run import run_panel

    tmpatch.revert()
    return run_panel(real=False)
