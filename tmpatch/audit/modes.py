"""What an audit runs under: torch's deterministic algorithms for a row that asks for them,
and tmpatch's patches put back as they were after a run that applies and reverts them."""
from __future__ import annotations

import contextlib
import warnings
from typing import Iterator, List

import torch


@contextlib.contextmanager
def deterministic(on: bool) -> Iterator[None]:
    if not on:
        yield
        return
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*deterministic mode.*")
            yield
    finally:
        torch.use_deterministic_algorithms(previous)


def _active_patches() -> List[str]:
    import tmpatch
    from tmpatch.control.report import State

    idle = (State.OFF, State.EXCLUDED, State.REVERTED)  # every other state: requested by apply()
    return [row.name for row in tmpatch.status() if row.state not in idle]


@contextlib.contextmanager
def restored_patches() -> Iterator[None]:
    """Run the block, then put tmpatch back as it was: reverted, or the patches that were
    requested (applied, pending, not needed, ...) applied again."""
    import tmpatch

    active = _active_patches()
    try:
        yield
    finally:
        tmpatch.revert()
        if active:
            tmpatch.apply(active)
