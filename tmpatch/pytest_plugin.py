"""pytest plugin (entry point ``pytest11``, name ``tmpatch``).

* ``pytest --tmpatch`` (or ``tmpatch = true`` in the ini file): the whole run
  is patched; ``--tmpatch-patches``/``--tmpatch-exclude`` choose (and imply
  ``--tmpatch``). Unknown names fail the run with a usage error. torchmetrics
  is imported at start so that the header shows what applies.
* fixture ``tmpatch``: applies for one test, yields the
  :class:`tmpatch.Report`, restores the state before afterwards.
  ``@pytest.mark.tmpatch(patches=[...], exclude=[...], strict=False (or names),
  nan_check=..., bincount=...)`` chooses (a marked test gets the fixture
  without asking): the test sees exactly that selection, also under
  ``--tmpatch`` (the run's patches outside it are reverted for the test), and
  those policies.
* fixture ``no_sync``: the test fails on the first host-device sync in its
  body (the test function itself, not the fixtures), with
  :func:`tmpatch.audit.no_sync`; skipped where that is not available.

After the fixture the same patches are in effect as before (the same wrapper
objects: metrics built earlier stay patched), with the same policies; each row
of ``status()`` says what it said before, except that rows of patches not in
effect may read ``off``, ``reverted`` or ``excluded`` differently (``reverted``
if the test applied the patch). Nothing else of tmpatch is left (no wrapper,
no armed import hook). Loading the plugin imports nothing
but pytest; tmpatch itself is imported when an option or fixture is used.
"""
from __future__ import annotations

import importlib
from typing import Any, Dict, List, Optional, Tuple

import pytest

import tmpatch as tm

_MARKER = "@pytest.mark.tmpatch"


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("tmpatch", "tmpatch (torchmetrics repaired at run time)")
    group.addoption("--tmpatch", action="store_true", default=False,
                    help="apply tmpatch for the whole run (ini option: tmpatch = true)")
    group.addoption("--tmpatch-patches", metavar="NAMES", default=None,
                    help="only these patches, comma-separated (implies --tmpatch)")
    group.addoption("--tmpatch-exclude", metavar="NAMES", default=None,
                    help="all patches but these, comma-separated (implies --tmpatch)")
    parser.addini("tmpatch", type="bool", default=False, help="apply tmpatch for the whole run")


# -- applying and restoring: tmpatch.control.session -------------------------
def _apply(patches: Any = None, exclude: Any = None, strict: bool = False, **policies: Any) -> Tuple[Any, Any]:
    """Apply exactly this selection; return the report and the session snapshot to restore."""
    from tmpatch.control import session

    return session.apply_exactly(patches, exclude, strict, where=_MARKER, **policies)


def _restore(before: Any) -> None:
    from tmpatch.control import session

    session.restore(before)


# -- the whole run ----------------------------------------------------------
def _option_names(value: Optional[str], option: str) -> Optional[Tuple[str, ...]]:
    from tmpatch.control import selection

    try:
        return selection.names(value, option)
    except (TypeError, ValueError) as exc:
        raise pytest.UsageError(str(exc)) from None


def pytest_configure(config: Any) -> None:
    config.addinivalue_line(
        "markers",
        "tmpatch(*patches, patches=None, exclude=None, strict=False, <policy>=...): apply exactly this selection "
        "of tmpatch for this test (gives it the tmpatch fixture); patches/exclude: lists of patch names; "
        "policies: nan_check, bincount (tmpatch.control.settings)",
    )
    patches = config.getoption("tmpatch_patches", None)
    exclude = config.getoption("tmpatch_exclude", None)
    enabled = bool(config.getoption("tmpatch", False) or config.getini("tmpatch")
                   or patches is not None or exclude is not None)
    if not enabled:
        return
    patches = _option_names(patches, "--tmpatch-patches")
    exclude = _option_names(exclude, "--tmpatch-exclude")
    report, before = _apply(patches, exclude)
    config._tmpatch_session = (report, before)
    if any(row.state == "pending" for row in report):
        _import_host(config)


def _import_host(config: Any) -> None:
    """Import torchmetrics now: the patches apply, and the header says how."""
    from tmpatch import patches

    if not patches.installed():
        return
    try:
        importlib.import_module(patches.HOST)
    except Exception as exc:  # noqa: BLE001 - the tests that import it will say so
        config._tmpatch_import_error = f"{type(exc).__name__}: {exc}"
        return
    config._tmpatch_session = (tm.status(), config._tmpatch_session[1])


