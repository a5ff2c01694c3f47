"""The status report: one row per patch, printable and JSON-ready."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Dict, Iterator, List, Sequence


class State:
    """The states a patch can be in (the words ``status()`` prints)."""

    OFF = "off"  # never applied in this process
    PENDING = "pending"  # armed; takes effect when torchmetrics is imported
    APPLIED = "applied"
    NOT_NEEDED = "not-needed"  # this release carries the upstream fix
    UNSUPPORTED = "unsupported"  # release outside the range the patch knows
    MISMATCH = "mismatch"  # the target's code is not one tmpatch recognises
    EXCLUDED = "excluded"
    FAILED = "failed"
    REVERTED = "reverted"

    #: states in which a requested patch did not do its job
    PROBLEMS = (UNSUPPORTED, MISMATCH, FAILED)


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


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


class Report(Sequence[PatchStatus]):
    """The rows of ``tmpatch.status()``; ``report["safe_divide"]`` picks one."""

    _COLUMNS = ("patch", "state", "release", "target", "reason")

    def __init__(self, rows: List[PatchStatus]) -> None:
        self._rows = list(rows)

    def __getitem__(self, key):  # type: ignore[override]
        if isinstance(key, str):
            for row in self._rows:
                if row.name == key:
                    return row
            raise KeyError(key)
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

    def to_dict(self) -> List[Dict[str, str]]:
        return [row.to_dict() for row in self._rows]

    def __repr__(self) -> str:
        return f"Report({self.states()!r})"

    def __str__(self) -> str:
        cells = [self._COLUMNS] + [
            (row.name, row.state, row.release, _clip(row.target, 60), row.reason) for row in self._rows
        ]
        widths = [max(len(line[i]) for line in cells) for i in range(len(self._COLUMNS) - 1)]
        out = []
        for index, line in enumerate(cells):
            head = "  ".join(cell.ljust(width) for cell, width in zip(line, widths))
            out.append(f"{head}  {line[-1]}".rstrip())
            if index == 0:
                out.append("  ".join("-" * w for w in widths) + "  " + "-" * len(self._COLUMNS[-1]))
        return "\n".join(out)
