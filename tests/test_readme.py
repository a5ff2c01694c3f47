"""README.rst and the manual under docs/ say what the code does: the README's patch table is the
catalogue's (tools/patch_table.py), its corrections name every patch that changes a result, and
the manual's passages that tests elsewhere rely on are where they are said to be."""
from __future__ import annotations

import os
import re
import sys

import pytest

from tests.conftest import ROOT
from tmpatch.patches import NAMES, load

pytestmark = pytest.mark.once  # nothing here depends on the torchmetrics release

sys.path.insert(0, os.path.join(ROOT, "tools"))
import patch_table  # noqa: E402

del sys.path[0]


def _read(*path: str) -> str:
    with open(os.path.join(ROOT, *path), encoding="utf-8") as handle:
        return handle.read()


def _flat(text: str) -> str:
    return " ".join(text.split())  # one line: sentences wrap anywhere


def _table_rows():
    table = patch_table.readme_section(_read("README.rst"))
    return re.findall(r"^   \* - ``(\w+)``$", table, flags=re.M)


def test_every_patch_has_one_row_in_catalogue_order():
    assert _table_rows() == list(NAMES)


def test_the_readme_table_is_the_generated_one():
    """``python tools/patch_table.py --write`` after a change of the catalogue."""
    assert patch_table.readme_section(_read("README.rst")) == patch_table.readme_table()
    assert patch_table.main(["--check"]) == 0


def test_the_table_is_made_from_each_patch():
    """The generator reads the catalogue: each row holds its patch's summary and release range."""
    table = patch_table.readme_table()
    for name in NAMES:
        patch = load(name)
        row = table.split(f"   * - ``{name}``\n", 1)[1].split("   * - ", 1)[0]
        assert " ".join(patch.summary.split()) in row, name
        assert f"     - {patch_table.patched_on(patch)}\n" in row, name
    assert "     - 0.10.0-1.8.2\n" in table.split("``safe_divide``", 1)[1].split("   * - ", 1)[0]
    assert "     - 0.10.0-1.5.2\n" in table.split("``gather_autograd``", 1)[1].split("   * - ", 1)[0]


def test_the_readme_stays_short():
    assert len(_read("README.rst").splitlines()) <= 300


def test_the_readme_keeps_the_ci_commands():
    """The two set-up commands: the main job, and the tests as CI runs them (.ci/run runs
    tools/matrix.py --plan), with the quick command and what they cost."""
    text = _flat(_read("README.rst"))
    ci = _read(".ci", "run")
    assert "python tools/matrix.py --plan" in ci
    for command in ("pip install -e . && tmpatch audit", "bash .ci/run", "python tools/matrix.py --plan",
                    'pip install -e ".[test]" && python tools/matrix.py -r 1.4.0 -r 1.9.0',
                    "GB of downloads", "minutes on 2 idle cores", "about 5 minutes"):
        assert command in text, command


def _corrections(text: str) -> str:
    return text.split("Results and deliberate corrections", 1)[1]


def _bullet(text: str, start: str) -> str:
    """The list item of the corrections section that starts with ``start``."""
    return _corrections(text).split(f"* {start}", 1)[1].split(" * ``", 1)[0]


def test_the_readme_lists_every_patch_whose_result_differs():
    """A patch whose catalogue entry calls a change a correction, or moves an error or report out of
    update(), has a bullet in the README's short list of deliberate corrections."""
    readme = _flat(_read("README.rst"))
    section = _corrections(readme).split("Documentation", 1)[0]
    named = set(re.findall(r"\* ((?:``\w+``(?:, )?)+)", section))
    listed = {n for group in named for n in re.findall(r"``(\w+)``", group)}
    for name in NAMES:
        changes = load(name).changes
        if "correction" in changes or "compute()" in changes or "deferred" in changes:
            assert name in listed or name == "deferred_reports", name
    assert listed <= set(NAMES), listed - set(NAMES)


def test_nan_checks_ddp_text_says_where_the_report_comes():
    """With coalesced_sync the records are summed over the ranks: a warning comes on rank 0 (the
    release's rank_zero_warn), an error on every rank (tests/patches/test_deferred_reports_ddp.py)."""
    for text, start in ((_flat(_read("README.rst")), "``nan_check``, ``bincount``"),
                        (_flat(_read("docs", "results.rst")), "``nan_check``")):
        bullet = _bullet(text, start)
        assert "never synced" not in bullet
        assert "``coalesced_sync``" in bullet and "rank 0" in bullet and "every rank" in bullet, bullet


def test_bincounts_text_says_it_follows_the_release():
    """On the CPU the release's update (its counts and errors); on a device its cells, its errors
    later in its words; nothing in deterministic mode (tests/patches/bincount/test_release_errors.py)."""
    bullet = _flat(_read("docs", "results.rst")).split("* ``bincount``:", 1)[1].split(" * ``", 1)[0]
    for words in ("release's own update runs", "the release's cell", "release's words first",
                  "deterministic mode), it raises nothing"):
        assert words in bullet, words


def test_the_deferred_reports_settle_points_and_their_cost_are_told():
    text = _flat(_read("docs", "guide", "deferred.rst"))
    text = text.split("When a report comes", 1)[1].split("Which patches defer what", 1)[0]
    for point in ("``reset()``", "``state_dict()``", "pickling", "``merge_state()``", "``sync()``",
                  "reads the device once"):
        assert point in text, point


def test_when_a_report_comes_without_a_compute_is_told():
    """The update that gives it on the CPU and on a GPU (the lag, its cost, no sync), where the metric
    or the process goes, forked children, and what a per-batch try/except around update() now catches."""
    from tmpatch.runtime.deferred import landing

    text = _flat(_read("docs", "guide", "deferred.rst"))
    for words in ("**On the CPU** nothing is deferred", "from the same ``update()``/``forward()``",
                  f"at most {landing.LANDING} counting updates after the first one it concerns",
                  "No sync is added", "when the metric is garbage-collected", "when the process exits",
                  "a ``multiprocessing`` child ends", "A forked child starts with nothing pending",
                  "Skipping a bad batch", "on a GPU from a later ``update()``", "make the checks eager"):
        assert words in text, words
    readme = _flat(_read("README.rst"))
    assert f"at most {landing.LANDING} counting updates" in readme


def _user_text():
    yield "README.rst", _read("README.rst")
    yield "CHANGELOG.rst", _read("CHANGELOG.rst")
    for folder, _, files in os.walk(os.path.join(ROOT, "docs")):
        for name in sorted(files):
            if name.endswith(".rst"):
                path = os.path.join(folder, name)
                yield os.path.relpath(path, ROOT), _read(path)


def test_user_text_names_no_issue_of_this_project_and_no_commit():
    """Upstream references are links to torchmetrics (``torchmetrics#2745``); the development
    history is in git, not in the CHANGELOG, which speaks to users."""
    for path, text in _user_text():
        bare = re.sub(r"torchmetrics#\d+|/issues/\d+", "", text)
        assert not re.findall(r"#\d+", bare), path
        assert not re.findall(r"\b[Ii]ssues? \d+", bare), path
        assert not re.findall(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b", bare), path
