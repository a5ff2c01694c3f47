"""Run-time policies that patches read at call time.

``policy`` maps a setting to its value; a patch looks its value up on each
call, so ``tmpatch.apply(nan_check=...)`` takes effect at once, also on patches
already applied. Initial values come from the environment
(``TMPATCH_<NAME>``); a bad value there is one warning, and the default holds.

* ``nan_check``: when the ``nan_check`` patch reports NaN values: ``deferred``
  (default: at the next ``compute()``), ``eager`` (during ``update()``, as
  upstream, with its sync) or ``off``.
* ``bincount``: how the ``bincount`` patch treats values outside
  ``[0, minlength)``: ``deferred`` (default: recorded on the device, reported at
  ``compute()``) or ``eager`` (the release's own ``_bincount``).
* ``update_count``: how a compiled ``update()`` raises the metric's update count:
  ``outside`` (default: run eagerly, one graph break, no recompile) or ``traced``
  (no graph break, ``fullgraph=True`` works; torch.compile guards on the count: one
  recompile where torch can treat it as dynamic, else one per step).
"""
from __future__ import annotations

import logging
import os
from typing import Dict, Tuple

log = logging.getLogger("tmpatch")

#: setting -> its values, the first being the default
CHOICES: Dict[str, Tuple[str, ...]] = {
    "nan_check": ("deferred", "eager", "off"),
    "bincount": ("deferred", "eager"),
    "update_count": ("outside", "traced"),
}

NAN_CHECK_POLICIES = CHOICES["nan_check"]
BINCOUNT_POLICIES = CHOICES["bincount"]
NAN_CHECK_ENV = "TMPATCH_NAN_CHECK"
BINCOUNT_ENV = "TMPATCH_BINCOUNT"


def validate(name: str, value: object) -> str:
    """``value`` if it is one of ``name``'s choices; else ``ValueError`` naming them."""
    choices = CHOICES[name]
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"tmpatch: {name} must be one of {', '.join(choices)}; got {value!r}")
    return value


def _from_env(name: str) -> str:
    variable = f"TMPATCH_{name.upper()}"
    raw = os.environ.get(variable, "").strip().lower()
    if not raw:
        return CHOICES[name][0]
    try:
        return validate(name, raw)
    except ValueError as exc:
        log.warning("%s (from %s); using %s", exc, variable, CHOICES[name][0])
        return CHOICES[name][0]


policy: Dict[str, str] = {name: _from_env(name) for name in CHOICES}


def set_policy(name: str, value: str) -> None:
    """Set ``policy[name]``; ``ValueError`` names the valid values."""
    policy[name] = validate(name, value)


def set_nan_check(value: str) -> None:
    """Set ``policy["nan_check"]``."""
    set_policy("nan_check", value)
