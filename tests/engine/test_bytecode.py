"""tmpatch.engine.bytecode: where Python writes no bytecode, tmpatch's modules keep theirs in the
cache directory; an entry serves only the same file and Python, never another user's."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.once  # nothing here depends on the torchmetrics release

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

#: imports a module of tmpatch and says where its code came from
PROBE = ("import sys, tmpatch, tmpatch.control.selection as m; "
         "print(type(m.__loader__).__name__, getattr(m, 'MARK', '-'), sys.dont_write_bytecode)")


@pytest.fixture
def checkout(tmp_path):
    """A copy of tmpatch without __pycache__, and a cache directory of its own."""
    shutil.copytree(os.path.join(ROOT, "tmpatch"), tmp_path / "tree" / "tmpatch",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return tmp_path


def _run(home, *flags, code=PROBE):
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith("TMPATCH") and k not in ("PYTHONDONTWRITEBYTECODE", "PYTHONPATH")}
    environ.update(PYTHONPATH=str(home / "tree"), XDG_CACHE_HOME=str(home / "cache"))
    done = subprocess.run([sys.executable, *flags, "-c", code], env=environ, cwd=str(home), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def _entries(home):
    folder = home / "cache" / "tmpatch" / f"bytecode-{sys.implementation.cache_tag}"
    return sorted(folder.iterdir()) if folder.is_dir() else []


def _entry(home, module):
    found = [path for path in _entries(home) if path.name.startswith(module + ".")]
    assert len(found) == 1, found
    return found[0]


def _swap(home, module, code):
    """Put ``code``'s bytecode in the module's entry, its stamp kept (shows the entry is what runs)."""
    import marshal

    path = _entry(home, module)
    data = path.read_bytes()
    stamp = data[:data.index(b"\n", data.index(os.fsencode(str(home / "tree"))) + 1) + 1]
    path.write_bytes(stamp + marshal.dumps(compile(code, "x.py", "exec")))


def test_without_bytecode_files_the_modules_come_from_the_cache(checkout):
    assert _run(checkout, "-B") == ["Loader", "-", "True"]
    assert _entries(checkout) and not list((checkout / "tree").rglob("__pycache__"))
    _swap(checkout, "tmpatch.control.selection", "MARK = 'cached'")
    assert _run(checkout, "-B") == ["Loader", "cached", "True"]  # read, not compiled


def test_an_entry_serves_only_its_file_as_it_is(checkout):
    _run(checkout, "-B")
    _swap(checkout, "tmpatch.control.selection", "MARK = 'cached'")
    source = checkout / "tree" / "tmpatch" / "control" / "selection.py"
    source.write_text(source.read_text() + "\n# changed\n")
    assert _run(checkout, "-B") == ["Loader", "-", "True"]  # compiled again, and written
    assert _run(checkout, "-B") == ["Loader", "-", "True"]


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX permissions")
def test_an_entry_others_can_write_is_not_used(checkout):
    _run(checkout, "-B")
    _swap(checkout, "tmpatch.control.selection", "MARK = 'cached'")
    _entry(checkout, "tmpatch.control.selection").chmod(0o666)
    assert _run(checkout, "-B") == ["Loader", "-", "True"]


def test_a_corrupt_entry_is_compiled_again(checkout):
    _run(checkout, "-B")
    path = _entry(checkout, "tmpatch.control.selection")
    path.write_bytes(path.read_bytes()[:-40])
    assert _run(checkout, "-B") == ["Loader", "-", "True"]


def test_an_unwritable_cache_is_no_error(checkout):
    (checkout / "cache").mkdir()
    (checkout / "cache" / "tmpatch").write_text("not a directory")
    assert _run(checkout, "-B") == ["Loader", "-", "True"]


def test_where_python_writes_bytecode_nothing_changes(checkout):
    assert _run(checkout) == ["SourceFileLoader", "-", "False"]
    assert _entries(checkout) == [] and list((checkout / "tree").rglob("__pycache__"))
