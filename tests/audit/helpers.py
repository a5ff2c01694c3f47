"""Shared helpers of the audit tests."""
from __future__ import annotations

import inspect
import os
from typing import Callable

from packaging.specifiers import SpecifierSet
from packaging.version import Version


def marked_line(fn: Callable, marker: str = "# <- sync") -> int:
    """Line number of the first source line of ``fn`` carrying ``marker``."""
    lines, start = inspect.getsourcelines(fn)
    for offset, text in enumerate(lines):
        if marker in text:
            return start + offset
    raise AssertionError(f"no {marker!r} in {fn.__name__}")


def release_in(spec: str) -> bool:
    """Whether the installed torchmetrics release satisfies ``spec``."""
    import torchmetrics

    return Version(torchmetrics.__version__) in SpecifierSet(spec, prereleases=True)


def counts_with_bincount() -> bool:
    """Whether the release's ``_bincount`` calls ``torch.bincount`` (a read on CUDA): from 0.10.2;
    0.10.0-0.10.1 count with ``index_add_``, no read."""
    return release_in(">=0.10.2")


def once_per_torch() -> bool:
    """Whether a test that depends on torch but not on torchmetrics runs here: in a direct
    pytest run, or in the first run of each torch of ``tools/matrix.py`` (it sets
    ``TMPATCH_TEST_TORCH_FIRST``)."""
    return "TMPATCH_TEST_RELEASE" not in os.environ or os.environ.get("TMPATCH_TEST_TORCH_FIRST") == "1"
