"""Shared test set-up: every test starts and ends with tmpatch reverted."""
from __future__ import annotations

import atexit
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from typing import Dict, List, Optional, Tuple

import pytest

import tmpatch
from tmpatch.runtime import deferred, host
from tmpatch.runtime.deferred import books as deferred_books, landing as deferred_landing

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: the suite's own disk cache (tmpatch/engine/cache.py), for the processes it starts too: never the user's
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="tmpatch-tests-cache-")
atexit.register(shutil.rmtree, os.environ["XDG_CACHE_HOME"], True)

#: a factor on every hypothesis test's example count (``TMPATCH_TEST_EXAMPLES``; the matrix
#: gives its anchor releases the full count and the releases between them a tenth)
EXAMPLES = float(os.environ.get("TMPATCH_TEST_EXAMPLES", "1") or 1)


def examples(count: int) -> int:
    """``count`` hypothesis examples, scaled by ``TMPATCH_TEST_EXAMPLES`` (never below 3)."""
    return max(3, round(count * EXAMPLES))


#: ``TMPATCH_HYPOTHESIS=explore`` searches with fresh draws and keeps what it finds in a database
#: (``TMPATCH_HYPOTHESIS_DB``, default hypothesis' own ``.hypothesis``); anything else, CI included,
#: draws the same examples at every run and reads and writes no database: a run's outcome depends
#: on the code alone, never on what an earlier run happened to find
EXPLORE = os.environ.get("TMPATCH_HYPOTHESIS", "").strip().lower() == "explore"

try:  # tests without their own count: hypothesis' default 100, scaled the same way
    from hypothesis import settings as _hypothesis_settings
    from hypothesis.database import DirectoryBasedExampleDatabase

    if EXPLORE:
        _hypothesis_settings.register_profile(
            "tmpatch", max_examples=examples(100), derandomize=False, print_blob=True,
            database=DirectoryBasedExampleDatabase(os.environ.get("TMPATCH_HYPOTHESIS_DB") or ".hypothesis"))
    else:
        _hypothesis_settings.register_profile("tmpatch", max_examples=examples(100), derandomize=True,
                                              database=None, print_blob=True)
    _hypothesis_settings.load_profile("tmpatch")
except ImportError:  # the test extras are not installed: the suite says so when it imports hypothesis
    pass


def _matrix_repeat() -> bool:
    """Whether this is a matrix run of a torch whose first release has run already."""
    return bool(os.environ.get("TMPATCH_TEST_RELEASE")) and os.environ.get("TMPATCH_TEST_TORCH_FIRST") == "0"


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "once: does not depend on the torchmetrics release; the matrix runs it with the first "
                   "release of each torch only")
    config.addinivalue_line(
        "markers", "processes: runs real child processes (exit, fork, spawn, DataLoader workers); the matrix "
                   "leaves it out where a release runs only the tests of what changed there "
                   "(TMPATCH_TEST_PROCESSES=0)")


def pytest_collection_modifyitems(config, items):
    left_out = ["once"] if _matrix_repeat() else []
    if os.environ.get("TMPATCH_TEST_PROCESSES") == "0":
        left_out.append("processes")
    if not left_out:
        return
    kept = [item for item in items if not any(item.get_closest_marker(name) for name in left_out)]
    if len(kept) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if item not in kept])
        items[:] = kept


def torchmetrics_release():
    """The release under test, as a ``packaging`` Version."""
    import torchmetrics
    from packaging.version import Version

    return Version(torchmetrics.__version__)


def release_in(spec: str) -> bool:
    """Whether the release under test satisfies the specifier ``spec``."""
    from packaging.specifiers import SpecifierSet

    return torchmetrics_release() in SpecifierSet(spec, prereleases=True)


def torch_at_least(major: int, minor: int) -> bool:
    """Whether the torch under test is ``major.minor`` or later."""
    import torch

    return tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) >= (major, minor)


