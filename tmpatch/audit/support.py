"""The torch versions the audit supports, and a clear message below them.

The simulated CUDA of :mod:`tmpatch.audit` rests on torch's fake tensors
(``FakeTensorMode``) and its dispatch and function modes; torch 2.1 is the oldest
release whose fake tensors can run a whole torchmetrics update (with the adaptations of
:mod:`tmpatch.audit.oracle.guard` and :mod:`tmpatch.audit.oracle.continuation`). The test matrix runs
2.0.1 (the patches alone: the audit says it needs 2.1), 2.1.2, 2.5.1, 2.13.0, 2.14.1 and 2.15.0. Nothing
here imports more than ``torch``'s version.
"""
from __future__ import annotations

from typing import Optional

from packaging.version import InvalidVersion, Version

#: the oldest torch the audit serves
MIN_TORCH = "2.1"
#: the torch releases the test matrix runs (2.13.0: a CPU-only build; the others: CUDA builds without a GPU)
TESTED_TORCH = ("2.0.1", "2.1.2", "2.5.1", "2.13.0", "2.14.1", "2.15.0")


def torch_version() -> str:
    """The installed torch's version (its local part, ``+cpu``/``+cu121``, dropped)."""
    import torch

    return str(torch.__version__).split("+", 1)[0]


def torch_at_least(minimum: str) -> bool:
    """Whether the installed torch is release ``minimum`` or later (pre-releases count as their
    release; a version that cannot be read counts as new)."""
    try:
        return Version(torch_version()).release >= Version(minimum).release
    except InvalidVersion:
        return True


def problem(version: Optional[str] = None) -> Optional[str]:
    """Why the audit cannot run on this torch (``version``: the installed one), or None."""
    found = version or torch_version()
    try:
        if Version(found) >= Version(MIN_TORCH):
            return None
    except InvalidVersion:
        return None  # a build we cannot read: let it try
    return (f"tmpatch.audit needs torch >= {MIN_TORCH}, this is torch {found}: its simulated CUDA uses "
            f"fake tensors that older torch cannot run a metric update on. Upgrade torch "
            f"(pip install 'torch>={MIN_TORCH}'); tmpatch's patches themselves do not need the audit.")


def require() -> None:
    """Raise ``ImportError`` with :func:`problem`'s message below the supported range."""
    message = problem()
    if message is not None:
        raise ImportError(message)
