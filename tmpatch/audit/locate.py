"""Source location of a sync point: the innermost frame outside torch and tmpatch.audit."""
from __future__ import annotations

import os
import sys
import warnings
from types import FrameType
from typing import Optional, Tuple

import torch

_SKIP_DIRS: Tuple[str, ...] = (
    os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,
    os.path.dirname(os.path.abspath(__file__)) + os.sep,
)
_SKIP_FILES = ("contextlib.py", "<frozen ")
#: the stdlib's warnings module: torch's sync-debug warnings reach the audit's hook through it
_WARNINGS = os.path.abspath(warnings.__file__)
#: the probe table is code under audit, not the audit's own machinery
_AUDITED = (os.path.join(os.path.dirname(os.path.abspath(__file__)), "probe_fns.py"),)


def _skipped(filename: str) -> bool:
    if filename == _WARNINGS:
        return True
    if filename.startswith(_SKIP_DIRS):
        return filename not in _AUDITED
    return filename.endswith(_SKIP_FILES[0]) or filename.startswith(_SKIP_FILES[1])


def caller_frame(start: int = 1) -> Optional[FrameType]:
    """The innermost frame (from ``start`` levels up) whose code is not in torch or this package."""
    frame: Optional[FrameType] = sys._getframe(start + 1)
    while frame is not None and _skipped(frame.f_code.co_filename):
        frame = frame.f_back
    return frame


def locate(start: int = 1) -> Tuple[str, str]:
    """``(file:line, function)`` of :func:`caller_frame`; ``("?", "?")`` if none."""
    frame = caller_frame(start + 1)
    if frame is None:
        return "?", "?"
    return f"{frame.f_code.co_filename}:{frame.f_lineno}", frame.f_code.co_name
