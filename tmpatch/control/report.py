"""The status report: one row per patch, printable and JSON-ready.

``str(report)`` is a table that fits 120 columns (long targets are clipped
from the left, long reasons wrap); :meth:`Report.details` shows each patch
whole: every target, the defect, the upstream issue, what changes for the
user (``tmpatch status -v``).
"""
from __future__ import annotations

import textwrap
from dataclasses import asdict, dataclass
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from tmpatch import patches, spec
from tmpatch.control.settings import unknown_names

#: the width the table fits by default
WIDTH = 120


class State:
    """The states a patch can be in (the words ``status()`` prints)."""

    OFF = "off"  # never applied in this process
    PENDING = "pending"  # armed: a target's module is not imported yet; the patch is gated when it is
    APPLIED = "applied"
    PARTIAL = "partial"  # applied to the targets whose code is recognised; the reason names those left alone
    NOT_NEEDED = "not-needed"  # this release carries the upstream fix
    UNSUPPORTED = "unsupported"  # release outside the range the patch knows
    MISMATCH = "mismatch"  # the target's code is not one tmpatch recognises
    EXCLUDED = "excluded"
    FAILED = "failed"
    REVERTED = "reverted"

    #: states in which a requested patch did not do its whole job
    PROBLEMS = (PARTIAL, UNSUPPORTED, MISMATCH, FAILED)
    #: states in which tmpatch's code is in place
    IN_PLACE = (APPLIED, PARTIAL)
    #: states in which tmpatch's code is (or will be, on import) in place
    ACTIVE = (APPLIED, PARTIAL, PENDING)
    #: the order :func:`grouped` lists the states in
    ORDER = (APPLIED, PARTIAL, PENDING, NOT_NEEDED, UNSUPPORTED, MISMATCH, FAILED, EXCLUDED, REVERTED, OFF)
    #: what ``pending`` means, where the word alone could be read as "not applied"
    PENDING_MEANS = "until their modules are imported"


def grouped(states: Dict[str, str], width: int = 100) -> List[str]:
    """The patches grouped by state, a group a line (wrapped to ``width``, continuation lines
    indented): ``applied (20): a, b, ...``; the pending group says what pending means."""
    groups: Dict[str, List[str]] = {}
    for name, state in states.items():
        groups.setdefault(state, []).append(name)
    order = [state for state in State.ORDER if state in groups] + [s for s in groups if s not in State.ORDER]
    lines: List[str] = []
    for state in order:
        names = groups[state]
        label = f"{state} ({len(names)}, {State.PENDING_MEANS})" if state == State.PENDING else \
            f"{state} ({len(names)})"
        lines += textwrap.wrap(f"{label}: {', '.join(names)}", width, subsequent_indent="    ",
                               break_long_words=False, break_on_hyphens=False)
    return lines


@dataclass(frozen=True)
class PatchStatus:
    """One row of the report."""

    name: str
    target: str
    state: str
    reason: str
    release: str

    def to_dict(self) -> Dict[str, str]:
        return asdict(self)


def _about(name: str) -> Any:
    """The catalogue's :class:`tmpatch.spec.Patch` for ``name`` (None if unknown)."""
    try:
        return patches.load(name)
    except Exception:  # noqa: BLE001 - a report of rows tmpatch does not know
        return None


def _targets(row: PatchStatus) -> List[str]:
    patch = _about(row.name)
    return [target.path for target in patch.targets] if patch is not None and patch.targets else [row.target]


def _tail(path: str, width: int) -> str:
    """``path`` clipped from the left to ``width``: whole dotted parts kept, ``...`` first."""
    if len(path) <= width:
        return path
    parts = path.split(".")
    for start in range(1, len(parts)):
        text = "..." + ".".join(parts[start:])
        if len(text) <= width:
            return text
    return "..." + path[len(path) - max(width - 3, 1):]


