"""The library sweep (``tmpatch audit --all``) on the release under test: no class that is
sync-free unpatched syncs patched, no fewer classes are sync-free patched and no more keep a
sync that is not inherent than recorded in ``sweep_expected.json``, and the manual's counts (docs/results.rst)
for 1.4.0 and 1.9.0 are the sweep's. The figures are recorded with one torch (the matrix's
newest); with another, only the first check runs. The sweep runs once per module (fixture).
Regenerate the figures with ``run_sweep().totals()`` and ``not_inherent()`` per release."""
from __future__ import annotations

import json
import os
import re
from typing import Dict, List, Optional

import pytest

pytest.importorskip("torchmetrics")
pytest.importorskip("tmpatch.audit.sweep.run")

from tests.conftest import ROOT  # noqa: E402

EXPECTED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sweep_expected.json")
README_RELEASES = ("1.4.0", "1.9.0")


@pytest.fixture(scope="module")
def sweep():
    from tmpatch.audit.sweep.run import run_sweep

    return run_sweep()


def recorded() -> Dict[str, object]:
    """``sweep_expected.json``: the torch the figures were recorded with, and per release
    ``sync_free`` (at least) and ``not_inherent`` (at most)."""
    with open(EXPECTED, encoding="utf-8") as handle:
        return json.load(handle)


def same_torch() -> bool:
    """Whether this torch is the one the figures (and the manual's counts) were recorded with:
    an older torch's simulation may see other ops, so there only no-regression is checked."""
    import torch

    return torch.__version__.split("+")[0] == recorded()["torch"]


def expected(release: str) -> Optional[Dict[str, int]]:
    """The recorded figures of ``release`` (None: none recorded, or another torch)."""
    return recorded()["releases"].get(release) if same_torch() else None  # type: ignore[union-attr]


def readme_counts() -> Dict[str, Dict[str, object]]:
    """The counts the manual states (docs/results.rst), per release: ``* torchmetrics R: A classes audited; sync-free U
    unpatched -> P patched; N not inherent: names.`` (a bullet may wrap)."""
    with open(os.path.join(ROOT, "docs", "results.rst"), encoding="utf-8") as handle:
        text = handle.read()
    found: Dict[str, Dict[str, object]] = {}
    for bullet in re.split(r"\n(?=\* |\n)", text):
        flat = " ".join(bullet.split())
        match = re.match(r"\* torchmetrics (\S+): (\d+) classes audited; sync-free (\d+) unpatched -> (\d+) "
                         r"patched; (\d+) not inherent(?:: (.*?))?\.?$", flat)
        if match:
            release, audited, before, after, count, names = match.groups()
            found[release] = {"audited": int(audited), "sync_free_unpatched": int(before),
                              "sync_free_patched": int(after), "not_inherent": int(count),
                              "names": sorted(n.strip(" `") for n in (names or "").split(",") if n.strip())}
    return found


def regressions(sweep) -> List[str]:
    """What the test asserts, as messages (empty: none)."""
    problems = []
    lost = sorted(set(sweep.sync_free("unpatched")) - set(sweep.sync_free("patched")))
    if lost:
        problems.append(f"sync-free unpatched but not patched: {lost}")
    want = expected(sweep.release)
    if want is not None:
        if len(sweep.sync_free()) < want["sync_free"]:
            problems.append(f"{len(sweep.sync_free())} classes sync-free patched, recorded {want['sync_free']}")
        if len(sweep.not_inherent()) > want["not_inherent"]:
            problems.append(f"{len(sweep.not_inherent())} classes keep a sync that is not inherent, recorded "
                            f"{want['not_inherent']}: {sweep.not_inherent()}")
    return problems


def test_no_class_regresses(sweep):
    assert not regressions(sweep)


def test_every_release_has_figures(sweep):
    if not same_torch():
        pytest.skip(f"figures recorded with torch {recorded()['torch']}")
    assert expected(sweep.release) is not None, f"record the sweep's figures of {sweep.release} in {EXPECTED}"


