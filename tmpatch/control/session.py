"""The process state of tmpatch, taken and put back as one: which patches are in
effect (and the rows ``status()`` shows), the live policies, and the post-import hooks
tmpatch armed (``torch._dynamo``'s among them).

:func:`snapshot` and :func:`restore` serve the pytest plugin (around a marked test and
the whole run) and the audit (around a run that applies and reverts patches) alike.
A patch is *active* when :data:`ACTIVE` holds its state: applied, or armed to apply
when torchmetrics is imported.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, FrozenSet, List, Tuple

from tmpatch.control import api, selection
from tmpatch.control.report import Report, State
from tmpatch.runtime.policies import current as current_policies

#: a patch in effect: its wrappers in place, or armed for the import of torchmetrics
ACTIVE = State.ACTIVE
#: nothing of tmpatch in place for the patch, nothing learnt of the release
INACTIVE = (State.OFF, State.REVERTED, State.EXCLUDED)


@dataclass(frozen=True)
class Snapshot:
    """tmpatch's process state at one time: ``rows`` {patch: state}, the reasons of the
    ``excluded`` ones, the ``policies`` and the modules whose post-import hooks were ``armed``."""

    rows: Dict[str, str]
    excluded: Dict[str, str]
    policies: Dict[str, str]
    armed: FrozenSet[str]

    def active(self) -> List[str]:
        """The patches in effect then."""
        return [name for name, state in self.rows.items() if state in ACTIVE]


def snapshot() -> Snapshot:
    """The state now."""
    report = api.status()
    excluded = {row.name: row.reason for row in report if row.state == State.EXCLUDED}
    return Snapshot(report.states(), excluded, dict(current_policies), frozenset(api.armed()))


def _same(now: str, before: str) -> bool:
    return now == before or (now in ACTIVE and before in ACTIVE) or (now in INACTIVE and before in INACTIVE)


def apply_exactly(patches: Any = None, exclude: Any = None, strict: bool = False, where: str = "apply()",
                  **policies: Any) -> Tuple[Report, Snapshot]:
    """Apply exactly this selection (patches active now outside it are reverted first);
    return the report and the snapshot to :func:`restore`. On an error the state is
    restored and the error raised."""
    before = snapshot()
    try:
        selected, _ = selection.select(patches, exclude, where=where)
        outside = [name for name in before.active() if name not in selected]
        if outside:
            api.revert(outside)
        report = api.apply(patches, exclude=exclude, strict=strict, **policies)
    except BaseException:
        restore(before)
        raise
    return report, before


def restore(before: Snapshot) -> None:
    """Back to ``before``: the same patches in effect (the same wrappers), the same
    policies and armed hooks, the same rows but for patches not in effect and not excluded,
    which may read ``off`` or ``reverted`` differently (``reverted`` if they were applied
    since)."""
    current_policies.update(before.policies)
    rows = before.rows
    now = api.status().states()
    kept = [name for name, state in rows.items() if state not in INACTIVE]  # in effect, or gated (not-needed ...)
    if any(not _same(now.get(name, State.OFF), rows[name]) for name in kept):
        now = api.apply(kept).states()  # while the patches applied since are still in effect: their rows stay
    added = [name for name, state in now.items() if state in ACTIVE and rows.get(name) not in ACTIVE]
    if added:
        now = api.revert(added).states()
    stray = [name for name, state in now.items()
             if state not in (State.OFF, State.REVERTED) and state != rows.get(name)
             and rows.get(name, State.OFF) in INACTIVE]
    if stray:
        api.revert(stray)  # rows nobody asked for (excluded, not-needed ...): off again
    if before.excluded:
        api.exclude_again(before.excluded)  # an exclusion stays one
    for module_name in api.armed():
        if module_name not in before.armed:
            api.disarm(module_name)  # a hook armed since (torch._dynamo's by the first apply())

