"""What an audit runs under: torch's deterministic algorithms for a row that asks for them,
and tmpatch's patches put back as they were after a run that applies and reverts them."""
from __future__ import annotations

import contextlib
import warnings
from typing import Iterator

import torch

from tmpatch.control import session


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


@contextlib.contextmanager
def restored_patches() -> Iterator[None]:
    """Run the block, then put tmpatch back as it was (:func:`tmpatch.control.session.restore`):
    the patches that were requested (applied, pending, not needed, ...) in effect again, the
    others reverted, the policies and armed hooks as they were."""
    before = session.snapshot()
    try:
        yield
    finally:
        session.restore(before)
