"""The counting metrics' ``update``: where a recorded update begins and ends.

The class ``update`` of multiclass stat scores, the three confusion matrices and the
three binned precision-recall curves (and every metric that inherits one of them:
Accuracy, F1, CohenKappa, JaccardIndex, AUROC, AveragePrecision, ROC, ...) opens a
:class:`counting.Update` for the release's code it runs, when the metric has a book
(built while ``deferred_reports`` is applied) and ``TMPATCH_BINCOUNT`` is ``deferred``.
Unbinned curves keep the release's update: their states hold the kept values
themselves, so the removal of ignored positions is inherent there.
"""
from __future__ import annotations

from types import ModuleType
from typing import Any, Callable

from tmpatch.patches.bincount.counting import RECORD, Update, active, current


def _builder(binned_only: bool) -> Callable[[ModuleType], Callable[..., Any]]:
    def build(module: ModuleType) -> Callable[..., Any]:
        recorded = RECORD.deferred

        def update(original: Callable, self: Any, *args: Any, **kwargs: Any) -> Any:
            if not active() or not recorded(self) or (binned_only and getattr(self, "thresholds", None) is None):
                return original(self, *args, **kwargs)
            token = current.set(Update(self))
            try:
                return original(self, *args, **kwargs)
            finally:
                current.reset(token)

        return update

    return build


#: stat scores and confusion matrices
build_update = _builder(binned_only=False)
#: precision-recall curves: binned ones only
build_curve_update = _builder(binned_only=True)
