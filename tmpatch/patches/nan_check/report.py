"""nan_check's report at compute(): the release's own wording, once, for what the updates saw."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from tmpatch.runtime import deferred


@dataclass(frozen=True)
class _Release:
    """What differs between the upstream implementations of the check."""

    one_argument: bool  # 1.0.0: ``(self, x)``; MeanMetric.update calls it twice
    spelling: str  # "Encounted" up to 1.2.0
    metric_dtype: bool  # 1.3.2+: ``self.dtype``; before: float32
    disable: bool  # 1.6.2+: ``nan_strategy="disable"``
    rank_zero: bool = True  # 1.0.0+: ``rank_zero_warn``; 0.10-0.11: ``warnings.warn`` on every rank

    @property
    def weight_takes_strategy(self) -> bool:
        """1.0.1-1.6.1 write a float strategy into the weight too (``weight[nans | nans_weight] =
        self.nan_strategy``; 1.6.2+ write 1; 1.0.0 checks the weight in a call of its own)."""
        return not (self.one_argument or self.disable)

    @property
    def error(self) -> str:
        return f"{self.spelling} `nan` values in tensor"

    @property
    def warning(self) -> str:
        return f"{self.spelling} `nan` values in tensor. Will be removed."


#: the release loaded (set when the check is built), for the report's wording
_loaded: Dict[str, Any] = {}


def _describe(top: Any, found: List[Tuple[Any, int]]) -> str:
    name = type(top).__name__
    inner = {type(metric).__name__ for metric, _ in found if metric is not top}
    return f"{name} ({', '.join(sorted(inner))} inside)" if inner else name


def _report(top: Any, found: List[Tuple[Any, int]], all_ranks: bool) -> None:
    """Where a check was deferred (a device's update): the release's warning, in its words through
    its own warn function (its file, module and rank rule), or its error with tmpatch's note after
    the release's words (it comes later than the release's); the note goes to the ``tmpatch`` logger."""
    release: Optional[_Release] = _loaded.get("release")
    if release is None:
        return
    by_strategy: Dict[str, int] = {}
    for metric, count in found:
        strategy = getattr(metric, "nan_strategy", None)
        if strategy in ("warn", "error"):
            by_strategy[strategy] = by_strategy.get(strategy, 0) + count
    where = " on some rank" if all_ranks else ""
    for strategy in ("warn", "error"):
        seen = by_strategy.get(strategy)
        if not seen:
            continue
        note = (f"tmpatch nan_check: {_describe(top, found)} saw NaN{where} in {seen} update(s) since the last "
                f"report; reported at {deferred.point()}; TMPATCH_NAN_CHECK=eager reports in update()")
        if strategy == "error":
            raise deferred.error_as_release(RuntimeError, release.error, note)
        deferred.warn_as_release(_loaded["rank_zero_warn"], release.warning, UserWarning, note)


RECORD = deferred.Record("nan", _report)
