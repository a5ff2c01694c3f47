"""The pytest plugin, run in-process with ``pytester``: options, ini, fixtures,
marker, no_sync; after each run nothing of tmpatch is left behind."""
from __future__ import annotations

import sys

import pytest
import wrapt

import tmpatch
import tmpatch.pytest_plugin  # noqa: F401  (imported once, outside the inner runs)
from tmpatch.patches import NAMES

import torchmetrics  # noqa: E402  (imported once: pytester drops modules first imported in a run)

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
        result = pytester.runpytest(*args, "-p", "no:cacheprovider", "-p", "no:hypothesispytest", *extra)
        assert_nothing_left()
        return result

    return run_inner


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
    result.stdout.fnmatch_lines([f"tmpatch (whole run, torchmetrics {torchmetrics.__version__}): safe_divide *"])


def test_whole_run_with_a_selection(run):
    result = run(SESSION_TEST.format(expected_cumsum="'excluded',"), "--tmpatch-patches=safe_divide,gather_autograd")
    result.assert_outcomes(passed=1)


def test_unknown_option_values_fail_the_run_with_a_usage_error(run):
    result = run("def test_never(): pass\n", "--tmpatch", "--tmpatch-exclude=safe_divide,nope")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--tmpatch-exclude: unknown patch name(s) 'nope'; valid names: "
                                 + ", ".join(NAMES) + "*"])


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
    if session:  # what --tmpatch gives on this release
        states = tmpatch.apply().states()
        tmpatch.revert()
    result = run(FIXTURE_TESTS.format(session=states), *(["--tmpatch"] if session else []))
    result.assert_outcomes(passed=5, errors=2)
    result.stdout.fnmatch_lines([
        "*ERROR at setup of test_6_bad_marker*",
        "@pytest.mark.tmpatch(patches=...): unknown patch name(s) 'safe_divid'; valid names: "
        + ", ".join(NAMES),
        "*ERROR at setup of test_7_bad_keyword*",
        "@pytest.mark.tmpatch: unknown keyword(s) pathces; valid: patches, exclude, strict",
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
