"""bincount on the CPU with its shortcuts on (tmpatch.runtime.host: the CPU shortcuts on): an update
with an invalid class is the release's update, its states and its error from update().
test_invalid.py runs these tests with the shortcuts off (a device's way); they are imported here
and run with them on. On the anchor releases of the matrix (``tools/matrix.py``: the variants of
the counting functions)."""
from __future__ import annotations

import pytest

from tests.conftest import torchmetrics_release
from tests.patches.bincount.test_invalid import (  # noqa: F401  (collected here with the CPU shortcuts on)
    _policy,
    test_binned_curves_with_invalid_classes_are_the_releases,
    test_binned_micro_curve_with_invalid_classes_is_the_releases,
    test_confusion_matrices_with_invalid_classes_are_the_releases,
    test_large_binary_curve_counts_invalid_targets_as_the_release,
    test_large_multiclass_curve_with_invalid_targets_is_the_releases,
    test_left_out_values_stay_out_at_every_threshold,
    test_multiclass_stat_scores_with_invalid_classes_are_the_releases,
    test_where_upstream_counts_an_invalid_target_silently_so_does_patched,
)

ANCHORS = ("0.11.4", "1.0.0", "1.0.3", "1.4.0", "1.6.1", "1.9.0")  # tools/matrix.py ANCHORS

pytestmark = pytest.mark.skipif(str(torchmetrics_release()) not in ANCHORS,
                                reason=f"on the anchor releases {', '.join(ANCHORS)}")
