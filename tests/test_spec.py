"""tmpatch.spec: release ranges read as packaging reads the same specifiers."""
from __future__ import annotations

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from tmpatch import patches, spec

pytestmark = pytest.mark.once  # nothing here depends on the torchmetrics release


def _ranges():
    """Every range the catalogue declares."""
    found = set()
    for name in patches.NAMES:
        patch = patches.load(name)
        found.add(patch.known)
        found.update(decline.releases for decline in patch.declines)
        for target in patch.targets:
            if target.present is not None:
                found.add(target.present)
            found.update(variant.releases for variant in target.variants)
    return found


VERSIONS = [f"{major}.{minor}.{micro}{tail}" for major in (0, 1, 2) for minor in range(12) for micro in range(4)
            for tail in ("", "rc1", ".dev0", ".post1", "+cu118", "rc2+local")] + ["1.6", "0.11", "2"]


def test_every_range_of_the_catalogue_reads_as_packaging_reads_it():
    ranges = _ranges()
    assert len(ranges) > 50
    for releases in ranges:
        specifiers = SpecifierSet(str(releases))
        for text in VERSIONS:
            for prereleases in (True, False):
                expected = specifiers.contains(Version(text), prereleases=prereleases)
                assert releases.contains(text, prereleases=prereleases) is expected, (str(releases), text)
                assert releases.contains(Version(text), prereleases=prereleases) is expected


def test_ranges_are_shown_and_compared_by_their_bounds():
    assert spec.describe(spec.span("1.0.0", "1.2.0")) == "1.0.0-1.2.0"
    assert spec.describe(spec.span("1.6.0")) == "1.6.0" == spec.describe(spec.span("1.6.0", "1.6.0"))
    assert spec.describe(spec.since("1.3.2")) == "1.3.2+"
    assert str(spec.span("1.0.0", "1.2.0")) == ">=1.0.0,<=1.2.0" and str(spec.span("1.6.0")) == "==1.6.0"
    assert spec.span("1.0.0", "1.2.0") == spec.span("1.0.0", "1.2.0") != spec.since("1.0.0")
    assert len({spec.span("1.0.0", "1.2.0"), spec.span("1.0.0", "1.2.0")}) == 1
    assert "1.1.0" in spec.span("1.0.0", "1.2.0") and "1.3.0" not in spec.span("1.0.0", "1.2.0")
    assert spec.bounds(spec.since("1.3.2")) == (Version("1.3.2"), None)
    assert not spec.contains(spec.since("1.0.0"), "not a version")
