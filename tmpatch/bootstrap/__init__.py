"""Auto-apply from the environment, at interpreter start-up.

Two doors lead here, both gated on ``TMPATCH`` (see :mod:`tmpatch.control.env`):

* ``tmpatch.pth`` in site-packages (installed with tmpatch) calls
  :func:`from_pth` while ``site`` processes .pth files;
* ``tmpatch run`` puts this directory first on ``PYTHONPATH``; its
  ``sitecustomize.py`` calls :func:`from_sitecustomize`, then runs the
  sitecustomize it shadows.

The first door to open bootstraps; the second does nothing (one process, one
bootstrap). Start-up stays cheap: only :mod:`os`, :mod:`tmpatch.control.env` and the
settings table it reads are imported, each problem of the environment is one
line, and a finder is put on ``sys.meta_path``. The first time torchmetrics
is looked up, that finder calls :func:`tmpatch.apply` (which arms post-import
hooks before any torchmetrics module runs), so a process that never imports
torchmetrics imports neither torch nor torchmetrics, nor even wrapt. Any error
here prints one line on stderr and the program runs on, unpatched.
"""
from __future__ import annotations

import _thread
import os
import sys

from tmpatch.control import env

#: the directory ``tmpatch run`` puts first on PYTHONPATH (holds sitecustomize.py)
DIRECTORY = os.path.dirname(os.path.abspath(__file__))

#: the package whose import arms tmpatch (``tmpatch.patches.HOST``, not imported
#: here: the catalogue's imports cost start-up time)
HOST = "torchmetrics"

#: where this process bootstrapped ("pth" or "sitecustomize"), None if not yet
started: str | None = None

#: "off", "armed" (waiting for torchmetrics), "applied", or "failed: <why>"
state = "off"


def say(message: str) -> None:
    """One line on stderr (the bootstrap's only output; logging is not loaded yet)."""
    try:
        sys.stderr.write(f"tmpatch: {message}\n")
        sys.stderr.flush()
    except Exception:  # noqa: BLE001 - no stderr: nothing to tell
        pass


class Trigger:
    """A meta-path finder that finds nothing: the first look-up of torchmetrics
    calls :func:`activate` (in that thread, before torchmetrics runs)."""

    def __init__(self, settings: env.Settings) -> None:
        self.settings = settings
        self.done = False
        self._busy = False
        self._lock = _thread.RLock()

    def find_spec(self, fullname: str, path=None, target=None):
        if fullname != HOST or self.done:
            return None
        with self._lock:
            if self.done or self._busy:
                return None  # another thread did it, or our own look-up below
            self._busy = True
            try:
                self.done = activate(self.settings)
                if self.done:
                    return _spec_through_the_hooks(self.settings.options)
            finally:
                self._busy = False
        return None

    def invalidate_caches(self) -> None:
        pass


def activate(settings: env.Settings) -> bool:
    """Apply tmpatch as ``settings`` ask. False when torchmetrics cannot be
    found (the trigger then stays armed). With ``strict`` a
    :class:`tmpatch.TmpatchError` propagates; any other error is one line."""
    global state
    try:
        from tmpatch import patches as catalogue

        if not catalogue.installed():
            return False
        env.announce(settings.check_names(catalogue.NAMES), say)
        if settings.log_level:
            _configure_logging(settings.log_level)
        from tmpatch.control import api

        strict = settings.options.get("strict")
        asked = "1" if strict is True else ",".join(strict or ())
        api.apply_from(f"tmpatch (TMPATCH_STRICT={asked})" if strict else "tmpatch", **settings.options)
        state = "applied"
    except Exception as exc:  # noqa: BLE001 - never break the program
        state = f"failed: {type(exc).__name__}: {exc}"
        if settings.options.get("strict") and type(exc).__name__ == "TmpatchError":
            raise
        say(f"not applied ({type(exc).__name__}: {exc}); the program runs on unpatched")
    return True


def _spec_through_the_hooks(options: dict):
    """The spec of torchmetrics, found again, now through wrapt's finder: the post-import hooks
    :func:`activate` armed for torchmetrics itself fire when its import ends (wrapt's finder came
    first on ``sys.meta_path`` while this look-up was under way: the import machinery would not
    ask it); tmpatch's writes what the import's hooks computed to the disk cache, and raises there
    if a patch ``options`` are strict about could not be applied whole
    (:func:`tmpatch.control.api.apply_from`). None where no hook waits for it."""
    import importlib.util

    import wrapt

    if HOST not in getattr(wrapt.importer, "_post_import_hooks", {HOST: None}):  # type: ignore[attr-defined]  # not in stubs
        return None
    return importlib.util.find_spec(HOST)


def _configure_logging(level: str) -> None:
    """Send tmpatch's log records from ``level`` up to stderr (once)."""
    import logging

    logger = logging.getLogger("tmpatch")
    logger.setLevel(level.upper())
    if not any(getattr(handler, "_tmpatch", False) for handler in logger.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s [pid %(process)d] %(message)s"))
        handler._tmpatch = True  # type: ignore[attr-defined]  # marks tmpatch's handler
        logger.addHandler(handler)
        logger.propagate = False


def bootstrap(origin: str, environ=None) -> None:
    """Read the environment and arm tmpatch (once per process)."""
    global started, state
    if started is not None:
        return
    started = origin
    try:
        settings = env.read(environ)
        env.announce(settings.problems, say)
        if not settings.enabled:
            return
        if HOST in sys.modules:  # imported already (not at start-up): apply now
            activate(settings)
            return
        sys.meta_path.insert(0, Trigger(settings))
        state = "armed"
    except Exception as exc:  # noqa: BLE001 - never break start-up
        state = f"failed: {type(exc).__name__}: {exc}"
        say(f"start-up bootstrap failed ({type(exc).__name__}: {exc}); the program runs on unpatched")


def from_pth() -> None:
    """Called by the line in ``tmpatch.pth``."""
    bootstrap("pth")


def from_sitecustomize() -> None:
    """Called by ``sitecustomize.py`` in :data:`DIRECTORY`."""
    bootstrap("sitecustomize")


def pth_line() -> str:
    """The line of ``tmpatch.pth`` (the file next to this module)."""
    with open(os.path.join(DIRECTORY, "tmpatch.pth"), encoding="utf-8") as handle:
        return handle.read().strip()
