"""The catalogue of patches, and what tmpatch needs to know of torchmetrics
to gate them: is it installed, which release is it.

Each patch is a module of this package named after the patch; it exposes
``PATCH`` (a :class:`tmpatch.spec.Patch`). Loading a patch module imports
neither torch nor torchmetrics: replacements are built when their target's
module is imported.

Contract: a patch imports only the vocabulary (:mod:`tmpatch.spec`), the runtime
(:mod:`tmpatch.runtime`) and other patches; never the engine, the control layer or
the public API (``setup.cfg``'s import-linter contract). What a patch needs to know of
the code the gating recognised it is told (:func:`tmpatch.spec.told`).
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
from typing import Dict, Optional, Tuple

from tmpatch.spec import Patch

#: the package tmpatch repairs
HOST = "torchmetrics"

#: every patch name, in the order status() lists them
NAMES = (
    "deferred_reports",
    "safe_divide",
    "cumsum_device",
    "mean_default_weight",
    "nan_check",
    "bincount",
    "retrieval_check",
    "nominal_bincount",
    "fairness_groups",
    "classification_masks",
    "vif_masks",
    "dice_weights",
    "perplexity_mask",
    "logits_check",
    "gather_autograd",
    "coalesced_sync",
    "scalar_tensors",
    "image_constants",
    "wrapper_indices",
    "panoptic_preprocess",
    "panoptic_matching",
    "edge_distances",
    "pearson_update",
    "segmentation_format",
    "legacy_dice_checks",
    "tweedie_checks",
    "pit_permutations",
    "sdr_solve",
    "compiled_update",
    "update_bookkeeping",
)

_loaded: Dict[str, Patch] = {}


def load(name: str) -> Patch:
    """The ``PATCH`` of the module named ``name``."""
    patch = _loaded.get(name)
    if patch is None:
        if name not in NAMES:
            raise ValueError(f"unknown patch {name!r}")
        patch = importlib.import_module(f"{__name__}.{name}").PATCH
        if patch.name != name:
            raise RuntimeError(f"tmpatch.patches.{name} declares the patch {patch.name!r}")
        _loaded[name] = patch
    return patch


def installed() -> bool:
    """Whether torchmetrics can be imported (without importing it)."""
    if sys.modules.get(HOST) is not None:
        return True
    try:
        return importlib.util.find_spec(HOST) is not None
    except (ImportError, ValueError):
        return False


_distribution: Tuple[Tuple[str, ...], Optional[str]] = ((), None)  # sys.path -> the release its metadata gives


def forget_release() -> None:
    """Read the distribution's metadata again at the next :func:`release` (``apply()`` starts so)."""
    global _distribution
    _distribution = ((), None)


def release() -> Optional[str]:
    """The torchmetrics release: of the imported package if it is imported, else of the
    installed distribution (its metadata read once until :func:`forget_release`, or until
    ``sys.path`` changes), else None."""
    global _distribution
    module = sys.modules.get(HOST)
    version = getattr(module, "__version__", None) if module is not None else None
    if isinstance(version, str):
        return version
    path = tuple(sys.path)
    if _distribution[0] == path and path:
        return _distribution[1]
    try:
        from importlib.metadata import PackageNotFoundError, version as dist_version
    except ImportError:  # pragma: no cover - Python < 3.8
        return None
    try:
        found: Optional[str] = dist_version(HOST)
    except PackageNotFoundError:
        found = None
    _distribution = (path, found)
    return found
