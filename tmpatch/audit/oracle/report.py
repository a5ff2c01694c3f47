"""Result types of the sync audit: kinds, sync points, reports, errors."""
from __future__ import annotations

import enum
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch.utils._pytree import tree_flatten


class SyncKind(str, enum.Enum):
    """What a point of an audit is; the value is the user-facing text.

    Every kind but :data:`NON_SYNC_KINDS` blocks the host until the device catches up.
    """

    D2H_READ = "device-to-host read"
    H2D_COPY = "host-to-device copy"
    D2H_COPY = "device-to-host copy"
    DATA_DEPENDENT_SHAPE = "data-dependent shape"
    CPU_INDEX = "implicit host-to-device copy (CPU index)"
    CPU_VALUE = "implicit host-to-device copy (CPU value)"
    LINALG_CHECK = "linalg error check"
    FORMAT = "tensor formatted on the host"
    SYNCHRONIZE = "explicit synchronize"
    #: not syncs: reported apart, never counted
    DEVICE_MISMATCH = "device mismatch"
    PINNED_COPY = "non-blocking copy (pinned memory)"

    def __str__(self) -> str:
        return self.value

    @property
    def is_sync(self) -> bool:
        """Whether this kind blocks the host (False for a device mismatch or a pinned async copy)."""
        return self not in NON_SYNC_KINDS


#: kinds that are reported apart from the syncs: not counted, never failing ``--fail-on-sync``
NON_SYNC_KINDS = frozenset({SyncKind.DEVICE_MISMATCH, SyncKind.PINNED_COPY})


@dataclass(frozen=True)
class SyncPoint:
    """One host<->device synchronisation seen during an audit, or one non-sync event
    (``kind.is_sync`` False: a device mismatch, a non-blocking copy to pinned memory)."""

    kind: SyncKind
    op: str
    location: str
    function: str
    detail: str = ""

    @property
    def is_sync(self) -> bool:
        """Whether this point is a sync (see :attr:`SyncKind.is_sync`)."""
        return self.kind.is_sync

    def __str__(self) -> str:
        text = f"{self.kind.value}: {self.op} at {self.location} in {self.function}"
        return f"{text} ({self.detail})" if self.detail else text

    def to_dict(self) -> Dict[str, str]:
        """Plain-JSON form."""
        data = asdict(self)
        data["kind"] = self.kind.value
        return data


@dataclass(frozen=True)
class Read:
    """One value read of a simulated run: where, the value it was given, its default and the
    other answers that may take another branch (see :mod:`tmpatch.audit.oracle.continuation`)."""

    index: int
    op: str
    location: str
    function: str
    value: Any
    default: Any
    alternatives: Tuple[Any, ...] = ()

    def to_dict(self) -> Dict[str, Any]:
        """Plain-JSON form (values as ``repr``)."""
        return {"index": self.index, "op": self.op, "location": self.location, "function": self.function,
                "value": repr(self.value), "default": repr(self.default)}


class SyncError(RuntimeError):
    """Raised by :func:`no_sync` on the first sync point inside it; ``hint`` (a second line)
    says what to do when the sync looks like set-up (moving data to the device)."""

    def __init__(self, point: SyncPoint, hint: str = "") -> None:
        super().__init__(f"{point.kind.value}: {point.op} at {point.location} in {point.function}"
                         + (f" ({point.detail})" if point.detail else "") + (f"\n{hint}" if hint else ""))
        self.point = point
        self.hint = hint


@dataclass
class AuditReport:
    """Sync points recorded while running one callable, plus its return value.

    ``sync_points`` holds the syncs only; ``non_syncs`` the events reported apart (device
    mismatches, non-blocking copies to pinned memory): :attr:`count` and ``--fail-on-sync``
    see only the syncs. ``mode`` is ``"simulated"`` (fake CUDA tensors) or ``"real"`` (a GPU).
    ``error`` holds the exception that stopped a simulated run early (an op whose output
    shape the audit cannot size, operands on different devices); ``complete`` is False then
    and the points are those seen up to it. ``reads`` are the value reads of a simulated run,
    in order, with the answers they were given (see :mod:`tmpatch.audit.oracle.branches`).
    """

    sync_points: List[SyncPoint] = field(default_factory=list)
    result: Any = None
    device: Optional[torch.device] = None
    mode: str = "simulated"
    error: Optional[BaseException] = None
    non_syncs: List[SyncPoint] = field(default_factory=list)
    reads: List[Read] = field(default_factory=list)

    def add(self, point: SyncPoint) -> None:
        """File ``point`` with the syncs or the non-syncs."""
        (self.sync_points if point.is_sync else self.non_syncs).append(point)

    @property
    def count(self) -> int:
        """Number of sync points (non-syncs not included)."""
        return len(self.sync_points)

    @property
    def points(self) -> List[SyncPoint]:
        """Syncs, then non-syncs."""
        return list(self.sync_points) + list(self.non_syncs)

    @property
    def complete(self) -> bool:
        """Whether the callable ran to its end."""
        return self.error is None

    def by_kind(self) -> Dict[str, int]:
        """Number of sync points per kind (kind text -> count); kinds not seen are absent."""
        return dict(Counter(p.kind.value for p in self.sync_points))

    def of_kind(self, kind: "SyncKind | str") -> List[SyncPoint]:
        """The points (syncs or not) of one kind."""
        kind = SyncKind(kind)
        return [p for p in self.points if p.kind is kind]

    @property
    def result_devices(self) -> List[torch.device]:
        """Devices of the tensors in the return value (nested containers included), in order."""
        return result_devices(self.result)

    def __str__(self) -> str:
        where = f"{self.mode} {self.device}" if self.device is not None else self.mode
        lines = [f"{self.count} sync point(s) [{where}]"]
        lines += [_line(p) for p in self.sync_points]
        if self.non_syncs:
            lines.append(f"{len(self.non_syncs)} other event(s), not syncs:")
            lines += [_line(p) for p in self.non_syncs]
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
            "non_syncs": [p.to_dict() for p in self.non_syncs],
            "result_devices": [str(d) for d in self.result_devices],
            "complete": self.complete,
            "error": None if self.error is None else f"{type(self.error).__name__}: {self.error}",
        }


def _line(p: SyncPoint) -> str:
    return f"  {p.kind.value:<22} {p.op:<28} {p.location} in {p.function}" + (f"  ({p.detail})" if p.detail else "")


def result_devices(value: Any) -> List[torch.device]:
    """Devices of the tensors found in ``value`` (lists, tuples, dicts walked)."""
    return [leaf.device for leaf in tree_flatten(value)[0] if isinstance(leaf, torch.Tensor)]