def pytest_report_header(config: Any) -> Optional[List[str]]:
    session = getattr(config, "_tmpatch_session", None)
    if session is None:
        return None
    from tmpatch.control.report import grouped

    report = session[0]
    lines = [f"tmpatch: whole run, torchmetrics {report[0].release}"]
    lines += [f"  {line}" for line in grouped(report.states(), width=96)]
    error = getattr(config, "_tmpatch_import_error", None)
    if error:
        lines.append(f"tmpatch: torchmetrics could not be imported ({error}); the patches stay armed")
    for row in report.problems():
        lines.append(f"tmpatch: {row.name} {row.state}: {row.reason}")
    return lines


def pytest_unconfigure(config: Any) -> None:
    session = getattr(config, "_tmpatch_session", None)
    if session is not None:
        del config._tmpatch_session
        _restore(session[1])


# -- fixtures ---------------------------------------------------------------
def _marker_options(marker: Any) -> Dict[str, Any]:
    """The marker's keywords, every one checked (``ValueError``/``TypeError``)."""
    if marker is None:
        return {}
    from tmpatch.control import selection, settings

    valid = ("patches", "exclude", "strict", *settings.POLICIES)
    unknown = sorted(set(marker.kwargs) - set(valid))
    if unknown:
        hints = [f"{name} (did you mean {close}?)" if close else name
                 for name in unknown for close in [settings.closest(name, valid, cutoff=0.6)]]
        raise ValueError(f"{_MARKER}: unknown keyword(s) {', '.join(hints)}; valid: {', '.join(valid)}")
    patches = marker.kwargs.get("patches")
    if marker.args:  # @pytest.mark.tmpatch("safe_divide", ...)
        patches = list(marker.args) + list(selection.names(patches, f"{_MARKER}(patches=...)") or ())
    strict = marker.kwargs.get("strict", False)
    if not isinstance(strict, bool):
        if strict is None or not isinstance(strict, (str, list, tuple, set, frozenset)):
            raise TypeError(f"{_MARKER}(strict=...) must be True, False or patch names; got "
                            f"{type(strict).__name__} {strict!r}")
        strict = selection.names(strict, f"{_MARKER}(strict=...)")
    return {
        "patches": selection.names(patches, f"{_MARKER}(patches=...)"),
        "exclude": selection.names(marker.kwargs.get("exclude"), f"{_MARKER}(exclude=...)"),
        "strict": strict,
        **selection.check_policies({name: marker.kwargs[name] for name in settings.POLICIES
                                    if name in marker.kwargs}, where=_MARKER),
    }


@pytest.fixture
def tmpatch(request: Any):
    """tmpatch applied for this test (choose with ``@pytest.mark.tmpatch``);
    yields the status report; restores the state before afterwards."""
    try:
        options = _marker_options(request.node.get_closest_marker("tmpatch"))
        problem = None
    except (TypeError, ValueError) as exc:
        options, problem = {}, str(exc)
    if problem is not None:
        pytest.fail(problem, pytrace=False)
    report, before = _apply(**options)
    try:
        yield report
    finally:
        _restore(before)


@pytest.fixture(autouse=True)
def _tmpatch_marker(request: Any) -> None:
    """A test marked ``@pytest.mark.tmpatch`` gets the ``tmpatch`` fixture."""
    if "tmpatch" not in request.fixturenames and request.node.get_closest_marker("tmpatch") is not None:
        request.getfixturevalue("tmpatch")


@pytest.fixture
def no_sync(request: Any):
    """Fail the test on the first host-device sync in its body (real CUDA when
    present, simulated otherwise), with :func:`tmpatch.audit.no_sync`; the body
    is the test function, not the fixtures. Yields a
    :class:`tmpatch.audit.fixture.NoSyncFixture` (``device``, ``put()``)."""
    try:
        from tmpatch.audit import fixture
    except ImportError as exc:
        pytest.skip(f"no_sync needs tmpatch.audit.no_sync, which is not available here ({exc})")
    handle = fixture.NoSyncFixture()
    request.node._tmpatch_no_sync = handle
    yield handle
    request.node.__dict__.pop("_tmpatch_no_sync", None)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: Any):
    """Run the body of a test that uses ``no_sync`` under the guard."""
    handle = getattr(item, "_tmpatch_no_sync", None)
    if handle is None:
        yield
        return
    context = handle.guard()
    handle.device = context.__enter__()
    outcome = yield
    excinfo = outcome.excinfo
    try:
        context.__exit__(*(excinfo or (None, None, None)))
    except BaseException as exc:  # noqa: BLE001 - a sync reported on exit
        if excinfo is not None:
            return  # the body failed already (with the first sync, or otherwise)
        force = getattr(outcome, "force_exception", None)
        if force is None:  # pluggy < 1.1: an exception here fails the call
            raise
        force(exc)
    finally:
        handle.device = None
