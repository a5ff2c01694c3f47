"""A per-user disk cache of what ``apply()`` computes from the release's source files:
the fingerprints of functions and the compiled code of edited ones.

Reading and tokenizing the source of some hundred functions and compiling the edited
ones is most of what ``apply()`` costs; every process (each torchrun rank, each
DataLoader worker) would pay it again. An entry is keyed by the SHA-1 of the source
file's bytes, its path, the function's first line and name (and, for edited code, the
edits and helper names); the file that holds the entries is named after the Python
(``sys.implementation.cache_tag``, the bytecode magic) and a hash of tmpatch's code that
computes them. So an entry is used only where computing it again would give the same
value: a file that changes (even in place, keeping its size and time) is a miss in every
later process (within one process, a file's hash is kept while its size, time and inode
stay, as ``linecache`` keeps its lines).

Where: ``$XDG_CACHE_HOME/tmpatch`` (``~/.cache/tmpatch`` when the variable is unset or
not an absolute path: :func:`tmpatch.engine.bytecode.directory`, whose module keeps tmpatch's
own bytecode there where Python writes none). A cache file that is missing, unreadable, from another version,
corrupt (it carries a checksum), another user's or writable by others (it holds code
that runs) is a miss; one that cannot be written is not written. Neither is ever an
error: the values are computed as without a cache.
"""
from __future__ import annotations

import hashlib
import importlib.util
import io
import linecache
import logging
import marshal
import os
import sys
import threading
import tokenize
from typing import Any, Dict, Optional, Tuple

from tmpatch.engine.bytecode import directory

log = logging.getLogger("tmpatch")

#: the kinds of entry
FINGERPRINT = "fingerprint"
COMPILED = "compiled"
_KINDS = (FINGERPRINT, COMPILED)

#: the first bytes of a cache file; the format's version is part of them
_HEADER = b"tmpatch-cache-1\n"
#: at most this many entries are kept (a file shared by many installs of torchmetrics)
MAX_ENTRIES = 20000
#: tmpatch's modules whose code decides the values (their hash names the file)
_SOURCES = ("engine.fingerprint", "engine.rewrite", "spec", "engine.cache")

Key = Tuple[Any, ...]

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the tmpatch package

_lock = threading.RLock()
_entries: Optional[Dict[str, Dict[Key, Any]]] = None  # None: not read yet
_new: Dict[str, Dict[Key, Any]] = {kind: {} for kind in _KINDS}
_digests: Dict[str, Tuple[Tuple[int, int, int], str]] = {}  # path -> (its stat, the SHA-1 of its bytes)
_name: Optional[str] = None  # the file name ('' : no cache)


def _file_name() -> str:
    """``code-<cache tag>-<hash of tmpatch's code and the Python>.bin`` ('' if unknown)."""
    global _name
    if _name is None:
        try:
            digest = hashlib.sha1(importlib.util.MAGIC_NUMBER + sys.version.encode())
            for name in _SOURCES:
                module = sys.modules.get(f"tmpatch.{name}")
                path = getattr(module, "__file__", None) if module is not None else None
                if path is None:
                    path = os.path.join(_ROOT, *name.split(".")) + ".py"
                with open(path, "rb") as handle:
                    digest.update(handle.read())
            tag = sys.implementation.cache_tag or "python"
            _name = f"code-{tag}-{digest.hexdigest()[:16]}.bin"
        except (OSError, AttributeError) as exc:
            log.debug("tmpatch: no cache (%s)", exc)
            _name = ""
    return _name


def _path() -> str:
    name, folder = _file_name(), directory()
    return os.path.join(folder, name) if name and folder else ""


def _read(path: str) -> Dict[str, Dict[Key, Any]]:
    """The entries in the cache file (empty when there is none, or it is not sound)."""
    empty: Dict[str, Dict[Key, Any]] = {kind: {} for kind in _KINDS}
    if not path:
        return empty
    try:
        with open(path, "rb") as handle:
            info = os.fstat(handle.fileno())
            if hasattr(os, "getuid") and (info.st_uid != os.getuid() or info.st_mode & 0o022):
                log.debug("tmpatch: cache %s ignored (another user's, or writable by others)", path)
                return empty  # it holds code that runs: only the user's own
            data = handle.read()
    except OSError:
        return empty
    try:
        head, checksum, payload = data[:len(_HEADER)], data[len(_HEADER):len(_HEADER) + 20], data[len(_HEADER) + 20:]
        if head != _HEADER or hashlib.sha1(payload).digest() != checksum:
            raise ValueError("checksum")
        loaded = marshal.loads(payload)
        if not isinstance(loaded, dict) or set(loaded) != set(_KINDS):
            raise ValueError("layout")
        for kind in _KINDS:
            table = loaded[kind]
            if not isinstance(table, dict) or not all(isinstance(key, tuple) for key in table):
                raise ValueError("layout")
        if not all(isinstance(value, str) for value in loaded[FINGERPRINT].values()):
            raise ValueError("layout")
        if not all(isinstance(value, bytes) for value in loaded[COMPILED].values()):
            raise ValueError("layout")
        return loaded
    except Exception as exc:  # noqa: BLE001 - a corrupt cache is a miss, never an error
        log.debug("tmpatch: cache %s ignored (%s: %s)", path, type(exc).__name__, exc)
        return empty


