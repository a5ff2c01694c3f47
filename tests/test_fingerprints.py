"""tools/fingerprints.py: a target absent by design is said to be so, and folders reading the same
``__about__`` release are told apart by their names."""
from __future__ import annotations

import importlib.util
import os

import pytest

pytestmark = pytest.mark.once  # it reads files of fake releases: nothing depends on the release under test

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tool():
    spec = importlib.util.spec_from_file_location("tmpatch_tools_fingerprints", os.path.join(ROOT, "tools",
                                                                                               "fingerprints.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _release(folder, version):
    package = folder / "torchmetrics"
    package.mkdir(parents=True)
    (package / "__about__.py").write_text(f'__version__ = "{version}"\n')
    return str(folder)


def test_absent_by_design_is_not_unknown_and_folders_are_named(tmp_path, capsys):
    tool = _tool()
    assert tool.main([_release(tmp_path / "main", "1.9.0")]) == 0
    lines = capsys.readouterr().out.splitlines()

    def row(path):
        return lines[lines.index(path) + 1]

    # 1.0.0-1.0.3 only: missing from a 1.9.0 is what the catalogue says
    multitask = row("deferred_reports: torchmetrics.wrappers.multitask.MultitaskWrapper._wrap_compute")
    assert "absent there, as expected (the target is in 1.0.0-1.0.3)" in multitask and "UNKNOWN" not in multitask
    # in every release: missing is code not found
    reset = row("deferred_reports: torchmetrics.metric.Metric.reset")
    assert "UNKNOWN (not found)" in reset
    assert "1.9.0 [main] .. 1.9.0 [main] (1)" in reset
