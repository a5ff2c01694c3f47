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