def run_python(code: str, env: Optional[dict] = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter with this one's path; fail loudly on error."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))
    full_env.update(env or {})
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout,
    )
    if proc.returncode != 0:
        raise AssertionError(f"child failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


#: the library's rule of where a patch keeps the release's plain statements (tmpatch.runtime.host)
_HOST_RULES = (host.on_host, host.host_device)


def _never(obj: object) -> bool:
    return False


def cpu_shortcuts(on: bool) -> None:
    """``True``: the patches keep their CPU shortcuts (the library's rule). ``False``: they run
    the path a GPU takes on the CPU too (tmpatch.runtime.host answers "not the host's")."""
    host.on_host, host.host_device = _HOST_RULES if on else (_never, _never)


@pytest.fixture(autouse=True)
def _reverted():
    """Leave nothing of tmpatch behind a test (its CPU shortcuts back on)."""
    tmpatch.revert()
    yield
    tmpatch.revert()
    cpu_shortcuts(True)


class Landing:
    """A device's timing played on the CPU (tmpatch.runtime.deferred.landing): evidence is not
    read at once but goes to the host in flights, whose copies land when :meth:`land` says."""

    class Event:
        def __init__(self) -> None:
            self.done = False

        def query(self) -> bool:
            return self.done

    def __init__(self) -> None:
        self.events: List["Landing.Event"] = []

    def new_event(self, device) -> "Landing.Event":
        event = Landing.Event()
        self.events.append(event)
        return event

    def land(self) -> int:
        """Every copy made so far has landed; how many there were."""
        for event in self.events:
            event.done = True
        return len(self.events)


def _forget_reports() -> None:
    """Empty every book without a report: what a test left pending is not given in a later one."""
    for book in list(deferred_books._books.values()):
        book.pending, book.steps, book.counts, book.synced, book.flight = [], [], {}, None, None
        book.pinned = book.noted = 0
        book.marked = book.traced_marked
    deferred.WATCH.clear()


@pytest.fixture
def device_timing(monkeypatch):
    """Reports come as on a GPU: the patches take their device paths (every counting update notes
    its evidence), which flies to the host every ``LANDING`` entries and is reported at the first
    update after its copy lands (:meth:`Landing.land`)."""
    cpu_shortcuts(False)
    landing = Landing()
    monkeypatch.setattr(deferred_landing, "read_at_once", lambda tensor: False)
    monkeypatch.setattr(deferred_landing, "new_event", landing.new_event)
    yield landing
    _forget_reports()


def _never_read(tensor) -> bool:
    return False


def _never_lands(device):
    return deferred_landing.NEVER


def hold_reports() -> None:
    """For the rest of the process (a child's, a DDP rank's): reports wait for a settle point,
    as on a GPU whose copy has not landed (:func:`held_reports`)."""
    deferred_landing.read_at_once, deferred_landing.new_event = _never_read, _never_lands


@pytest.fixture
def held_reports(monkeypatch):
    """Reports wait for a settle point (``compute()``, ``reset()``, ...), as on a GPU whose copy
    has not landed yet: the timing the tests of the settle points are written for."""
    monkeypatch.setattr(deferred_landing, "read_at_once", _never_read)
    monkeypatch.setattr(deferred_landing, "new_event", _never_lands)
    yield
    _forget_reports()


@pytest.fixture
def on_a_device(held_reports):
    """The path a GPU takes (on the CPU the release's own check runs), reports waiting for a
    settle point as on a GPU whose copy has not landed."""
    cpu_shortcuts(False)
    yield
    cpu_shortcuts(True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Below the audit's torch floor a test that reaches the audit is skipped, saying why (the
    audit's own ImportError), not failed: the patches run there, their sync checks cannot."""
    outcome = yield
    report = outcome.get_result()
    if call.excinfo is None or not report.failed or not call.excinfo.errisinstance(ImportError):
        return
    from tmpatch.audit import support

    problem = support.problem()
    if problem is not None and str(call.excinfo.value) == problem:
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1] or 0, f"Skipped: {problem.split(':')[0]}")


def pytest_report_header(config):
    expected = os.environ.get("TMPATCH_TEST_RELEASE")
    try:
        release = str(torchmetrics_release())
    except ImportError:
        release = "not installed"
    if expected and release != expected:
        raise pytest.UsageError(f"expected torchmetrics {expected} on the path, found {release}")
    return f"torchmetrics {release}"


def assert_bitwise(patched, original) -> None:
    """Same dtype, shape, device and bits (NaN payloads and -0.0 included)."""
    import torch

    assert patched.dtype == original.dtype, (patched.dtype, original.dtype)
    assert patched.shape == original.shape, (patched.shape, original.shape)
    assert patched.device == original.device
    as_int = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32,
              torch.float64: torch.int64}
    if patched.dtype in as_int:
        patched, original = patched.view(as_int[patched.dtype]), original.view(as_int[original.dtype])
    assert torch.equal(patched, original), (patched, original)


class CallTrace:
    """Records calls into functions defined in one source file (a profiler hook)."""

    def __init__(self, suffix: str) -> None:
        self.suffix = suffix
        self.calls = []

    def __enter__(self) -> "CallTrace":
        def profile(frame, event, arg):
            if event == "call" and frame.f_code.co_filename.endswith(self.suffix):
                self.calls.append(frame.f_code.co_name)

        self._previous = sys.getprofile()
        sys.setprofile(profile)
        return self

    def __exit__(self, *exc) -> None:
        sys.setprofile(self._previous)


