"""The built-in audit panel: sync points of common metrics, unpatched and patched.

Each :class:`Row` names a call (``update`` of one metric or of the five metrics of a
training step, or one torchmetrics helper) and builds it from scratch; :func:`run_panel`
audits every row twice, on the release's own code and with :func:`tmpatch.apply`, and
returns a :class:`Panel`. Metrics are built outside the simulation and, for the
patched run, after ``apply()`` (torchmetrics binds ``update`` at construction).
``compute`` is audited after one real ``update`` on the CPU.

Remaining sync points are labelled from :data:`LABELS` (matched on function name,
file and op), so a reader sees which syncs are inherent, opted into (input
validation) or removed by a tmpatch patch that is not in effect.
"""
from __future__ import annotations

import contextlib
import logging
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import tmpatch
from tmpatch.audit.modes import deterministic, restored_patches
from tmpatch.audit.oracle.api import _use_real, audit
from tmpatch.audit.oracle.breaks import Breaks
from tmpatch.audit.oracle.report import AuditReport, SyncKind, SyncPoint
from tmpatch.audit.panel.rows import (
    PATCH_ROWS,
    ROWS,
    UNMEASURED,
    WITNESSES,
    Row,
    _resolve,
    breaks_of_row,
    update_all as _update_all,
)
from tmpatch.control.report import State

log = logging.getLogger("tmpatch")

# --- labels ------------------------------------------------------------------------------------
# Each patch carries the labels of the syncs it removes (``Patch.labels``, next to its targets);
# the ones below explain syncs no patch is about. First match wins: the patches' labels first.

from tmpatch import patches as catalogue  # noqa: E402
from tmpatch.spec import DEFERRED, INHERENT, VALIDATION, Label  # noqa: E402

#: categories that ``--fail-on-sync`` tolerates in a patched update
TOLERATED = (INHERENT, VALIDATION)

GENERAL_LABELS: Tuple[Label, ...] = (
    Label(VALIDATION, "input validation (validate_args=True)",
          function=r"_\w*(validation|validate\w*|_check\w*)|_check_same_shape"),
    Label(INHERENT, "unbinned curve at compute: the distinct scores set the curve's length",
          function="_binary_clf_curve"),
    Label(INHERENT, "unbinned curve at compute (0.10-0.11): the curve stops where recall is full, found with "
          "torch.where, so its length depends on the values", function="_binary_precision_recall_curve_compute",
          op="aten.nonzero"),
    Label(INHERENT, "curve at compute: the release reads whether the target has positive and negative samples, "
          "to warn (compute's result is read anyway)",
          function=r"_\w*(roc|precision_recall_curve|auroc|average_precision)_compute", op="aten._local_scalar_dense"),
    Label(INHERENT, "average at compute: the release reads whether a class's score is NaN, to warn, and leaves "
          "those classes out of the average (a data-dependent selection; compute's result is read anyway)",
          function=r"_reduce_(auroc|average_precision)"),
    Label(DEFERRED, "a patch's report (NaN seen, values out of range) moved from update to compute: one read",
          file="tmpatch/runtime/deferred/settling.py"),
    Label(INHERENT, "the release's compute (forward() computes the batch's value too): its result is read anyway",
          function=r"_\w*_compute(_\w+)?"),
)

#: first match wins
LABELS: Tuple[Label, ...] = tuple(
    label for name in catalogue.NAMES for label in catalogue.load(name).labels
) + GENERAL_LABELS


def label_for(point: SyncPoint) -> Optional[Label]:
    """The first label of :data:`LABELS` matching ``point``, or None."""
    return next((label for label in LABELS if label.matches(point)), None)


# --- rows: tmpatch/audit/panel/rows.py -------------------------------------------------------------

def find_row(name: str) -> Row:
    """The row called ``name`` (case-insensitive; a default row or a patch's, :data:`PATCH_ROWS`);
    ``KeyError`` if none."""
    for row in ROWS + PATCH_ROWS:
        if row.name.lower() == name.lower():
            return row
    raise KeyError(name)


