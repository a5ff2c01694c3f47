"""How far a release's code is a known release's: ``status()`` and the audit's headers say it."""
from __future__ import annotations

from typing import Dict, Optional

from tmpatch import patches as catalogue
from tmpatch.control import likeness

NEWEST = str(likeness.newest())


def _codes(release: str) -> Dict[str, Optional[str]]:
    """The fingerprints the catalogue expects at every target of ``release`` that it says it has."""
    out: Dict[str, Optional[str]] = {}
    for name in catalogue.NAMES:
        for target in catalogue.load(name).targets:
            known, want = likeness.expected(target, release)
            if known and want is not None:
                out[target.path] = want
    return out


def test_the_newest_release_is_the_last_one_the_variants_name():
    assert NEWEST == "1.9.0"


def test_the_code_of_a_known_release_is_just_its_name():
    for release in ("0.11.4", "1.4.0", NEWEST):
        assert likeness.describe(release, _codes(release)) == release
    assert likeness.describe("1.4.0", {}) == "1.4.0"  # nothing looked at: nothing to say
    assert likeness.describe(None, {}) == "not installed"


def test_a_target_held_by_patches_knowing_other_releases_is_compared_with_the_one_that_knows():
    # Metric.reset: deferred_reports knows it everywhere; pearson_update only where it has it (to 1.7.3)
    codes = _codes(NEWEST)
    assert "torchmetrics.metric.Metric.reset" in codes
    assert likeness.differing(NEWEST, codes)[3] == []


def test_code_that_differs_is_counted_and_every_target_named():
    codes = _codes(NEWEST)
    codes["torchmetrics.functional.image.ssim._ssim_update"] = "0000000000000000"
    codes["torchmetrics.utilities.compute._safe_divide"] = None  # absent
    text = likeness.describe(NEWEST, codes)
    assert text == (f"{NEWEST} (code differs from the {NEWEST} wheel in 2 of {len(codes)} targets: "  # gating order
                    "torchmetrics.utilities.compute._safe_divide, torchmetrics.functional.image.ssim._ssim_update)")


def test_a_release_tmpatch_has_not_seen_is_compared_with_the_newest_wheel():
    codes = _codes(NEWEST)
    assert likeness.describe("1.10.0", codes) == (
        f"1.10.0 (a release tmpatch has not seen; code as in the {NEWEST} wheel in all {len(codes)} targets looked at)")
    codes["torchmetrics.functional.image.ssim._ssim_update"] = "0000000000000000"
    assert likeness.describe("2.0.0rc1", codes) == (
        f"2.0.0rc1 (a release tmpatch has not seen; code differs from the {NEWEST} wheel in 1 of {len(codes)} "
        "targets: torchmetrics.functional.image.ssim._ssim_update)")
    assert likeness.describe("main", codes) == "main (a version tmpatch cannot read)"


def test_nested_ranges_give_the_narrowest_variant():
    # compiled_update knows _compute_groups_create_state_ref as 1.0.0-1.9.0, but 1.2.1-1.4.0.post0 and 1.6.2 another
    target = next(t for t in catalogue.load("compiled_update").targets
                  if t.qualname == "MetricCollection._compute_groups_create_state_ref")
    wide = next(v for v in target.variants if str(v.releases) == ">=1.0.0,<=1.9.0" or
                str(v.releases) == "<=1.9.0,>=1.0.0").fingerprint
    for release, narrow in (("1.4.0", True), ("1.6.2", True), ("1.5.0", False), ("1.9.0", False)):
        fingerprint = likeness.expected(target, release)[1]
        assert (fingerprint != wide) is narrow, release
