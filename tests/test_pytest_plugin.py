"""The pytest plugin, run in-process with ``pytester``: options, ini, fixtures,
marker, no_sync; after each run nothing of tmpatch is left behind."""
from __future__ import annotations

import os
import re
import sys

import pytest
import torchmetrics  # noqa: E402  (imported once: pytester drops modules first imported in a run)
import wrapt

import tmpatch
import tmpatch.pytest_plugin  # noqa: F401  (imported once, outside the inner runs)
from tests.conftest import lazily_imported_patches
from tmpatch.patches import NAMES

pytestmark = pytest.mark.once  # nothing here depends on the torchmetrics release

try:
    import tmpatch.audit  # noqa: F401

    AUDIT = hasattr(tmpatch.audit, "no_sync")
except ImportError:
    AUDIT = False

pytest_plugins = ["pytester"]

ACTIVE = ("applied", "pending")


@pytest.fixture
def run(pytester, pytestconfig):
    """``run(test_source, *args)``: the inner session's result, plugin loaded."""
    # with tmpatch installed the entry point loads the plugin; otherwise name it
    args = [] if pytestconfig.pluginmanager.has_plugin("tmpatch") else ["-p", "tmpatch.pytest_plugin"]

    def run_inner(source: str, *extra: str, ini: str = ""):
        if ini:
            pytester.makeini(ini)
        pytester.makepyfile(test_inner=source)
        # hypothesis's plugin costs seconds per inner session (its terminal summary)
        result = pytester.runpytest(*args, "-p", "no:cacheprovider", "-p", "no:hypothesispytest", *extra,
                                    plugins=[_KeepModules()])
        assert_nothing_left()
        return result

    return run_inner


#: the modules an inner session had imported, put back after pytester's clean-up (:func:`_modules_survive`)
_IMPORTED: dict = {}


class _KeepModules:
    """Records the modules an inner session imported: pytester drops them after the run and
    again at its own teardown, and torch cannot import a module twice in one process (a second
    ``torch._inductor.test_operators`` registers its operator library again and raises), so a
    later test of this process would fail for a reason of the harness."""

    def pytest_unconfigure(self) -> None:
        _IMPORTED.update(sys.modules)


@pytest.fixture(autouse=True)
def _modules_survive():
    """Set up before ``pytester``, torn down after it: puts back what the inner sessions imported
    (all but their own test files)."""
    yield
    for name, module in _IMPORTED.items():
        if name not in sys.modules and module is not None and not name.startswith(("test_inner", "conftest")):
            sys.modules[name] = module
    _IMPORTED.clear()


def assert_nothing_left() -> None:
    """No patch applied or armed, no hook of tmpatch in wrapt's registry, no
    tmpatch wrapper in any torchmetrics module."""
    states = tmpatch.status().states()
    assert not set(states.values()) & set(ACTIVE), states
    registry = getattr(wrapt.importer, "_post_import_hooks", {})
    hooks = [(name, hook) for name, hooks in registry.items() for hook in (hooks or ())
             if getattr(hook, "__module__", "").startswith("tmpatch")]
    assert hooks == []
    for name, module in list(sys.modules.items()):
        if name.split(".")[0] != "torchmetrics" or module is None:
            continue
        for attr, value in list(vars(module).items()):
            assert not (isinstance(value, wrapt.ObjectProxy) and getattr(value, "_self_tmpatch_key", None)), \
                f"{name}.{attr} is still tmpatch's wrapper"


SESSION_TEST = """
import tmpatch

def test_patched_for_the_whole_run():
    states = tmpatch.status().states()
    print("STATES", states)
    assert states["safe_divide"] in ("applied", "not-needed")
    assert states["cumsum_device"] in ({expected_cumsum})
"""


@pytest.mark.parametrize("how", ["option", "ini"])
def test_whole_run(run, how):
    source = SESSION_TEST.format(expected_cumsum="'applied', 'not-needed'")
    if how == "option":
        result = run(source, "--tmpatch")
    else:
        result = run(source, ini="[pytest]\ntmpatch = true\n")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([f"tmpatch: whole run, torchmetrics {torchmetrics.__version__}", "  applied (*): *"])


def test_whole_run_with_a_selection(run):
    result = run(SESSION_TEST.format(expected_cumsum="'excluded',"), "--tmpatch-patches=safe_divide,gather_autograd")
    result.assert_outcomes(passed=1)


HEADER_TEST = """
import tmpatch

def test_states():
    print("SEEN", ", ".join(f"{row.name} {row.state}" for row in tmpatch.status()))
"""