# --- results -----------------------------------------------------------------------------------

@dataclass
class Audited:
    """The points of one call of one row in one mode (None report: not applicable)."""

    report: Optional[AuditReport]
    patched: bool

    @property
    def count(self) -> Optional[int]:
        """Number of syncs (non-syncs not counted)."""
        return None if self.report is None else self.report.count

    @property
    def points(self) -> List[SyncPoint]:
        """Syncs, then non-syncs (device mismatches, pinned copies)."""
        return [] if self.report is None else self.report.points

    def labels(self) -> List[Optional[Label]]:
        """One label (or None) per point of :attr:`points`."""
        return [label_for(p) for p in self.points]

    def untolerated(self) -> List[SyncPoint]:
        """Sync points not labelled inherent or validation (non-syncs never count)."""
        return [p for p, lab in zip(self.points, self.labels())
                if p.is_sync and (lab is None or lab.category not in TOLERATED)]

    def to_dict(self) -> Optional[Dict[str, Any]]:
        if self.report is None:
            return None
        data = self.report.to_dict()
        for key in ("sync_points", "non_syncs"):
            for point in data[key]:
                label = label_for(SyncPoint(SyncKind(point["kind"]), point["op"], point["location"],
                                            point["function"], point["detail"]))
                point["label"] = None if label is None else {"category": label.category, "reason": label.reason}
        return data


@dataclass
class RowResult:
    """One row audited: ``update``/``compute``, unpatched and patched; ``available`` False = n/a."""

    name: str
    available: bool
    doc: str = ""
    why_na: str = ""
    helper: bool = False
    error: str = ""  #: the audit raised (text); the row's figures are incomplete
    update: Dict[str, Audited] = field(default_factory=dict)  #: "unpatched"/"patched"
    compute: Dict[str, Audited] = field(default_factory=dict)
    breaks: Dict[str, Breaks] = field(default_factory=dict)  #: graph breaks of update, by mode (if asked)
    #: the patches not in force (``patch (state)``) whose repair this row shows: it is in the default table
    stands_for: List[str] = field(default_factory=list)

    def notes(self) -> List[str]:
        """The distinct reasons of the patched syncs (update and compute), in order."""
        if not self.available:
            return [self.why_na]
        reasons: List[str] = [f"error: {self.error}"] if self.error else []
        if self.stands_for:
            reasons.append(f"not in force: {', '.join(self.stands_for)}")
        for audited in (self.update.get("patched"), self.compute.get("patched")):
            if audited is None:
                continue
            for point, label in zip(audited.points, audited.labels()):
                unexplained = "unexplained sync" if point.is_sync else f"{point.kind.value} (not a sync)"
                text = unexplained if label is None else f"{label.category}: {label.reason}"
                if text not in reasons:
                    reasons.append(text)
            if audited.report is not None and not audited.report.complete:
                reasons.append("audit stopped early")
        return reasons

    def note(self) -> str:
        """:meth:`notes`, ``;``-joined."""
        return "; ".join(self.notes())

    def fixed_by(self) -> List[str]:
        """The tmpatch patches named by the labels of unpatched syncs that are gone patched."""
        names: List[str] = []
        for part in (self.update, self.compute):
            if "unpatched" not in part or "patched" not in part:
                continue
            remaining = {(p.kind, p.function) for p in part["patched"].points}
            for point, label in zip(part["unpatched"].points, part["unpatched"].labels()):
                if label is not None and label.patch and (point.kind, point.function) not in remaining \
                        and label.patch not in names:
                    names.append(label.patch)
        return names

    def fails(self) -> bool:
        """Whether the patched ``update`` keeps a sync that is neither inherent nor validation
        (or could not be audited)."""
        if not self.available:
            return False
        patched = self.update.get("patched")
        return bool(self.error) or patched is None or bool(patched.untolerated())

    def to_dict(self) -> Dict[str, Any]:
        return {
            "name": self.name, "available": self.available, "doc": self.doc, "why_na": self.why_na,
            "error": self.error or None,
            "update": {mode: a.to_dict() for mode, a in self.update.items()},
            "compute": {mode: a.to_dict() for mode, a in self.compute.items()},
            "graph_breaks": {mode: b.to_dict() for mode, b in self.breaks.items()} or None,
            "notes": self.notes(), "fixed_by": self.fixed_by(), "fails": self.fails(),
            "not_in_force": self.stands_for or None,
        }


