"""Result types of the sync audit: kinds, sync points, reports, errors."""
from __future__ import annotations

import enum
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional

import torch
from torch.utils._pytree import tree_leaves


class SyncKind(str, enum.Enum):
    """What a sync point does; the value is the user-facing text."""

    D2H_READ = "device-to-host read"
    H2D_COPY = "host-to-device copy"
    D2H_COPY = "device-to-host copy"
    DATA_DEPENDENT_SHAPE = "data-dependent shape"
    DEVICE_MISMATCH = "device mismatch"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class SyncPoint:
    """One host<->device synchronisation (or device mismatch) seen during an audit."""

    kind: SyncKind
    op: str
    location: str
    function: str
    detail: str = ""

    def __str__(self) -> str:
        text = f"{self.kind.value}: {self.op} at {self.location} in {self.function}"
        return f"{text} ({self.detail})" if self.detail else text

    def to_dict(self) -> Dict[str, str]:
        """Plain-JSON form."""
        data = asdict(self)
        data["kind"] = self.kind.value
        return data


class SyncError(RuntimeError):
    """Raised by :func:`no_sync` on the first sync point inside it."""

    def __init__(self, point: SyncPoint) -> None:
        super().__init__(f"{point.kind.value}: {point.op} at {point.location} in {point.function}"
                         + (f" ({point.detail})" if point.detail else ""))
        self.point = point


@dataclass
class AuditReport:
    """Sync points recorded while running one callable, plus its return value.

    ``mode`` is ``"simulated"`` (fake CUDA tensors) or ``"real"`` (a GPU).
    ``error`` holds the fake-mode exception that stopped a simulated run early
    (an op whose output shape depends on values and that the audit cannot size);
    ``complete`` is False then and the sync points are those seen up to it.
    """

    sync_points: List[SyncPoint] = field(default_factory=list)
    result: Any = None
    device: Optional[torch.device] = None
    mode: str = "simulated"
    error: Optional[BaseException] = None

    @property
    def count(self) -> int:
        """Number of sync points."""
        return len(self.sync_points)

    @property
    def complete(self) -> bool:
        """Whether the callable ran to its end."""
        return self.error is None

    def by_kind(self) -> Dict[str, int]:
        """Number of sync points per kind (kind text -> count); kinds not seen are absent."""
        return dict(Counter(p.kind.value for p in self.sync_points))

    def of_kind(self, kind: "SyncKind | str") -> List[SyncPoint]:
        """The sync points of one kind."""
        kind = SyncKind(kind)
        return [p for p in self.sync_points if p.kind is kind]

    @property
    def result_devices(self) -> List[torch.device]:
        """Devices of the tensors in the return value (nested containers included), in order."""
        return result_devices(self.result)

    def __str__(self) -> str:
        where = f"{self.mode} {self.device}" if self.device is not None else self.mode
        lines = [f"{self.count} sync point(s) [{where}]"]
        lines += [f"  {p.kind.value:<22} {p.op:<28} {p.location} in {p.function}"
                  + (f"  ({p.detail})" if p.detail else "") for p in self.sync_points]
        if self.error is not None:
            lines.append(f"  stopped early: {type(self.error).__name__}: {self.error}")
        return "\n".join(lines)

    def to_dict(self) -> Dict[str, Any]:
        """Plain-JSON form (the return value is summarised by its tensor devices)."""
        return {
            "mode": self.mode,
            "device": None if self.device is None else str(self.device),
            "count": self.count,
            "by_kind": self.by_kind(),
            "sync_points": [p.to_dict() for p in self.sync_points],
            "result_devices": [str(d) for d in self.result_devices],
            "complete": self.complete,
            "error": None if self.error is None else f"{type(self.error).__name__}: {self.error}",
        }


def result_devices(value: Any) -> List[torch.device]:
    """Devices of the tensors found in ``value`` (lists, tuples, dicts walked)."""
    return [leaf.device for leaf in tree_leaves(value) if isinstance(leaf, torch.Tensor)]
