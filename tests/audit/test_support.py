"""The supported torch range: below it, a clear message instead of a failure deep inside."""
import subprocess
import sys
import textwrap

import pytest

from tests.audit.helpers import once_per_torch
from tmpatch.audit import cli, support

pytestmark = pytest.mark.once  # nothing here depends on the torchmetrics release


def test_the_range():
    assert support.problem("2.1.0") is None and support.problem("2.13.0") is None
    assert support.problem("2.14.1") is None and support.problem("2.5.1") is None
    message = support.problem("2.0.1")
    assert "torch >= 2.1" in message and "torch 2.0.1" in message and "pip install" in message
    assert (support.problem() is None) is support.torch_at_least(support.MIN_TORCH)  # this torch
    assert support.MIN_TORCH == "2.1" and "2.1.2" in support.TESTED_TORCH


@pytest.mark.skipif(not once_per_torch(), reason="once per torch of the matrix")
def test_an_old_torch_gets_the_message_from_every_entry_point():
    code = textwrap.dedent("""
        import torch
        torch.__version__ = "2.0.1"
        import tmpatch.audit
        try:
            from tmpatch.audit import audit
        except ImportError as exc:
            print("audit:", exc)
        try:
            import tmpatch.audit.fixture
        except ImportError as exc:
            print("fixture:", exc)
        from tmpatch.audit import cli
        print("cli exit", cli.main(["--metric", "SumMetric", "--simulated"]))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.count("needs torch >= 2.1, this is torch 2.0.1") == 2
    assert "cli exit 1" in out.stdout and "tmpatch audit: tmpatch.audit needs torch >= 2.1" in out.stderr


def test_cli_message(monkeypatch, capsys):
    monkeypatch.setattr(support, "problem", lambda version=None: "too old")
    assert cli.main(["--metric", "SumMetric"]) == 1
    assert "tmpatch audit: too old" in capsys.readouterr().err