@dataclass
class Panel:
    """The whole panel: the torchmetrics release, the patch states and one result per row."""

    release: str
    mode: str
    patch_states: Dict[str, str]
    rows: List[RowResult]
    #: the release with how far its code is a known release's (``tmpatch.status().release``)
    code: str = ""

    def __getitem__(self, name: str) -> RowResult:
        for row in self.rows:
            if row.name.lower() == name.lower():
                return row
        raise KeyError(name)

    def failing(self) -> List[RowResult]:
        """Rows whose patched update still syncs for a reason not tolerated (see :data:`TOLERATED`)."""
        return [row for row in self.rows if row.fails()]

    def to_dict(self) -> Dict[str, Any]:
        return {"torchmetrics": self.release, "code": self.code or self.release, "mode": self.mode,
                "patches": self.patch_states, "rows": [row.to_dict() for row in self.rows]}


# --- running -----------------------------------------------------------------------------------

def _compute_all(metrics: List[Any]) -> List[Any]:
    return [metric.compute() for metric in metrics]


def _audit_row(row: Row, patched: bool, real: Optional[bool], device: str) -> Tuple[Audited, Optional[Audited]]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torchmetrics' own warnings (compute before update, ...)
        calls = row.build()
        with deterministic(row.deterministic):
            if row.helper:
                target, args, kwargs = calls[0]
                return Audited(audit(target, *args, device=device, real=real, **kwargs), patched), None
            update = audit(_update_all, calls, device=device, real=real)
            for metric, args, kwargs in calls:  # one real update on the CPU, then compute on the device
                metric.update(*args, **kwargs)
            compute = audit(_compute_all, [metric for metric, _, _ in calls], device=device, real=real)
    return Audited(update, patched), Audited(compute, patched)


def _available(row: Row) -> Tuple[bool, str]:
    for name in row.requires:
        try:
            _resolve(name)
        except (ImportError, AttributeError):
            return False, f"n/a: {name.replace(':', '.')} not in this release"
    return True, ""


@contextlib.contextmanager
def _said(once: bool) -> Iterator[None]:
    """With ``once``: tmpatch's warnings of a patch not in force, said at the panel's first apply(),
    are not said again by the next."""
    level = log.level
    if once:
        log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)


def _not_in_force(states: Dict[str, str]) -> Dict[str, str]:
    """``{patch: state}`` of the patches not (wholly) in force: partial, mismatch, unsupported, failed."""
    return {name: state for name, state in states.items() if state in State.PROBLEMS}


def _stand_in(rows: List[Row], results: List[RowResult], lost: Dict[str, str]) -> Tuple[List[Row], List[RowResult]]:
    """The rows to add for the patches ``lost`` (not in force), their results marked; a patch whose repair no
    row counts gets an n/a row saying so (:data:`UNMEASURED`). The rows already there are marked too."""
    names = [row.name for row in rows]
    added_rows: List[Row] = []
    added: List[RowResult] = []
    for patch, state in lost.items():
        label = f"{patch} ({state})"
        if patch in UNMEASURED:
            added.append(RowResult(patch, False, why_na=f"{label}: not measured by the panel: {UNMEASURED[patch]}",
                                   stands_for=[label]))
            continue
        for name in WITNESSES.get(patch, ()):
            if name not in names:
                row = find_row(name)
                ok, why = _available(row)
                added_rows.append(row)
                added.append(RowResult(row.name, ok, row.doc, why, row.helper))
                names.append(name)
            result = next(r for r in results + added if r.name == name)
            if label not in result.stands_for:
                result.stands_for.append(label)
    return added_rows, added


