"""bincount on the CPU with its shortcuts on (tmpatch.runtime.host: the CPU shortcuts on): invalid classes give the
same states and the same report as the recorded update. test_invalid.py runs these tests with
the shortcuts off; they are imported here and run with them on: where the release raises on
every invalid class (``RELEASE_FIRST``) its update runs first and is recorded only when it
raises; the loop paths (over 50,000 scores) and label predictions are read first
(``CHECKED``). On the anchor releases of the matrix (``tools/matrix.py``: the variants of the
counting functions); that the release raises there is checked on every release
(test_host_shortcuts.py)."""
from __future__ import annotations

import pytest

from tests.conftest import torchmetrics_release
from tests.patches.bincount.test_invalid import (  # noqa: F401  (collected here with the CPU shortcuts on)
    _policy,
    test_binned_curves_leave_invalid_classes_out,
    test_binned_micro_curve_leaves_invalid_classes_out,
    test_confusion_matrices_leave_invalid_classes_out,
    test_large_binary_curve_leaves_invalid_targets_out,
    test_large_multiclass_curve_leaves_invalid_targets_out,
    test_left_out_values_stay_out_at_every_threshold,
    test_multiclass_stat_scores_leave_invalid_classes_out,
)

ANCHORS = ("1.0.0", "1.0.3", "1.4.0", "1.6.1", "1.9.0")  # tools/matrix.py ANCHORS

pytestmark = pytest.mark.skipif(str(torchmetrics_release()) not in ANCHORS,
                                reason=f"on the anchor releases {', '.join(ANCHORS)}")