_LAZY: Optional[frozenset] = None


def lazily_imported_patches() -> frozenset:
    """The patches with a target in a module that a fresh ``import torchmetrics`` leaves
    unimported (segmentation, for one): they stay ``pending`` until the user imports it."""
    global _LAZY
    if _LAZY is None:
        proc = run_python("""
            import torchmetrics, tmpatch
            print(",".join(n for n, state in tmpatch.apply().states().items() if state == "pending"))
        """)
        _LAZY = frozenset(filter(None, proc.stdout.strip().split(",")))
    return _LAZY


# --- other Pythons, for fingerprints (tests/engine/test_fingerprint.py, tests/control/test_api.py) -----------------

_FINGERPRINT_FILE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tmpatch", "engine",
                                 "fingerprint.py")
_FINGERPRINT_CHILD = ("import importlib.util, json, sys\n"
                      "spec = importlib.util.spec_from_file_location('fp', sys.argv[1])\n"
                      "fp = importlib.util.module_from_spec(spec); spec.loader.exec_module(fp)\n"
                      "print(json.dumps([fp.source_fingerprint(s) for s in json.load(sys.stdin)]))\n")


def _other_pythons() -> List[str]:
    """Interpreters of Python 3.12 or newer (whose tokenizer splits f-strings), one per version:
    ``TMPATCH_TEST_OTHER_PYTHONS`` (os.pathsep-separated), else ``python3.N`` on the PATH and
    pyenv's versions."""
    named = os.environ.get("TMPATCH_TEST_OTHER_PYTHONS")
    if named is not None:
        candidates = [p for p in named.split(os.pathsep) if p]
    else:
        candidates = [shutil.which(f"python3.{n}") or "" for n in range(12, 16)]
        candidates += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[2-9]*/bin/python3")))
    found: Dict[Tuple[int, int], str] = {}
    for exe in filter(None, candidates):
        try:
            done = subprocess.run([exe, "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True,
                                  text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            continue
        parts = done.stdout.split()
        if done.returncode == 0 and len(parts) == 2 and (int(parts[0]), int(parts[1])) >= (3, 12):
            found.setdefault((int(parts[0]), int(parts[1])), exe)
    return [found[v] for v in sorted(found)]


@pytest.fixture(scope="session")
def other_pythons() -> List[str]:
    found = _other_pythons()
    if not found:
        pytest.skip("no Python 3.12 or newer here to compare fingerprints with")
    return found


def fingerprints_under(python: str, sources: List[str]) -> List[str]:
    """``source_fingerprint`` of each source, computed by another Python (tmpatch/engine/fingerprint.py
    alone: it needs neither torch nor the package)."""
    done = subprocess.run([python, "-c", _FINGERPRINT_CHILD, _FINGERPRINT_FILE], input=json.dumps(sources),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """For the engine's tests: a package ``toypkg`` with a defining module and two importers on disk."""
    pkg = tmp_path / "toypkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "core.py").write_text(textwrap.dedent('''
        def target(x):
            return x * 2

        class Thing:
            def method(self, x):
                return x * 3
    '''))
    (pkg / "user.py").write_text(textwrap.dedent('''
        from toypkg.core import target

        def call(x, fn=target):
            return fn(x)

        def call_kw(x, *, fn=target):
            return fn(x)

        class Runner:
            def run(self, x, fn=target):
                return fn(x)
    '''))
    (pkg / "late.py").write_text("from toypkg.core import target\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield pkg
    for name in [n for n in sys.modules if n == "toypkg" or n.startswith("toypkg.")]:
        del sys.modules[name]



# --- an edited release: a copy of this torchmetrics with one function's code changed -------------------------------

def edited_release(folder: str, edits: Dict[str, str]) -> str:
    """A copy of the torchmetrics imported here in ``folder`` (returned: put it first on the path of a
    child process), with a statement put first in the body of each function named in ``edits``
    (``"module:qualname" -> statement``): code tmpatch has not seen, as a release yet to come may have."""
    import ast

    import torchmetrics

    package = os.path.join(folder, "torchmetrics")
    shutil.copytree(os.path.dirname(torchmetrics.__file__), package,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for where, statement in edits.items():
        module, qualname = where.split(":")
        path = os.path.join(folder, *module.split(".")) + ".py"
        with open(path, encoding="utf-8") as handle:
            lines = handle.read().splitlines(keepends=True)
        body = ast.parse("".join(lines)).body
        for part in qualname.split("."):
            node = next(n for n in body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == part)
            body = node.body
        first = body[1] if isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
            and len(body) > 1 else body[0]  # after the docstring
        lines.insert(first.lineno - 1, " " * first.col_offset + statement + "\n")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write("".join(lines))
    return folder
