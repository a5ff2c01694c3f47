"""The README's patch table lists every patch of the catalogue, in its order, and no other."""
from __future__ import annotations

import os
import re

import pytest

from tests.conftest import ROOT
from tmpatch.patches import NAMES

pytestmark = pytest.mark.once  # nothing here depends on the torchmetrics release


def _table_rows():
    with open(os.path.join(ROOT, "README.rst"), encoding="utf-8") as handle:
        text = handle.read()
    section = text.split("What it fixes\n", 1)[1].split("\n\n\n", 1)[0]
    table = section.split(".. list-table::", 1)[1]
    return re.findall(r"^   \* - ``(\w+)``$", table, flags=re.M)


def test_every_patch_has_one_row_in_catalogue_order():
    assert _table_rows() == list(NAMES)


def _readme() -> str:
    with open(os.path.join(ROOT, "README.rst"), encoding="utf-8") as handle:
        return " ".join(handle.read().split())  # one line: sentences wrap anywhere


def _bullet(text: str, start: str) -> str:
    """The README's list item of the results section that starts with ``start``."""
    return text.split("Results and deliberate corrections", 1)[1].split(f"* {start}", 1)[1].split(" * ``", 1)[0]


def test_nan_checks_ddp_text_says_where_the_report_comes():
    """With coalesced_sync the records are summed over the ranks: the report comes on every rank
    (tests/patches/test_deferred_reports_ddp.py), not only on the one that saw the NaN."""
    text = _bullet(_readme(), "``nan_check``")
    assert "never synced" not in text
    assert "rank that saw the NaN" in text and "``coalesced_sync``" in text and "on every rank" in text


def test_bincounts_text_names_where_upstream_counts_an_invalid_class_silently():
    """Upstream does not always fail in update(): for these it counts the value in the wrong cells
    (tests/patches/bincount/test_invalid.py shows it on every release)."""
    text = _bullet(_readme(), "``bincount``")
    for name in ("MultilabelConfusionMatrix", "binned multilabel curves", "micro-averaged multiclass stat scores",
                 "silently"):
        assert name in text, name


def test_the_deferred_reports_settle_points_and_their_cost_are_told():
    text = _readme().split("Deferred checks: one read per ``compute()``", 1)[1].split("The whole library", 1)[0]
    for point in ("``reset()``", "``state_dict()``", "pickling", "``merge_state()``", "``sync()``", "one device read"):
        assert point in text, point
