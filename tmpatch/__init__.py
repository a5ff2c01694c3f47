"""tmpatch: repairs torchmetrics in place, at run time.

``tmpatch.apply()`` patches the torchmetrics in this process (now, or when it
is imported), ``tmpatch.revert()`` puts every original back, and
``tmpatch.status()`` reports what happened to each patch. Importing tmpatch
imports neither torch nor torchmetrics, nor (until a name below is used) wrapt:
the environment bootstrap runs in every process and must cost nothing. Where Python
writes no bytecode (``PYTHONDONTWRITEBYTECODE``), tmpatch's modules keep theirs in its
cache directory (:mod:`tmpatch.engine.bytecode`).
"""
from __future__ import annotations

import sys

if sys.dont_write_bytecode:  # else every process compiles tmpatch's modules again
    from tmpatch.engine import bytecode as _bytecode

    _bytecode.install(list(__path__))

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing (start-up cost)

__version__ = "0.1.0"

#: public name -> the module that defines it (loaded on first use, PEP 562)
_EXPORTS = {
    "TmpatchError": "tmpatch.control.api",
    "TmpatchWarning": "tmpatch.control.api",
    "apply": "tmpatch.control.api",
    "capture": "tmpatch.control.capture",
    "get_original": "tmpatch.control.api",
    "is_patched": "tmpatch.control.api",
    "patch_names": "tmpatch.control.api",
    "revert": "tmpatch.control.api",
    "status": "tmpatch.control.api",
    "PatchStatus": "tmpatch.control.report",
    "Report": "tmpatch.control.report",
    "State": "tmpatch.control.report",
    "CoalescedSyncError": "tmpatch.patches.coalesced_sync.wire",
}

__all__ = sorted(_EXPORTS) + ["__version__"]

if TYPE_CHECKING:  # pragma: no cover
    from tmpatch.control.api import (  # noqa: F401
        TmpatchError,
        TmpatchWarning,
        apply,
        get_original,
        is_patched,
        patch_names,
        revert,
        status,
    )
    from tmpatch.control.capture import capture  # noqa: F401
    from tmpatch.control.report import PatchStatus, Report, State  # noqa: F401
    from tmpatch.patches.coalesced_sync.wire import CoalescedSyncError  # noqa: F401


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tmpatch' has no attribute {name!r}")
    import gc
    import importlib

    collecting = gc.isenabled()
    gc.disable()  # tmpatch's modules are imported with the collector paused, as apply() runs
    try:
        value = getattr(importlib.import_module(module), name)
    finally:
        if collecting:
            gc.enable()
    globals()[name] = value
    return value


def __dir__() -> list:
    return sorted(set(globals()) | set(_EXPORTS))
