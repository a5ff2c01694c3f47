"""Branch coverage: audit both outcomes of every value read that decides a branch.

A simulated run answers each value read with one plausible value (see
:mod:`tmpatch.audit.oracle.continuation`), so code behind the other branch (a validation error,
a warning, a fall-back) is never run. :func:`audit_branches` runs the call again with
other answers: every read of a run is logged with the answers that may take the other
branch (a boolean: its negation; a number: 0; a tmpatch deferred record: 1), and each
prefix of answers not tried yet becomes a new run, breadth first, up to ``max_runs``.
A run that raises (a validation error reached by a "bad input" answer) ends there and
is kept: its syncs happened before the raise. The result is the union of the sync
points of all runs, each with the answers of the first run that reached it.

``audit --all`` (a sweep over the library) uses it so that validation and error
branches are audited too.
"""
from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Deque, Dict, List, Optional, Set, Tuple

from tmpatch.audit.oracle.api import _check_result, audit_simulated
from tmpatch.audit.oracle.report import AuditReport, SyncPoint
from tmpatch.audit.oracle.sim import DeviceLike, copy_modules, cuda_device

log = logging.getLogger("tmpatch")

Answers = Tuple[Any, ...]


@dataclass
class Path:
    """One run: the answers given to its reads (in order) and its report."""

    answers: Answers
    report: AuditReport

    @property
    def raised(self) -> Optional[BaseException]:
        """The exception that ended the run, if any."""
        return self.report.error


@dataclass
class BranchReport:
    """Every run of :func:`audit_branches` and the union of their points."""

    paths: List[Path] = field(default_factory=list)
    truncated: bool = False  #: ``max_runs`` was reached with prefixes left to try

    def _union(self, syncs: bool) -> List[Tuple[SyncPoint, Answers]]:
        seen: Dict[Tuple[str, str, str], Tuple[SyncPoint, Answers]] = {}
        for path in self.paths:
            for point in (path.report.sync_points if syncs else path.report.non_syncs):
                seen.setdefault((point.kind.value, point.op, point.location), (point, path.answers))
        return list(seen.values())

    @property
    def sync_points(self) -> List[SyncPoint]:
        """The distinct sync points of all runs (same kind, op and line: one point)."""
        return [point for point, _ in self._union(True)]

    @property
    def non_syncs(self) -> List[SyncPoint]:
        """The distinct non-sync points of all runs."""
        return [point for point, _ in self._union(False)]

    @property
    def count(self) -> int:
        """Number of distinct sync points."""
        return len(self.sync_points)

    def reached_by(self) -> List[Tuple[SyncPoint, Answers]]:
        """Each distinct sync point with the answers of the first run that reached it."""
        return self._union(True)

    @property
    def default(self) -> AuditReport:
        """The first run: every read given its default answer (what :func:`audit` reports)."""
        return self.paths[0].report

    def __str__(self) -> str:
        lines = [f"{self.count} distinct sync point(s) over {len(self.paths)} run(s)"
                 + (" (truncated: max_runs reached)" if self.truncated else "")]
        for point, answers in self.reached_by():
            lines.append(f"  {point.kind.value:<22} {point.op:<28} {point.location} in {point.function}"
                         + (f"  [answers {list(answers)}]" if answers else ""))
        raised = sorted({f"{type(p.raised).__name__}: {p.raised}" for p in self.paths if p.raised is not None})
        lines += [f"  a run ended with {text}" for text in raised]
        return "\n".join(lines)

    def to_dict(self) -> Dict[str, Any]:
        """Plain-JSON form."""
        return {
            "count": self.count, "runs": len(self.paths), "truncated": self.truncated,
            "sync_points": [dict(point.to_dict(), answers=[repr(a) for a in answers])
                            for point, answers in self.reached_by()],
            "non_syncs": [point.to_dict() for point in self.non_syncs],
            "paths": [{"answers": [repr(a) for a in p.answers], "count": p.report.count,
                       "error": None if p.raised is None else f"{type(p.raised).__name__}: {p.raised}"}
                      for p in self.paths],
        }


def audit_branches(fn: Callable[..., Any], *args: Any, device: DeviceLike = "cuda:0", max_runs: int = 32,
                   max_reads: int = 16, **kwargs: Any) -> BranchReport:
    """Audit ``fn(*args, **kwargs)`` on simulated CUDA once per combination of branch answers.

    The first run is :func:`tmpatch.audit.audit`'s (default answers). Only the first
    ``max_reads`` reads of a run are varied (loops that read a value on every turn stay
    bounded); at most ``max_runs`` runs. Arguments are copied afresh for every run, so
    each starts from the caller's state, which is left as it was.
    """
    dev = cuda_device(device)
    result = BranchReport()
    pending: Deque[Answers] = deque([()])
    tried: Set[Answers] = {()}
    while pending:
        if len(result.paths) >= max_runs:
            result.truncated = True
            break
        prefix = pending.popleft()
        run_fn, run_args, run_kwargs = copy_modules(fn, args, kwargs)
        report = audit_simulated(run_fn, run_args, run_kwargs, dev, answers=list(prefix), catch=True)
        _check_result(report, run_fn)
        given = tuple(read.value for read in report.reads)
        result.paths.append(Path(given, report))
        for read in report.reads[len(prefix):max_reads]:
            for other in read.alternatives:
                branch = given[:read.index] + (other,)
                if other != read.value and branch not in tried:
                    tried.add(branch)
                    pending.append(branch)
    log.debug("tmpatch.audit: %d branch run(s) of %r", len(result.paths), fn)
    return result