def test_the_header_shows_what_applies(pytester, pytestconfig, monkeypatch):
    """Not ``pending`` for every patch while the tests see ``applied``: in a
    fresh process (torchmetrics not imported yet) the plugin imports it at
    start, and the header has the states the tests see."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(os.path.abspath(p) for p in sys.path if p and os.path.isdir(p)))
    pytester.makepyfile(test_inner=HEADER_TEST)
    plugin = [] if pytestconfig.pluginmanager.has_plugin("tmpatch") else ["-p", "tmpatch.pytest_plugin"]
    result = pytester.runpytest_subprocess(*plugin, "-p", "no:cacheprovider", "-p", "no:hypothesispytest",
                                           "--tmpatch", "-s", "--tmpatch-exclude=gather_autograd")
    result.assert_outcomes(passed=1)
    start = result.outlines.index(f"tmpatch: whole run, torchmetrics {torchmetrics.__version__}")
    header = []
    for line in result.outlines[start + 1:]:
        if not line.startswith("  "):
            break
        header.append(line)
    assert header and all(len(line) <= 100 for line in header), header  # a few short lines
    seen = [line.split("SEEN ", 1)[1] for line in result.outlines if "SEEN " in line]
    assert len(seen) == 1, result.outlines
    groups = {}
    for group in re.split(r"\n  (?! )", "\n".join(header).strip()):
        label, names = " ".join(group.split()).split(": ", 1)
        state, count = re.fullmatch(r"(\S+) \((\d+)[,)].*", label).groups()
        groups[state] = names.split(", ")
        assert int(count) == len(groups[state])
    assert {f"{name} {state}" for state, names in groups.items() for name in names} == set(seen[0].split(", "))
    assert set(groups.get("pending", ())) <= lazily_imported_patches() and groups["excluded"] == ["gather_autograd"]
    pending = [line for line in header if line.lstrip().startswith("pending")]
    assert all("until their modules are imported" in line for line in pending)


def test_unknown_option_values_fail_the_run_with_a_usage_error(run):
    result = run("def test_never(): pass\n", "--tmpatch", "--tmpatch-exclude=safe_divide,nope")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--tmpatch-exclude: unknown patch name(s) 'nope'; valid names: "
                                 + ", ".join(NAMES) + "*"])


EXACT_TESTS = """
import pytest
import tmpatch as api
from tmpatch.runtime import policies
from torchmetrics import aggregation
from torchmetrics.utilities import data

SESSION = {session}
BUILT = aggregation.MeanMetric()  # built at collection: holds the update it finds then
SEEN = {{}}

def snapshot():
    return (api.status().states(), dict(policies.current), vars(aggregation.MeanMetric)["update"],
            vars(data)["_bincount"])

def test_0_record():
    SEEN["before"] = snapshot()
    if SESSION:
        assert api.is_patched(vars(aggregation.MeanMetric)["update"])

def active():
    return {{name for name, state in api.status().states().items() if state in ("applied", "pending")}}

@pytest.mark.tmpatch(patches=["nan_check"], nan_check="eager")
def test_1_exactly_the_marker(tmpatch):
    assert active() == {{"deferred_reports", "nan_check"}}  # nan_check requires deferred_reports
    assert api.status()["bincount"].state == "excluded" and api.status()["mean_default_weight"].state == "excluded"
    assert policies.current["nan_check"] == "eager"

def test_2_back():
    check_back("nan_check")

@pytest.mark.tmpatch(exclude=["bincount", "nan_check"], bincount="eager")
def test_3_marker_excludes(tmpatch):
    assert "bincount" not in active() and "nan_check" not in active() and "mean_default_weight" in active()
    assert policies.current["bincount"] == "eager"

def test_4_back():
    check_back("mean_default_weight")

@pytest.mark.tmpatch(patches=[])
def test_5_marker_none(tmpatch):
    assert active() == set()

def test_6_back():
    check_back()

def check_back(*applied_by_the_test):
    states, policies, update, bincount = snapshot()
    before = SEEN["before"]
    assert (policies, update, bincount) == before[1:]  # the same objects: wrappers are reused
    for name, state in states.items():
        was = before[0][name]
        if name in applied_by_the_test and not SESSION:
            assert state == "reverted", (name, state)
        elif was in ("off", "reverted"):  # not in effect: either word
            assert state in ("off", "reverted"), (name, state, was)
        else:
            assert state == was, (name, state, was)
    if SESSION:
        assert api.is_patched(update)
    assert BUILT(2.0).item() == 2.0
"""


@pytest.mark.parametrize("session", [False, True], ids=["fixture-only", "with---tmpatch"])
def test_a_marker_gives_exactly_its_selection_and_the_state_comes_back(run, session):
    result = run(EXACT_TESTS.format(session=session), *(["--tmpatch"] if session else []))
    result.assert_outcomes(passed=7)


def test_a_failing_strict_marker_restores_the_run(run, monkeypatch):
    source = """
import pytest
import tmpatch as api
from tmpatch.runtime import policies

def test_0():
    global BEFORE
    BEFORE = (api.status(), dict(policies.current))

