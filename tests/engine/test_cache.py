"""tmpatch.engine.cache: fingerprints and compiled edits kept on disk, keyed by the source file's
content; never a different result, never an error."""
from __future__ import annotations

import importlib
import os
import stat
import sys
import textwrap

import pytest

from tests.conftest import run_python
from tmpatch.engine import bytecode, cache, fingerprint as fingerprint_module, rewrite as rewrite_module
from tmpatch.engine.fingerprint import fingerprint, source_fingerprint
from tmpatch.engine.rewrite import rewrite
from tmpatch.spec import Edit

once = pytest.mark.once  # does not depend on the torchmetrics release

SOURCE = '''
def target(x, y=2):
    """Doc."""
    if x > 100:
        raise ValueError("too big")
    return x + y
'''


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """A cache directory of the test's own, and no memory of earlier look-ups."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    cache.clear()
    yield tmp_path / "xdg" / "tmpatch"
    cache.clear()


def _module(tmp_path, monkeypatch, source=SOURCE, name="cache_toy"):
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop(name, None)
    importlib.invalidate_caches()
    module = importlib.import_module(name)
    monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, name, module)  # the toy leaves with the test
    return module


def _forget() -> None:
    """What a new process knows: nothing in memory (the disk stays)."""
    cache.clear()
    fingerprint_module._memo.clear()
    rewrite_module._COMPILED.clear()


def _refuse(monkeypatch) -> None:
    """From now on, reading a source (tokenizing, compiling an edit) fails the test."""
    def refuse(*args, **kwargs):
        raise AssertionError("computed again: the cache was not used")

    monkeypatch.setattr(fingerprint_module, "tokens", refuse)
    monkeypatch.setattr(rewrite_module, "_compile", refuse)


@once
def test_a_second_process_reads_fingerprints_and_edited_code_from_disk(fresh, tmp_path, monkeypatch):
    module = _module(tmp_path, monkeypatch)
    edits = [Edit("if x > 100:\n    raise ValueError('too big')", "")]
    first = fingerprint(module.target)
    edited = rewrite(module.target, edits)
    assert first == source_fingerprint(SOURCE)
    cache.flush()
    assert [p.name for p in fresh.iterdir()] and all(p.suffix == ".bin" for p in fresh.iterdir())
    _forget()
    _refuse(monkeypatch)
    assert fingerprint(module.target) == first
    again = rewrite(module.target, edits)
    assert again(1000) == edited(1000) == 1002 and again.__code__.co_filename == module.target.__code__.co_filename
    assert again.__code__.co_firstlineno == module.target.__code__.co_firstlineno


@once
def test_a_file_changed_in_place_is_a_miss_even_with_the_same_size_and_time(fresh, tmp_path, monkeypatch):
    module = _module(tmp_path, monkeypatch)
    before = fingerprint(module.target)
    cache.flush()
    path = module.__file__
    times = os.stat(path)
    changed = SOURCE.replace("x + y", "x - y")  # same length
    with open(path, "w") as handle:
        handle.write(textwrap.dedent(changed))
    os.utime(path, ns=(times.st_atime_ns, times.st_mtime_ns))
    assert os.stat(path).st_size == times.st_size and os.stat(path).st_mtime_ns == times.st_mtime_ns
    _forget()
    import linecache

    linecache.clearcache()
    module = importlib.reload(module)
    after = fingerprint(module.target)
    assert after == source_fingerprint(changed) != before


@once
@pytest.mark.parametrize("damage", ["garbage", "truncated", "flipped", "empty"])
def test_a_corrupt_cache_file_is_ignored_and_replaced(fresh, tmp_path, monkeypatch, damage):
    module = _module(tmp_path, monkeypatch)
    expected = fingerprint(module.target)
    cache.flush()
    (path,) = fresh.iterdir()
    data = path.read_bytes()
    broken = {"garbage": b"\x00not a cache" * 10, "truncated": data[:len(data) // 2],
              "flipped": data[:-5] + bytes([data[-5] ^ 1]) + data[-4:], "empty": b""}[damage]
    path.write_bytes(broken)
    _forget()
    assert fingerprint(module.target) == expected  # computed again
    cache.flush()
    _forget()
    _refuse(monkeypatch)
    assert fingerprint(module.target) == expected  # and written again, soundly


@once
def test_an_unwritable_or_missing_home_is_never_an_error(tmp_path, monkeypatch):
    module = _module(tmp_path, monkeypatch)
    expected = source_fingerprint(SOURCE)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for place in (str(blocker), str(blocker / "below")):  # a file where the directory should be
        monkeypatch.setenv("XDG_CACHE_HOME", place)
        _forget()
        assert fingerprint(module.target) == expected
        cache.flush()
    if os.geteuid() != 0:  # root writes anywhere
        readonly = tmp_path / "readonly"
        readonly.mkdir()
        readonly.chmod(stat.S_IRUSR | stat.S_IXUSR)
        monkeypatch.setenv("XDG_CACHE_HOME", str(readonly))
        _forget()
        assert fingerprint(module.target) == expected
        cache.flush()
        readonly.chmod(stat.S_IRWXU)
    cache.clear()


@once
def test_the_directory_follows_xdg_cache_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert bytecode.directory() == str(tmp_path / "x" / "tmpatch")
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/path")  # not absolute: ignored, as the spec says
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert bytecode.directory() == str(tmp_path / "home" / ".cache" / "tmpatch")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert bytecode.directory() == str(tmp_path / "home" / ".cache" / "tmpatch")


@once
def test_functions_without_a_readable_file_are_not_cached(fresh):
    namespace = {}
    exec(compile("def made(x):\n    return x\n", "<made>", "exec"), namespace)
    assert cache.source_key(namespace["made"]) is None
    assert cache.source_key(len) is None


def test_apply_in_a_warm_process_reads_no_source_and_looks_through_sys_modules_once(tmp_path):
    """The whole catalogue on the installed torchmetrics: the second process computes no
    fingerprint, compiles no edit, and shares one index of sys.modules among its installs."""
    code = """
        import json, torch, torchmetrics
        from tmpatch.engine import fingerprint, references, rewrite
        counts = {"tokens": 0, "compile": 0, "index": 0}
        def counting(module, name, key):
            real = getattr(module, name)
            def counted(*args, **kwargs):
                counts[key] += 1
                return real(*args, **kwargs)
            setattr(module, name, counted)
        counting(fingerprint, "tokens", "tokens")
        counting(rewrite, "_compile", "compile")
        counting(references, "_Scan", "index")
        import tmpatch
        states = tmpatch.apply().states()
        print(json.dumps([counts, states]))
    """
    import json

    own = {"XDG_CACHE_HOME": str(tmp_path)}  # empty: the first process computes
    cold = json.loads(run_python(code, own).stdout.strip().splitlines()[-1])
    warm = json.loads(run_python(code, own).stdout.strip().splitlines()[-1])
    assert cold[1] == warm[1]
    assert cold[0]["tokens"] > 0 and cold[0]["compile"] > 0
    assert warm[0] == {"tokens": 0, "compile": 0, "index": 1}


def test_an_import_under_tmpatch_shares_one_index_across_its_hooks():
    """TMPATCH=1, then ``import torchmetrics``: the post-import hooks of that one import
    (one per target module) share one look through sys.modules."""
    code = """
        import json, sys, torch
        from tmpatch.engine import references
        made = []
        real = references._Index.__init__
        def counted(self, *args, **kwargs):
            made.append(1)
            real(self, *args, **kwargs)
        references._Index.__init__ = counted
        import tmpatch
        tmpatch.apply()
        before = len(made)
        import torchmetrics
        print(json.dumps([before, len(made), tmpatch.status().states()]))
    """
    import json

    before, after, states = json.loads(run_python(code).stdout.strip().splitlines()[-1])
    assert "applied" in states.values()
    assert after - before <= 2  # the import's hooks, and torchmetrics' own (its end)


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX permissions")
@once
def test_a_cache_file_others_can_write_is_not_read(fresh, tmp_path, monkeypatch):
    """The file holds code that runs: one that the group or others may write is ignored."""
    module = _module(tmp_path, monkeypatch)
    fingerprint(module.target)
    cache.flush()
    (path,) = fresh.iterdir()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    path.chmod(0o666)
    _forget()
    calls = []
    real = fingerprint_module.tokens
    monkeypatch.setattr(fingerprint_module, "tokens", lambda func: calls.append(func) or real(func))
    assert fingerprint(module.target) == source_fingerprint(SOURCE) and calls  # computed, not read
