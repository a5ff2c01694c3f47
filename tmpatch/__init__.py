"""tmpatch: repairs torchmetrics in place, at run time.

``tmpatch.apply()`` patches the torchmetrics in this process (now, or when it
is imported), ``tmpatch.revert()`` puts every original back, and
``tmpatch.status()`` reports what happened to each patch. Importing tmpatch
imports neither torch nor torchmetrics, nor (until a name below is used) wrapt:
the environment bootstrap runs in every process and must cost nothing.
"""
from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing (start-up cost)

__version__ = "0.1.0"

#: public name -> the module that defines it (loaded on first use, PEP 562)
_EXPORTS = {
    "TmpatchError": "tmpatch.api",
    "TmpatchWarning": "tmpatch.api",
    "apply": "tmpatch.api",
    "capture": "tmpatch.capture",
    "get_original": "tmpatch.api",
    "is_patched": "tmpatch.api",
    "patch_names": "tmpatch.api",
    "revert": "tmpatch.api",
    "status": "tmpatch.api",
    "PatchStatus": "tmpatch.report",
    "Report": "tmpatch.report",
    "State": "tmpatch.report",
    "CoalescedSyncError": "tmpatch.patches.coalesced_sync.wire",
}

__all__ = sorted(_EXPORTS) + ["__version__"]

if TYPE_CHECKING:  # pragma: no cover
    from tmpatch.api import (  # noqa: F401
        TmpatchError,
        TmpatchWarning,
        apply,
        get_original,
        is_patched,
        patch_names,
        revert,
        status,
    )
    from tmpatch.capture import capture  # noqa: F401
    from tmpatch.patches.coalesced_sync.wire import CoalescedSyncError  # noqa: F401
    from tmpatch.report import PatchStatus, Report, State  # noqa: F401


def __getattr__(name: str) -> object:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tmpatch' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list:
    return sorted(set(globals()) | set(_EXPORTS))
