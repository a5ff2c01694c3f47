"""tools/matrix.py: the release matrix holds a release of every upstream implementation
that a patch recognises, so each variant's replacement runs in the suite."""
from __future__ import annotations

import importlib.util
import os

from packaging.version import Version

from tmpatch import patches as catalogue
from tmpatch.spec import describe

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _matrix_releases():
    spec = importlib.util.spec_from_file_location("tmpatch_tools_matrix", os.path.join(ROOT, "tools", "matrix.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return [Version(r) for r in module.RELEASES]


def test_every_variant_has_a_release_in_the_matrix():
    releases = _matrix_releases()
    missing = []
    for name in catalogue.NAMES:
        for target in catalogue.load(name).targets:
            for variant in target.variants:
                if not any(variant.releases.contains(r, prereleases=True) for r in releases):
                    missing.append(f"{name}: {target.path} {describe(variant.releases)}")
    assert not missing, "add a release of each to tools/matrix.py RELEASES:\n" + "\n".join(missing)
