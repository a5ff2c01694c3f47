"""Run-time settings that patches read at call time.

``policy`` maps a setting to its value; a patch looks its value up on each call,
so ``tmpatch.apply(nan_check=...)`` takes effect at once, also on patches that
are already applied. Initial values come from the environment.

* ``policy["nan_check"]``: when the ``nan_check`` patch reports NaN values
  (``TMPATCH_NAN_CHECK``): ``deferred`` (default), ``eager`` or ``off``.
* ``policy["bincount"]``: how the ``bincount`` patch treats values outside
  ``[0, minlength)`` (``TMPATCH_BINCOUNT``): ``deferred`` (default: counted on the
  device, reported at ``compute()``) or ``eager`` (the release's own ``_bincount``).
"""
from __future__ import annotations

import logging
import os
from typing import Dict

log = logging.getLogger("tmpatch")

#: the values ``policy["nan_check"]`` may take
NAN_CHECK_POLICIES = ("deferred", "eager", "off")
NAN_CHECK_ENV = "TMPATCH_NAN_CHECK"


def _validate_nan_check(value: object) -> str:
    if not isinstance(value, str) or value not in NAN_CHECK_POLICIES:
        raise ValueError(
            f"tmpatch: nan_check must be one of {', '.join(NAN_CHECK_POLICIES)}; got {value!r}"
        )
    return value


def _nan_check_from_env() -> str:
    raw = os.environ.get(NAN_CHECK_ENV, "").strip().lower()
    if not raw:
        return "deferred"
    try:
        return _validate_nan_check(raw)
    except ValueError as exc:
        log.warning("%s (from %s); using deferred", exc, NAN_CHECK_ENV)
        return "deferred"


BINCOUNT_POLICIES = ("deferred", "eager")
BINCOUNT_ENV = "TMPATCH_BINCOUNT"


def _bincount_from_env() -> str:
    raw = os.environ.get(BINCOUNT_ENV, "").strip().lower()
    if raw and raw not in BINCOUNT_POLICIES:
        log.warning("tmpatch: bincount must be one of %s; got %r (from %s); using deferred",
                    ", ".join(BINCOUNT_POLICIES), raw, BINCOUNT_ENV)
    return raw if raw in BINCOUNT_POLICIES else "deferred"


policy: Dict[str, str] = {"nan_check": _nan_check_from_env(), "bincount": _bincount_from_env()}


def set_nan_check(value: str) -> None:
    """Set ``policy["nan_check"]``; ``ValueError`` names the valid values."""
    policy["nan_check"] = _validate_nan_check(value)
