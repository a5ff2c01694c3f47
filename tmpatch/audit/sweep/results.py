"""Results of the library sweep (:mod:`tmpatch.audit.sweep.run`): causes of the remaining syncs,
one :class:`ClassResult` per class, the :class:`Sweep`, and the table ``tmpatch audit --all``
prints.

A sync left patched gets a cause from the panel's labels (the patches' own,
:data:`tmpatch.audit.panel.run.LABELS`), then :data:`SWEEP_LABELS`: *inherent* (a state whose
shape depends on the data, an answer that is a host value), *validation* (the user can turn
it off), *compute* (made by ``forward()``'s compute of the batch value, which ``update()``
alone does not make) or *not covered* (no tmpatch patch removes it yet).
"""
from __future__ import annotations

import textwrap
from dataclasses import dataclass, field
from typing import Any, Dict, FrozenSet, List, Optional, Tuple

from tmpatch.audit.oracle.locate import short_location
from tmpatch.audit.oracle.report import AuditReport, SyncPoint
from tmpatch.audit.panel.run import label_for as panel_label
from tmpatch.spec import DEFERRED, INHERENT, VALIDATION, Label

SYNC_FREE, NOT_COVERED, ERROR, COMPUTE = "sync-free", "not covered", "error", "compute"
COMPUTE_REASON = "in forward()'s compute of the batch value (update() alone does not make it)"
CALLS = ("update", "forward")
MODES = ("unpatched", "patched")

#: causes of syncs no patch is about, seen in the sweep (after the panel's labels; first match wins)
SWEEP_LABELS: Tuple[Label, ...] = (
    Label(NOT_COVERED, "ranking average precision loops over samples with boolean masks (issue 14, source 8): "
          "not covered yet", function="_multilabel_ranking_average_precision_update|_rank_data"),
    Label(NOT_COVERED, "ranking loss selects with boolean masks: not covered yet",
          function="_multilabel_ranking_loss_update"),
    Label(NOT_COVERED, "torch's CUDA SVD reads its convergence info (torch.linalg.svd always checks): not covered",
          function="procrustes_disparity", op="aten._linalg_svd"),
    Label(INHERENT, "retrieval compute splits the states by query and reads each query's targets: the answer's "
          "structure depends on the data", file="retrieval/base.py"),
    Label(INHERENT, "retrieval compute: the functional metric checks each query", file="utilities/checks.py",
          function="_check_retrieval_(functional_)?inputs"),
)


def category(label: Optional[Label]) -> str:
    """The sweep's cause of a patched sync: inherent, validation, deferred or not covered."""
    if label is None:
        return NOT_COVERED
    return label.category if label.category in (INHERENT, VALIDATION, DEFERRED) else NOT_COVERED


def label_for(point: SyncPoint) -> Optional[Label]:
    """The panel's label of ``point``, else the first of :data:`SWEEP_LABELS` that matches."""
    return panel_label(point) or next((lab for lab in SWEEP_LABELS if lab.matches(point)), None)


# --- results -----------------------------------------------------------------------------------

@dataclass
class ClassResult:
    """One class: why it was skipped, or its reports per call (update/forward) and mode."""

    name: str
    module: str
    skipped: str = ""
    inputs: str = ""
    reports: Dict[str, Dict[str, AuditReport]] = field(default_factory=dict)  #: call -> mode -> report
    #: (call, mode) -> indices of the report's syncs made inside a compute() (forward's batch value)
    in_compute: Dict[Tuple[str, str], FrozenSet[int]] = field(default_factory=dict)

    def count(self, call: str, mode: str) -> Optional[int]:
        report = self.reports.get(call, {}).get(mode)
        return None if report is None else report.count

    def remaining(self, mode: str = "patched") -> List[Tuple[str, Optional[SyncPoint], str, str]]:
        """``(call, point, cause, reason)`` of every sync of ``mode``; a run that stopped early adds
        an ``error`` entry (point None)."""
        out: List[Tuple[str, Optional[SyncPoint], str, str]] = []
        for call in CALLS:
            report = self.reports.get(call, {}).get(mode)
            if report is None:
                continue
            in_compute = self.in_compute.get((call, mode), frozenset())
            for index, point in enumerate(report.sync_points):
                label = label_for(point)
                cause, reason = category(label), "unexplained sync" if label is None else label.reason
                if index in in_compute and cause != INHERENT:
                    cause = COMPUTE
                out.append((call, point, cause, reason))
            if not report.complete:
                cause = COMPUTE if -1 in in_compute else ERROR
                where = " in compute" if cause == COMPUTE else ""
                text = shorten(str(report.error), 100)
                out.append((call, None, cause, f"audit stopped early{where}: {type(report.error).__name__}: {text}"))
        return out

    def status(self, mode: str = "patched") -> str:
        """sync-free, inherent, validation, deferred, not covered or error (the worst cause)."""
        causes = {cause for _, _, cause, _ in self.remaining(mode)}
        for worst in (ERROR, NOT_COVERED, VALIDATION, DEFERRED, COMPUTE, INHERENT):
            if worst in causes:
                return worst
        return SYNC_FREE

    def to_dict(self) -> Dict[str, Any]:
        data: Dict[str, Any] = {"name": self.name, "module": self.module, "skipped": self.skipped or None}
        if self.skipped:
            return data
        data["inputs"] = self.inputs
        data["status"] = {mode: self.status(mode) for mode in MODES}
        data["counts"] = {call: {mode: self.count(call, mode) for mode in MODES} for call in CALLS}
        data["remaining"] = [{"call": call, "cause": cause, "reason": reason,
                              **({} if point is None else point.to_dict())}
                             for call, point, cause, reason in self.remaining()]
        return data


