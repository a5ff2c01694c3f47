"""The bytecode of tmpatch's own modules where Python writes none (``PYTHONDONTWRITEBYTECODE=1``,
``python -B``): kept in tmpatch's cache directory, so that a process compiles none of them again.

Without it every process (each torchrun rank, each DataLoader worker) compiled some sixty
modules of tmpatch, most of what ``apply()`` cost there. :func:`install` puts a finder on each
of tmpatch's package directories (``sys.path_importer_cache``): a module whose own
``__pycache__`` file is missing or stale is read from ``bytecode-<cache tag>/`` in the cache
directory, or compiled and written there. An entry is used only for the same file (its
path, size and modification time, as Python checks its ``.pyc``), the same Python (its
build) and the same ``-O`` level. One that is missing, unreadable, another user's or
writable by others (it holds code that runs), or corrupt is compiled again; one that cannot
be written is not. Nothing else changes: a ``.pyc`` Python wrote is used as ever. This runs
when tmpatch is imported, at start-up: it imports nothing Python has not loaded by then but
``importlib.machinery``.
"""
from __future__ import annotations

import marshal
import os
import sys
from importlib.machinery import (
    BYTECODE_SUFFIXES,
    EXTENSION_SUFFIXES,
    SOURCE_SUFFIXES,
    ExtensionFileLoader,
    FileFinder,
    SourceFileLoader,
    SourcelessFileLoader,
)

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing: this runs at start-up
if TYPE_CHECKING:  # pragma: no cover
    from typing import Any, List, Optional

#: the first bytes of an entry: the format's version, and the Python that compiled it (its build:
#: the same text gives the same bytecode)
HEADER = b"tmpatch-bytecode-1\n" + f"{sys.implementation.name} {sys.version} {marshal.version}\n".encode()

_Code = type((lambda: 0).__code__)  # types.CodeType, without importing types


def directory() -> str:
    """The cache directory: ``$XDG_CACHE_HOME/tmpatch`` or ``~/.cache/tmpatch`` ('' if there is no home)."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):
        home = os.path.expanduser("~")
        if not os.path.isabs(home):
            return ""
        base = os.path.join(home, ".cache")
    return os.path.join(base, "tmpatch")


def _entry(name: str, path: str) -> str:
    """Where the bytecode of module ``name`` from the file ``path`` is kept ('' : nowhere); the
    name carries a short sum of the path (two copies of tmpatch keep apart; the entry says whose)."""
    folder = directory()
    if not folder:
        return ""
    tag = sys.implementation.cache_tag or "python"
    mark = sum((index + 1) * byte for index, byte in enumerate(path.encode())) % 0xFFFFFFFF
    return os.path.join(folder, f"bytecode-{tag}", f"{name}.{mark:08x}.bin")


def _stamp(path: str, stat: os.stat_result, optimize: int) -> bytes:
    """What an entry must begin with to be the code of ``path`` as it is now."""
    return b"%s%d %d %d %s\n" % (HEADER, optimize, stat.st_size, stat.st_mtime_ns, os.fsencode(path))


class Loader(SourceFileLoader):
    """A source loader that, where no ``.pyc`` serves, reads and writes the code in the cache."""

    stat: Optional[os.stat_result] = None  # the source's, taken before it is read

    def path_stats(self, path: str) -> Any:
        self.stat = os.stat(path)  # before the source is read: a change while it is read is a miss later
        return {"mtime": self.stat.st_mtime, "size": self.stat.st_size}

    def source_to_code(self, data: Any, path: Any, *, _optimize: int = -1) -> Any:  # type: ignore[override]  # CPython's signature
        stat, self.stat = self.stat, None
        optimize = sys.flags.optimize if _optimize == -1 else _optimize
        where = _entry(self.name, path) if stat is not None and isinstance(path, str) else ""
        stamp = _stamp(path, stat, optimize) if where and stat is not None else b""  # where: stat was taken
        code = _read(where, stamp) if where else None
        if code is None:
            code = super().source_to_code(data, path, _optimize=_optimize)
            if where:
                _write(where, stamp + marshal.dumps(code))
        return code


def _read(where: str, stamp: bytes) -> Optional[Any]:
    try:
        with open(where, "rb") as handle:
            info = os.fstat(handle.fileno())
            if hasattr(os, "getuid") and (info.st_uid != os.getuid() or info.st_mode & 0o022):
                return None  # it holds code that runs: only the user's own
            data = handle.read()
        if not data.startswith(stamp):
            return None
        code = marshal.loads(memoryview(data)[len(stamp):])
    except (OSError, EOFError, ValueError, TypeError):
        return None
    return code if type(code) is _Code else None


def _write(where: str, data: bytes) -> None:
    temporary = f"{where}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(where), mode=0o700, exist_ok=True)
        with open(temporary, "wb") as handle:
            if hasattr(os, "fchmod"):
                os.fchmod(handle.fileno(), 0o600)
            handle.write(data)
        os.replace(temporary, where)
    except OSError:
        try:
            os.unlink(temporary)
        except OSError:
            pass


class Finder(FileFinder):
    """The path finder of one of tmpatch's directories: its sources come through :class:`Loader`,
    and the directories of the packages it finds get a finder like it."""

    def find_spec(self, fullname: str, target: Any = None) -> Any:
        spec = super().find_spec(fullname, target)
        for folder in (spec.submodule_search_locations or ()) if spec is not None else ():
            if isinstance(folder, str) and not isinstance(sys.path_importer_cache.get(folder), Finder):
                sys.path_importer_cache[folder] = finder(folder)
        return spec


def finder(folder: str) -> Finder:
    """A :class:`Finder` of ``folder`` with Python's own loaders but for sources."""
    return Finder(folder, (ExtensionFileLoader, EXTENSION_SUFFIXES), (Loader, SOURCE_SUFFIXES),
                  (SourcelessFileLoader, BYTECODE_SUFFIXES))


def install(folders: List[str]) -> None:
    """Put a :class:`Finder` on the directories of a package's ``__path__`` and on this module's
    (and, as they are found, on its subpackages'); where Python writes bytecode, nothing is done."""
    if not sys.dont_write_bytecode:
        return
    for folder in [*folders, os.path.dirname(os.path.abspath(__file__))]:
        if isinstance(folder, str) and os.path.isdir(folder):
            sys.path_importer_cache[folder] = finder(folder)