def _audit_rows(rows: List[Row], results: List[RowResult], mode: str, real: Optional[bool],
                device_for: Optional[Callable[[str], str]], breaks: bool) -> None:
    """Audit each available row in ``mode`` (tmpatch applied or not, by the caller) into its result."""
    import torchmetrics

    for row, result in zip(rows, results):
        if not result.available:
            continue
        log.debug("tmpatch.audit: panel row %s, %s", row.name, mode)
        try:
            device = row.device if device_for is None else device_for(row.device)
            update, compute = _audit_row(row, mode == "patched", real, device)
        except Exception as exc:  # noqa: BLE001 - one broken row must not hide the others
            if mode == "unpatched":  # the release itself cannot run the call (an upstream bug)
                result.available = False
                result.why_na = f"n/a: torchmetrics {torchmetrics.__version__} raises {type(exc).__name__}: {exc}"
                log.info("tmpatch.audit: panel row %s: %s", row.name, result.why_na)
                continue
            log.warning("tmpatch.audit: panel row %s (%s) failed: %r", row.name, mode, exc)
            result.error = f"{mode}: {type(exc).__name__}: {exc}"
            continue
        result.update[mode] = update
        if compute is not None:
            result.compute[mode] = compute
        if breaks:
            result.breaks[mode] = breaks_of_row(row)


def run_panel(names: Optional[Sequence[str]] = None, real: Optional[bool] = None,
              device_for: Optional[Callable[[str], str]] = None, breaks: bool = False) -> Panel:
    """Audit the rows named (default: all; in panel order), unpatched then patched; tmpatch is
    left as found. ``KeyError`` for an unknown name. The default panel adds, for each patch not
    in force (partial, mismatch, unsupported, failed), the rows that show its repair
    (:data:`WITNESSES`; an n/a row where none can, :data:`UNMEASURED`), so that its totals
    count what is lost.

    ``real``: see :func:`tmpatch.audit.audit` (None: a GPU when there is one).
    ``device_for`` maps a row's device to the one used (a GPU with one device runs the
    ``cuda:1`` rows on ``cuda:0``).
    ``breaks``: also compile each row's update on the CPU and report its graph breaks and
    recompiles (:mod:`tmpatch.audit.oracle.breaks`; resets torch.compile's caches).
    """
    import torchmetrics

    wanted = None if names is None else {find_row(n).name for n in names}
    rows = [row for row in ROWS + PATCH_ROWS if row.name in wanted] if wanted is not None else list(ROWS)
    results = []
    for row in rows:
        ok, why = _available(row)
        results.append(RowResult(row.name, ok, row.doc, why, row.helper))
    with restored_patches():
        lost: Dict[str, str] = {}
        if wanted is None:
            lost = _not_in_force(tmpatch.apply().states())
            more_rows, more = _stand_in(rows, results, lost)
            rows, results = rows + more_rows, results + more
        tmpatch.revert()
        _audit_rows(rows, results, "unpatched", real, device_for, breaks)
        with _said(once=wanted is None):
            tmpatch.apply()
        _audit_rows(rows, results, "patched", real, device_for, breaks)
        report = tmpatch.status()  # after the rows: a module they imported applied its patches
        if wanted is None:  # a patch pending until a row imported its module, and not in force then
            later = {name: state for name, state in _not_in_force(report.states()).items() if name not in lost}
            more_rows, more = _stand_in(rows, results, later)
            if more_rows:
                tmpatch.revert()
                _audit_rows(more_rows, more, "unpatched", real, device_for, breaks)
                with _said(once=True):
                    tmpatch.apply()
                _audit_rows(more_rows, more, "patched", real, device_for, breaks)
                report = tmpatch.status()
            results += more
    return Panel(torchmetrics.__version__, "real" if _use_real(real) else "simulated", report.states(), results,
                 report.release)
