"""The manual under docs/ builds with Sphinx, warnings as errors and every reference resolved."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.once  # nothing here depends on the torchmetrics release


def test_the_manual_builds_without_a_warning(tmp_path):
    pytest.importorskip("sphinx", reason="sphinx is not installed (pip install -e '.[docs]' or '.[test]')")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    done = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "-n", "--keep-going", "-q", "-b", "html",
         "-d", str(tmp_path / "doctrees"), os.path.join(ROOT, "docs"), str(tmp_path / "html")],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    catalogue = (tmp_path / "html" / "catalogue.html").read_text(encoding="utf-8")
    from tmpatch.patches import NAMES

    for name in NAMES:
        assert f'id="{name.replace("_", "-")}"' in catalogue, name