def _target_cell(targets: List[str], width: int) -> str:
    more = f" (+{len(targets) - 1})" if len(targets) > 1 else ""
    whole = ", ".join(targets)
    if len(whole) <= width:
        return whole
    return _tail(targets[0], max(width - len(more), 8)) + more


class UnknownPatch(KeyError):
    """``report[name]`` for a name the report has no row of; the message names the valid ones."""

    def __str__(self) -> str:  # KeyError's own shows the repr of its argument
        return str(self.args[0]) if len(self.args) == 1 else super().__str__()


class Report(Sequence[PatchStatus]):
    """The rows of ``tmpatch.status()``; ``report["safe_divide"]`` picks one. ``release``: the
    torchmetrics release with how far its code is that of a release tmpatch knows
    (:func:`tmpatch.control.likeness.describe`: ``1.9.0``, or ``1.9.0 (code differs from the
    1.9.0 wheel in 1 of 95 targets: ...)``); the table and :meth:`details` start with it where
    the code is not a known release's. ``compared_with``: the release whose wheel the code was
    compared with (None: nothing was); ``differs``: the targets whose code differs from it."""

    _COLUMNS = ("patch", "state", "release", "target", "reason")

    def __init__(self, rows: List[PatchStatus], release: str = "", compared_with: Optional[str] = None,
                 differs: Sequence[str] = ()) -> None:
        self._rows = list(rows)
        self.release = release or (rows[0].release if rows else "")
        self.compared_with = compared_with
        self.differs = list(differs)

    @property
    def unknown_code(self) -> bool:
        """Whether the code is not that of a release tmpatch knows (``release`` says how far it is)."""
        return bool(self._rows) and self.release != self._rows[0].release

    def __getitem__(self, key):
        if isinstance(key, str):
            for row in self._rows:
                if row.name == key:
                    return row

            valid = [row.name for row in self._rows]
            raise UnknownPatch(f"{unknown_names([key], valid)}; valid names: {', '.join(valid) or 'none'}")
        return self._rows[key]

    def __len__(self) -> int:
        return len(self._rows)

    def __iter__(self) -> Iterator[PatchStatus]:
        return iter(self._rows)

    def __contains__(self, name: object) -> bool:
        return any(row.name == name for row in self._rows)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Report) and self._rows == other._rows

    def states(self) -> Dict[str, str]:
        """``{patch name: state}``."""
        return {row.name: row.state for row in self._rows}

    def problems(self, names: Optional[Sequence[str]] = None) -> List[PatchStatus]:
        """The rows (of ``names``, if given) in a problem state: asked for, not in effect."""
        return [row for row in self._rows
                if row.state in State.PROBLEMS and (names is None or row.name in names)]

    @staticmethod
    def describe(rows: Sequence[PatchStatus]) -> str:
        """``safe_divide (mismatch: why); ...``, for messages."""
        return "; ".join(f"{row.name} ({row.state}: {row.reason})" for row in rows)

    def to_dict(self, details: bool = False) -> List[Dict[str, Any]]:
        """The rows as dicts: a row's fields, ``code_compared_with`` (:attr:`compared_with`) and
        ``code_differs`` (those of the patch's targets whose code differs from that wheel);
        ``details`` adds each patch's ``targets`` (a list), ``summary``, ``upstream``, ``changes``,
        ``requires`` and ``known``."""
        out: List[Dict[str, Any]] = []
        differs = set(self.differs)
        for row in self._rows:
            item: Dict[str, Any] = row.to_dict()
            item["code_compared_with"] = self.compared_with
            item["code_differs"] = [path for path in _targets(row) if path in differs]
            if details:
                item.update(_fields(row))
            out.append(item)
        return out

    def __repr__(self) -> str:
        return f"Report({self.states()!r})"

    def __str__(self) -> str:
        return self.table()

    def table(self, width: int = WIDTH) -> str:
        """The rows as a table that fits ``width`` columns where it can, after the release's line
        where its code is not a known release's (:attr:`release`)."""
        if not self._rows:
            return "  ".join(self._COLUMNS)
        if self.unknown_code:
            head = textwrap.wrap(f"torchmetrics {self.release}", width, subsequent_indent="    ",
                                 break_long_words=False, break_on_hyphens=False)
            return "\n".join(head + [Report(self._rows).table(width)])
        fixed = [max(len(self._COLUMNS[i]), *(len(cell) for cell in column))
                 for i, column in enumerate(zip(*((r.name, r.state, r.release) for r in self._rows)))]
        room = width - sum(fixed) - 2 * len(fixed)
        targets = [_targets(row) for row in self._rows]
        want_target = max(len(", ".join(t)) for t in targets)
        want_reason = max(len(self._COLUMNS[4]), *(len(row.reason) for row in self._rows))
        if want_target + 2 + want_reason <= room:
            target_width, reason_width = max(want_target, len(self._COLUMNS[3])), want_reason
        else:  # reasons first: a target is clipped to no less than 33 columns
            target_width = max(33, min(want_target, room - 2 - want_reason))
            target_width = max(len(_target_cell(paths, target_width)) for paths in targets)
            reason_width = max(20, room - 2 - target_width)
        widths = fixed + [target_width]
        lines: List[Tuple[str, ...]] = [self._COLUMNS]
        clipped = False
        body: List[Tuple[str, ...]] = []
        for row, paths in zip(self._rows, targets):
            cell = _target_cell(paths, target_width)
            clipped = clipped or cell != ", ".join(paths)
            reason = textwrap.wrap(row.reason, reason_width, break_long_words=False,
                                   break_on_hyphens=False) or [""]
            body.append((row.name, row.state, row.release, cell, reason[0]))
            body.extend(("", "", "", "", more) for more in reason[1:])
        rule = max(len(self._COLUMNS[4]), *(len(line[4]) for line in body))
        lines += [tuple("-" * w for w in widths) + ("-" * rule,)] + body
        out = ["  ".join([*(c.ljust(w) for c, w in zip(line[:4], widths)), line[4]]).rstrip() for line in lines]
        if clipped:
            out.append("(targets clipped: `tmpatch status -v` or report.details() shows them whole)")
        return "\n".join(out)

    def details(self, width: int = WIDTH) -> str:
        """Each patch whole: state, reason, the defect, the upstream issue, what
        changes for the user, the releases it knows, every target; empty fields
        are left out."""
        releases = sorted({row.release for row in self._rows})
        shown = [self.release] if self.unknown_code else releases
        out = textwrap.wrap(f"torchmetrics {', '.join(shown)}", width, subsequent_indent="    ",
                            break_long_words=False, break_on_hyphens=False) if releases else []
        labels = ("reason", "defect", "upstream", "changes", "releases", "requires")
        for row in self._rows:
            fields = _fields(row)
            values = [row.reason, fields["summary"], fields["upstream"], fields["changes"],
                      f"written for {fields['known']}" if fields["known"] else "", ", ".join(fields["requires"])]
            out += ["", f"{row.name}: {row.state}"]
            for label, value in zip(labels, values):
                if value:
                    out.append(textwrap.fill(value, width, initial_indent=f"  {label:<10}",
                                             subsequent_indent=" " * 12, break_long_words=False,
                                             break_on_hyphens=False))
            for index, path in enumerate(fields["targets"]):
                label = ("targets" if len(fields["targets"]) > 1 else "target") if index == 0 else ""
                out.append(f"  {label:<10}{path}")
        return "\n".join(out)


def _fields(row: PatchStatus) -> Dict[str, Any]:
    """What the catalogue says of ``row``'s patch (empty where it says nothing)."""
    patch = _about(row.name)
    known = ""
    if patch is not None and getattr(patch, "known", None) is not None:
        known = spec.describe(patch.known)
    return {
        "targets": _targets(row),
        "summary": getattr(patch, "summary", "") or "",
        "upstream": getattr(patch, "upstream", "") or "",
        "changes": getattr(patch, "changes", "") or "",
        "requires": list(getattr(patch, "requires", ()) or ()),
        "known": known,
    }