def test_readme_counts(sweep):
    if sweep.release not in README_RELEASES or not same_torch():
        pytest.skip(f"docs/results.rst states the counts of 1.4.0 and 1.9.0 with torch {recorded()['torch']}")
    stated = readme_counts().get(sweep.release)
    assert stated is not None, f"docs/results.rst has no counts line for {sweep.release}"
    totals = sweep.totals()
    assert stated == {"audited": totals["audited"], "sync_free_unpatched": totals["sync_free_unpatched"],
                      "sync_free_patched": totals["sync_free_patched"],
                      "not_inherent": len(sweep.not_inherent()), "names": sorted(sweep.not_inherent())}


def test_source_8_is_labelled_not_covered(sweep):
    """MultilabelRankingAveragePrecision keeps syncs no patch removes: the sweep says so, and names
    them. PanopticQuality's and ModifiedPanopticQuality's update (panoptic_matching) and
    HausdorffDistance's (edge_distances, where the release has it) are sync-free."""
    names = {r.name: r for r in sweep.audited}
    name = "MultilabelRankingAveragePrecision"
    if name not in names:  # 0.10: torchmetrics exports the legacy LabelRankingAveragePrecision instead
        pytest.skip(f"{name} is not a top-level class of torchmetrics {sweep.release}")
    assert names[name].status() == "not covered", name
    assert any("source 8" in reason for _, _, _, reason in names[name].remaining()), name
    for name in ("PanopticQuality", "ModifiedPanopticQuality", "HausdorffDistance"):
        if name in names:
            assert names[name].count("update", "unpatched") > 0, name
            assert names[name].count("update", "patched") == 0, name


def test_table_fits_and_ends_with_totals(sweep):
    from tmpatch.audit.sweep.results import render, totals_line

    text = render(sweep)
    assert max(len(line) for line in text.splitlines()) <= 120
    assert text.splitlines()[-1] == totals_line(sweep)
    assert all(r.skipped for r in sweep.skipped) and all(r.name in text for r in sweep.results)


def test_json_is_complete(sweep):
    data = json.loads(json.dumps(sweep.to_dict()))
    assert data["totals"] == sweep.totals()
    assert {c["name"] for c in data["classes"]} == {r.name for r in sweep.results}


def test_cli_all_prints_the_sweep(sweep, monkeypatch, capsys):
    from tmpatch.audit import cli
    from tmpatch.audit.sweep import run as sweep_module
    from tmpatch.audit.sweep.results import totals_line

    monkeypatch.setattr(sweep_module, "run_sweep", lambda names=None: sweep)
    assert cli.main(["--all"]) == 0
    out = capsys.readouterr().out
    assert out.rstrip().splitlines()[-1] == totals_line(sweep)
    assert cli.main(["--all", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["totals"] == sweep.totals()


def test_calibration_finds_the_sweep():
    from tmpatch.audit.calibrate.cases import sweep_sources
    from tmpatch.audit.sweep import run as sweep_module

    assert sweep_sources()["sweep"] is sweep_module.calibration_cases


@pytest.mark.once
def test_long_reasons_wrap_between_words_and_stay_whole():
    """``audit --all`` breaks a long reason between words, over as many lines as it takes, and
    shortens an error message at a word boundary (never clipped mid-word)."""
    from tmpatch.audit.sweep.results import ClassResult, Sweep, render, shorten

    words = [f"word{i:03d}" for i in range(60)]
    reason = "the reason is " + " ".join(words)
    audited = ClassResult("SomeMetricWithAVeryLongClassNameThatDoesNotFitInItsColumn", "m")
    audited.remaining = lambda mode="patched": [("update", None, "not covered", reason)]  # type: ignore[method-assign]
    skipped = ClassResult("Skipped", "m", skipped="cannot be built: ValueError: " + " ".join(words))
    text = render(Sweep("1.9.0", [audited, skipped]))
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 120 and "..." not in text
    flat = " ".join(text.split())
    assert reason in flat and skipped.skipped in flat and audited.name in flat
    assert shorten("ValueError: " + " ".join(words) + "\nsecond line", 40) == "ValueError: word000 word001 word002 ..."
    assert shorten("short\nsecond line", 40) == "short"