@pytest.mark.tmpatch(patches=["safe_divide"], strict=True, nan_check="off")
def test_1(tmpatch):
    pass

def test_2():
    assert (api.status(), dict(policies.current)) == BEFORE
"""
    from torchmetrics.utilities import compute

    monkeypatch.setattr(compute, "_safe_divide", lambda num, denom: num / denom)  # not a release's code
    result = run(source, "--tmpatch")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(["*TmpatchError*safe_divide (mismatch*"])


FIXTURE_TESTS = """
import pytest
import tmpatch as api

SESSION = {session!r}  # the states --tmpatch gives, or None without it

def back_to_session(name):
    # what --tmpatch applied is still applied; nothing else is
    state = api.status()[name].state
    if SESSION is not None and SESSION[name] in ("applied", "pending"):
        return state == SESSION[name]
    return state not in ("applied", "pending")

def test_1_fixture(tmpatch):  # no marker: every patch
    assert tmpatch["safe_divide"].state in ("applied", "not-needed")
    assert api.status()["safe_divide"].state == tmpatch["safe_divide"].state

def test_2_after_the_fixture():
    assert all(back_to_session(name) for name in SESSION or ("safe_divide", "cumsum_device"))

@pytest.mark.tmpatch(patches=["safe_divide"])
def test_3_marker_chooses(tmpatch):
    assert tmpatch["safe_divide"].state in ("applied", "not-needed")
    if SESSION is None:
        assert tmpatch["cumsum_device"].state == "excluded"

@pytest.mark.tmpatch("cumsum_device", exclude=["safe_divide"])
def test_4_marker_alone_gets_the_fixture():
    assert api.status()["cumsum_device"].state in ("applied", "not-needed")
    if SESSION is None:
        assert api.status()["safe_divide"].state == "excluded"

def test_5_after_the_marker():
    assert back_to_session("safe_divide") and back_to_session("cumsum_device")

@pytest.mark.tmpatch(patches=["safe_divid"])
def test_6_bad_marker(tmpatch):
    pass

@pytest.mark.tmpatch(pathces=["safe_divide"])
def test_7_bad_keyword(tmpatch):
    pass
"""


@pytest.mark.parametrize("session", [False, True], ids=["fixture-only", "with---tmpatch"])
def test_fixture_and_marker_revert_only_what_they_applied(run, session):
    states = None
    if session:  # what --tmpatch gives on this release (then the state as it was: no hook left armed)
        from tmpatch.control import session as process

        before = process.snapshot()
        states = tmpatch.apply().states()
        process.restore(before)
    result = run(FIXTURE_TESTS.format(session=states), *(["--tmpatch"] if session else []))
    result.assert_outcomes(passed=5, errors=2)
    result.stdout.fnmatch_lines([
        "*ERROR at setup of test_6_bad_marker*",
        "@pytest.mark.tmpatch(patches=...): unknown patch name(s) 'safe_divid' (did you mean 'safe_divide'?); "
        "valid names: " + ", ".join(NAMES),
        "*ERROR at setup of test_7_bad_keyword*",
        "@pytest.mark.tmpatch: unknown keyword(s) pathces (did you mean patches?); valid: patches, exclude, "
        "strict, nan_check, bincount, checks, update_count",
    ])
    assert "During handling" not in result.stdout.str()


NO_SYNC_TESTS = """
import pytest
import torch

@pytest.fixture
def host_value():
    return torch.ones(2).sum().item()  # not in the body: allowed

def test_no_sync_passes(host_value, no_sync):
    x = torch.zeros(3, device=no_sync.device)
    y = (x + 1) * 2
    assert y.device.type == "cuda"

def test_no_sync_fails_on_a_sync(no_sync):
    x = torch.zeros(3, device=no_sync.device)
    if (x > 0).any():
        pass
"""


@pytest.mark.skipif(not AUDIT, reason="tmpatch.audit.no_sync is not available")
def test_no_sync_fails_the_test_on_a_sync_in_its_body(run):
    result = run(NO_SYNC_TESTS)
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*SyncError*", "*FAILED*test_no_sync_fails_on_a_sync*"])
    fake_mode = torch_fake_mode()
    assert fake_mode is None, "the simulated CUDA mode was left active"


def torch_fake_mode():
    import torch
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    if hasattr(torch._C, "_get_dispatch_mode"):  # torch >= 2.2: the fake mode has its own slot
        return torch._C._get_dispatch_mode(torch._C._TorchDispatchModeKey.FAKE)
    return next((m for m in _get_current_dispatch_mode_stack() if type(m).__name__ == "FakeTensorMode"), None)


def test_no_sync_skips_when_the_audit_is_not_available(run, pytester):
    pytester.makeconftest("import sys\nsys.modules['tmpatch.audit'] = None\n")
    result = run("def test_body(no_sync):\n    raise AssertionError('must not run')\n", "-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*no_sync needs tmpatch.audit.no_sync*"])