@dataclass
class Sweep:
    """Every class of one release."""

    release: str
    results: List[ClassResult]
    #: the release with how far its code is a known release's (``tmpatch.status().release``)
    code: str = ""

    @property
    def audited(self) -> List[ClassResult]:
        return [r for r in self.results if not r.skipped]

    @property
    def skipped(self) -> List[ClassResult]:
        return [r for r in self.results if r.skipped]

    def with_status(self, mode: str, *statuses: str) -> List[str]:
        return [r.name for r in self.audited if r.status(mode) in statuses]

    def sync_free(self, mode: str = "patched") -> List[str]:
        return self.with_status(mode, SYNC_FREE)

    def not_inherent(self) -> List[str]:
        """Classes whose patched update/forward keeps a sync that is not inherent."""
        return [r.name for r in self.audited if r.status("patched") not in (SYNC_FREE, INHERENT, COMPUTE)]

    def totals(self) -> Dict[str, int]:
        return {"audited": len(self.audited), "sync_free_unpatched": len(self.sync_free("unpatched")),
                "sync_free_patched": len(self.sync_free("patched")),
                "inherent": len(self.with_status("patched", INHERENT)),
                "compute": len(self.with_status("patched", COMPUTE)),
                "validation": len(self.with_status("patched", VALIDATION, DEFERRED)),
                "not_covered": len(self.with_status("patched", NOT_COVERED, ERROR)), "skipped": len(self.skipped)}

    def to_dict(self) -> Dict[str, Any]:
        return {"torchmetrics": self.release, "code": self.code or self.release, "totals": self.totals(),
                "not_inherent": self.not_inherent(),
                "classes": [r.to_dict() for r in self.results]}




# --- the table ---------------------------------------------------------------------------------

WIDTH = 120


def _pair(result: ClassResult, call: str) -> str:
    def fmt(n: Optional[int]) -> str:
        return "-" if n is None else str(n)

    return f"{fmt(result.count(call, 'unpatched'))} -> {fmt(result.count(call, 'patched'))}"


def shorten(text: str, width: int) -> str:
    """The first line of ``text`` in at most ``width`` columns, cut at a word boundary (``...``)."""
    first = text.splitlines()[0] if text else ""
    return first if len(first) <= width else textwrap.shorten(first, width, placeholder=" ...")


def _wrapped(text: str, indent: int = 4) -> List[str]:
    """``text`` on lines of :data:`WIDTH` columns, broken between words (a word longer than a
    line alone is split); continuation lines ``indent`` columns deeper than the first."""
    text = " ".join(text.split("\n"))  # an error message may span lines
    lead = len(text) - len(text.lstrip(" "))
    return textwrap.wrap(text, WIDTH, subsequent_indent=" " * (lead + indent), break_on_hyphens=False) or [""]


def render(sweep: Sweep) -> str:
    """The table: one line per audited class (syncs per update and forward, unpatched -> patched,
    and the patched status), under it each remaining sync's source line and cause; then the
    skipped classes with why, and the totals line."""
    lines = [f"{'class':<44} {'update':>9} {'forward':>9}  status (patched)",
             f"{'-' * 44} {'-' * 9} {'-' * 9}  {'-' * 16}"]
    for result in sweep.audited:
        lines += _wrapped(f"{result.name:<44} {_pair(result, 'update'):>9} {_pair(result, 'forward'):>9}  "
                          f"{result.status('patched')}", 66)
        seen: Dict[Tuple[str, str, str], int] = {}
        for call, point, cause, reason in result.remaining():
            where = "" if point is None else f"{short_location(point.location)} {point.function}"
            key = (f"{call:<7} {where}", cause, reason)
            seen[key] = seen.get(key, 0) + 1
        for (where, cause, reason), times in seen.items():
            count = f" x{times}" if times > 1 else ""
            lines += _wrapped(f"    {where}{count}  [{cause}] {reason}")
    if sweep.skipped:
        lines += ["", f"skipped ({len(sweep.skipped)}):"]
        lines += [line for r in sweep.skipped for line in _wrapped(f"  {r.name}: {r.skipped}")]
    names = sweep.not_inherent()
    lines += ["", f"[{COMPUTE}]: {COMPUTE_REASON}.", "[not covered]: no tmpatch patch removes it yet."]
    if names:
        lines += textwrap.wrap(f"patched, a sync that is not inherent: {', '.join(names)}", WIDTH)
    lines += ["", totals_line(sweep)]
    return "\n".join(lines)


def totals_line(sweep: Sweep) -> str:
    """``classes audited; sync-free unpatched -> patched; remaining (patched) by cause; skipped``."""
    t = sweep.totals()
    return (f"totals: {t['audited']} audited; sync-free {t['sync_free_unpatched']} -> {t['sync_free_patched']}; "
            f"remaining: inherent {t['inherent']}, compute {t['compute']}, validation {t['validation']}, "
            f"not covered {t['not_covered']}; skipped {t['skipped']}")
