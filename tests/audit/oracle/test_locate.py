"""Short paths in the audit's text (tmpatch/audit/oracle/locate.py): a package's files from where the
package is installed, the user's files relative to the current directory, whatever the folders
around them are called."""
from __future__ import annotations

import os

import pytest
import torch
import torchmetrics

import tmpatch.audit.oracle.locate as locate
from tmpatch.audit.oracle.locate import short_location, short_path

pytestmark = pytest.mark.once


def test_package_files_are_named_from_the_package() -> None:
    assert short_path(torchmetrics.metric.__file__) == "torchmetrics/metric.py"
    assert short_path(locate.__file__) == "tmpatch/audit/oracle/locate.py"
    assert short_path(torch.nn.functional.__file__) == "torch/nn/functional.py"


def test_a_checkout_named_tmpatch_is_not_the_package(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    # `git clone` makes a folder named tmpatch; a user's step may live under a folder named torch
    checkout = tmp_path / "tmpatch"
    (checkout / "tests" / "torch").mkdir(parents=True)
    mine = checkout / "tests" / "torch" / "step.py"
    mine.write_text("pass\n")
    monkeypatch.chdir(checkout)
    assert short_path(str(mine)) == os.path.join("tests", "torch", "step.py")
    assert short_location(f"{mine}:3") == os.path.join("tests", "torch", "step.py") + ":3"
    monkeypatch.chdir(tmp_path / "tmpatch" / "tests" / "torch")
    elsewhere = tmp_path / "torch" / "step.py"
    assert short_path(str(elsewhere)) == str(elsewhere)  # outside the current directory: whole


def test_locations_without_a_file_are_kept() -> None:
    assert short_location("?") == "?"
    assert short_path("<stdin>") == "<stdin>"
