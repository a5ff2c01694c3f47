"""Shared test set-up: every test starts and ends with tmpatch reverted."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Optional

import pytest

import tmpatch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def torchmetrics_release():
    """The release under test, as a ``packaging`` Version."""
    import torchmetrics
    from packaging.version import Version

    return Version(torchmetrics.__version__)


def release_in(spec: str) -> bool:
    """Whether the release under test satisfies the specifier ``spec``."""
    from packaging.specifiers import SpecifierSet

    return torchmetrics_release() in SpecifierSet(spec, prereleases=True)


def run_python(code: str, env: Optional[dict] = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter with this one's path; fail loudly on error."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))
    full_env.update(env or {})
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout,
    )
    if proc.returncode != 0:
        raise AssertionError(f"child failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture(autouse=True)
def _reverted():
    """Leave nothing of tmpatch behind a test."""
    tmpatch.revert()
    yield
    tmpatch.revert()


def pytest_report_header(config):
    expected = os.environ.get("TMPATCH_TEST_RELEASE")
    try:
        release = str(torchmetrics_release())
    except ImportError:
        release = "not installed"
    if expected and release != expected:
        raise pytest.UsageError(f"expected torchmetrics {expected} on the path, found {release}")
    return f"torchmetrics {release}"
