"""tmpatch's ``sitecustomize``: ``tmpatch run`` puts this directory first on
PYTHONPATH, so every Python process it starts (and their children) imports
this module at start-up.

It applies tmpatch as the environment asks (:func:`tmpatch.bootstrap.bootstrap`;
nothing happens twice if ``tmpatch.pth`` already did it), then takes this
directory off ``sys.path`` (children still inherit PYTHONPATH) and imports the
sitecustomize this one shadows, if there is one further down the path.
Errors of tmpatch's own print one line; errors of the shadowed sitecustomize
are reported by ``site`` as they would be without tmpatch.
"""
import os
import sys


def _apply() -> None:
    try:
        from tmpatch.bootstrap import from_sitecustomize
    except Exception as exc:  # noqa: BLE001 - e.g. an interpreter without tmpatch
        sys.stderr.write(
            f"tmpatch: not applied, cannot import tmpatch.bootstrap ({type(exc).__name__}: {exc}); "
            "the program runs on unpatched\n"
        )
    else:
        from_sitecustomize()


def _same(path: str, directory: str) -> bool:
    try:
        return os.path.normcase(os.path.realpath(path)) == directory
    except (OSError, ValueError):
        return False


def _chain() -> None:
    here = os.path.normcase(os.path.realpath(os.path.dirname(os.path.abspath(__file__))))
    sys.path[:] = [entry for entry in sys.path if not (entry and _same(entry, here))]
    ours = sys.modules.pop(__name__, None)
    try:
        __import__("sitecustomize")  # the next one on sys.path, if any
    except ImportError as exc:
        if exc.name != "sitecustomize":
            raise
        if ours is not None:
            sys.modules[__name__] = ours


if __name__ == "sitecustomize":
    _apply()
    _chain()
