"""tmpatch: repairs torchmetrics in place, at run time.

``tmpatch.apply()`` patches the torchmetrics in this process (now, or when it
is imported), ``tmpatch.revert()`` puts every original back, and
``tmpatch.status()`` reports what happened to each patch. Importing tmpatch
imports neither torch nor torchmetrics.
"""
from tmpatch.api import (
    TmpatchError,
    TmpatchWarning,
    apply,
    get_original,
    is_patched,
    patch_names,
    revert,
    status,
)
from tmpatch.status import PatchStatus, Report, State

__version__ = "0.1.0"

__all__ = [
    "PatchStatus",
    "Report",
    "State",
    "TmpatchError",
    "TmpatchWarning",
    "apply",
    "get_original",
    "is_patched",
    "patch_names",
    "revert",
    "status",
    "__version__",
]
