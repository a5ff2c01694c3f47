"""Source locations: the innermost frame outside torch and tmpatch.audit (where a sync point
is), and the short form of a path that the audit's text shows."""
from __future__ import annotations

import functools
import importlib.util
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


@functools.lru_cache(maxsize=None)
def _package_folders() -> Tuple[Tuple[str, str], ...]:
    """``(folder + os.sep, name)`` of torchmetrics, tmpatch and torch where they are installed
    (found, not imported)."""
    found = []
    for name in ("torchmetrics", "tmpatch", "torch"):
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin:
            found.append((os.path.dirname(os.path.abspath(spec.origin)) + os.sep, name))
    return tuple(found)


def short_path(path: str) -> str:
    """``path`` as the audit shows it: ``torchmetrics/...``, ``tmpatch/...`` or ``torch/...`` for
    a file of those packages where they are installed, relative to the current directory for a
    file below it, else whole. A folder of the user's that happens to be named ``torch`` or
    ``tmpatch`` (a checkout, say) is not mistaken for the package."""
    if not path or path.startswith("<"):
        return path
    full = os.path.abspath(path)
    for folder, name in _package_folders():
        if full.startswith(folder):
            return name + "/" + full[len(folder):].replace(os.sep, "/")
    try:
        relative = os.path.relpath(full)
    except ValueError:  # another drive
        return path
    return path if relative.startswith("..") else relative


def short_location(location: str) -> str:
    """``file:line`` with the file as :func:`short_path` gives it (``?`` and the like as they are)."""
    path, colon, line = location.rpartition(":")
    return f"{short_path(path)}:{line}" if colon and path else location