def _table(kind: str) -> Dict[Key, Any]:
    global _entries
    if _entries is None:
        _entries = _read(_path())
    return _entries[kind]


def file_digest(path: str) -> Optional[str]:
    """The SHA-1 of the file's bytes (remembered while its size, time and inode stay), None if unreadable."""
    try:
        stat = os.stat(path)
        mark = (stat.st_mtime_ns, stat.st_size, stat.st_ino)
        known = _digests.get(path)
        if known is not None and known[0] == mark:
            return known[1]
        with open(path, "rb") as handle:
            data = handle.read()
            stat = os.fstat(handle.fileno())
    except OSError:
        return None
    digest = hashlib.sha1(data).hexdigest()
    if (stat.st_mtime_ns, stat.st_size, stat.st_ino) == mark:  # not rewritten while read
        _digests[path] = (mark, digest)
    return digest


def source_key(func: Any) -> Optional[Key]:
    """``(path, digest of the file, first line, qualname)`` of a plain function whose source
    file can be read; None otherwise (the function is then not cached)."""
    code: Any = getattr(func, "__code__", None)  # not None once its co_filename is a path
    path = getattr(code, "co_filename", None)
    if not isinstance(path, str) or not os.path.isabs(path) or not path.endswith(".py"):
        return None
    digest = file_digest(path)
    if digest is None:
        return None
    return (path, digest, code.co_firstlineno, getattr(func, "__qualname__", code.co_name))


#: path -> (digest, linecache's lines then): :func:`read_as_inspect` found them the same text
_agreed: Dict[str, Tuple[str, Any]] = {}


def read_as_inspect(path: str, digest: str) -> bool:
    """Whether the text ``inspect`` (through ``linecache``) holds for ``path`` is the file
    whose bytes have ``digest``: a value computed from that text may be stored under it
    (remembered while ``linecache`` keeps the same lines)."""
    lines = linecache.getlines(path)
    known = _agreed.get(path)
    if known is not None and known[0] == digest and known[1] is lines:
        return True
    try:
        with open(path, "rb") as handle:
            data = handle.read()
        if hashlib.sha1(data).hexdigest() != digest:
            return False
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        text = io.TextIOWrapper(io.BytesIO(data), encoding, line_buffering=True).read()
    except (OSError, SyntaxError, UnicodeDecodeError, LookupError):
        return False
    if "".join(lines) != text:
        return False
    _agreed[path] = (digest, lines)
    return True


def get(kind: str, key: Key) -> Any:
    """The value stored for ``key`` (None if none)."""
    with _lock:
        value = _new[kind].get(key)
        return value if value is not None else _table(kind).get(key)


def put(kind: str, key: Key, value: Any) -> None:
    """Store ``value`` (written by the next :func:`flush`)."""
    with _lock:
        _table(kind)
        _new[kind][key] = value


def flush() -> None:
    """Write the entries stored since the last flush (merged with the file's, which another
    process may have written since). Any error is ignored: the cache stays as it was."""
    global _entries
    with _lock:
        if not any(_new.values()):
            return
        path = _path()
        added = {kind: dict(table) for kind, table in _new.items()}
        for table in _new.values():
            table.clear()
        if not path:
            return
        merged = _read(path)
        stale = {p: digest for p, (_, digest) in _digests.items()}
        for kind in _KINDS:
            table = {key: value for key, value in merged[kind].items()
                     if stale.get(key[0], key[1]) == key[1]}  # entries of a file since changed go
            table.update(added[kind])
            if len(table) > MAX_ENTRIES:
                table = {key: value for key, value in table.items() if key[0] in stale}
            merged[kind] = table
        _entries = merged
        payload = marshal.dumps(merged)
        temporary = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
        try:
            os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
            with open(temporary, "wb") as handle:
                if hasattr(os, "fchmod"):
                    os.fchmod(handle.fileno(), 0o600)
                handle.write(_HEADER + hashlib.sha1(payload).digest() + payload)
            os.replace(temporary, path)
        except OSError as exc:
            log.debug("tmpatch: cache not written to %s (%s)", path, exc)
            try:
                os.unlink(temporary)
            except OSError:
                pass


def clear() -> None:
    """Forget what this process read of the cache and its unwritten entries (the next
    look-up reads the file again, from the directory the environment names then)."""
    global _entries, _name
    with _lock:
        _entries = None
        _name = None
        _digests.clear()
        _agreed.clear()
        for table in _new.values():
            table.clear()
