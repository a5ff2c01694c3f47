"""pytest plugin (entry point ``pytest11``, name ``tmpatch``).

* ``pytest --tmpatch`` (or ``tmpatch = true`` in the ini file): the whole run
  is patched; ``--tmpatch-patches``/``--tmpatch-exclude`` choose (and imply
  ``--tmpatch``). Unknown names fail the run with a usage error.
* fixture ``tmpatch``: applies for one test, reverts after, yields the
  :class:`tmpatch.Report`. ``@pytest.mark.tmpatch(patches=[...], exclude=[...],
  strict=False)`` chooses (a marked test gets the fixture without asking).
* fixture ``no_sync``: the test fails on the first host-device sync in its
  body (the test function itself, not the fixtures), with
  :func:`tmpatch.audit.no_sync`; skipped where that is not available.

The fixtures revert exactly what they applied: patches that were on before
(``--tmpatch``, ``TMPATCH=1``) stay on, and nothing else of tmpatch is left
(no wrapper, no armed import hook). Loading the plugin imports nothing but
pytest; tmpatch itself is imported when an option or fixture is used.
"""
from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Tuple

import pytest

_ACTIVE = ("applied", "pending")
_MARKER_KEYWORDS = ("patches", "exclude", "strict")


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("tmpatch", "tmpatch (torchmetrics repaired at run time)")
    group.addoption("--tmpatch", action="store_true", default=False,
                    help="apply tmpatch for the whole run (ini option: tmpatch = true)")
    group.addoption("--tmpatch-patches", metavar="NAMES", default=None,
                    help="only these patches, comma-separated (implies --tmpatch)")
    group.addoption("--tmpatch-exclude", metavar="NAMES", default=None,
                    help="all patches but these, comma-separated (implies --tmpatch)")
    parser.addini("tmpatch", type="bool", default=False, help="apply tmpatch for the whole run")


# -- helpers ----------------------------------------------------------------
def _valid_names() -> Sequence[str]:
    from tmpatch.patches import NAMES

    return NAMES


def _check_names(value: Any, where: str) -> Optional[Tuple[str, ...]]:
    """``value`` (a comma-separated string or a list) as a tuple of known
    patch names; ``ValueError`` naming the valid ones otherwise."""
    if value is None:
        return None
    if isinstance(value, str):
        from tmpatch.env import parse_names

        names = parse_names(value) or ()
    else:
        names = tuple(value)
    valid = _valid_names()
    unknown = [name for name in names if name not in valid]
    if unknown:
        raise ValueError(f"{where}: unknown patch name(s) {', '.join(map(repr, unknown))}; "
                         f"valid names: {', '.join(valid)}")
    return names


def _active(states: Dict[str, str]) -> set:
    return {name for name, state in states.items() if state in _ACTIVE}


def _apply(patches: Any = None, exclude: Any = None, strict: bool = False) -> Tuple[Any, Dict[str, str]]:
    """Apply; return the report and the states before (for :func:`_undo`)."""
    import tmpatch as tm

    before = tm.status().states()
    try:
        report = tm.apply(patches, exclude=exclude, strict=strict)
    except BaseException:
        _undo(before)
        raise
    return report, before


def _undo(before: Dict[str, str]) -> None:
    """Revert every patch that is active now and was not in ``before``, and
    drop the ``excluded`` rows that were not there before."""
    import tmpatch as tm

    now = tm.status().states()
    mine = [name for name in now if name in _active(now) - _active(before)
            or (now[name] == "excluded" and before.get(name) != "excluded")]
    if mine:
        tm.revert(mine)


# -- the whole run ----------------------------------------------------------
def pytest_configure(config: Any) -> None:
    config.addinivalue_line(
        "markers",
        "tmpatch(patches=None, exclude=None, strict=False): apply tmpatch for this test "
        "(gives it the tmpatch fixture); patches/exclude: lists of patch names",
    )
    patches = config.getoption("tmpatch_patches", None)
    exclude = config.getoption("tmpatch_exclude", None)
    enabled = bool(config.getoption("tmpatch", False) or config.getini("tmpatch")
                   or patches is not None or exclude is not None)
    if not enabled:
        return
    try:
        patches = _check_names(patches, "--tmpatch-patches")
        exclude = _check_names(exclude, "--tmpatch-exclude")
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    report, before = _apply(patches, exclude)
    config._tmpatch_session = (report, before)


def pytest_report_header(config: Any) -> Optional[str]:
    session = getattr(config, "_tmpatch_session", None)
    if session is None:
        return None
    states = ", ".join(f"{row.name} {row.state}" for row in session[0])
    return f"tmpatch (whole run, torchmetrics {session[0][0].release}): {states}"


def pytest_unconfigure(config: Any) -> None:
    session = getattr(config, "_tmpatch_session", None)
    if session is not None:
        del config._tmpatch_session
        _undo(session[1])


# -- fixtures ---------------------------------------------------------------
def _marker_options(marker: Any) -> Dict[str, Any]:
    if marker is None:
        return {}
    unknown = sorted(set(marker.kwargs) - set(_MARKER_KEYWORDS))
    if unknown:
        raise ValueError(f"@pytest.mark.tmpatch: unknown keyword(s) {', '.join(unknown)}; "
                         f"valid: {', '.join(_MARKER_KEYWORDS)}")
    patches = marker.kwargs.get("patches")
    if marker.args:  # @pytest.mark.tmpatch("safe_divide", ...)
        patches = list(marker.args) + list(patches or ())
    return {
        "patches": _check_names(patches, "@pytest.mark.tmpatch(patches=...)"),
        "exclude": _check_names(marker.kwargs.get("exclude"), "@pytest.mark.tmpatch(exclude=...)"),
        "strict": bool(marker.kwargs.get("strict", False)),
    }


@pytest.fixture
def tmpatch(request: Any):
    """tmpatch applied for this test (choose with ``@pytest.mark.tmpatch``);
    yields the status report; reverts what it applied afterwards."""
    try:
        options = _marker_options(request.node.get_closest_marker("tmpatch"))
        problem = None
    except ValueError as exc:
        options, problem = {}, str(exc)
    if problem is not None:
        pytest.fail(problem, pytrace=False)
    report, before = _apply(**options)
    try:
        yield report
    finally:
        _undo(before)


@pytest.fixture(autouse=True)
def _tmpatch_marker(request: Any) -> None:
    """A test marked ``@pytest.mark.tmpatch`` gets the ``tmpatch`` fixture."""
    if "tmpatch" not in request.fixturenames and request.node.get_closest_marker("tmpatch") is not None:
        request.getfixturevalue("tmpatch")


class NoSync:
    """What the ``no_sync`` fixture yields. While the test body runs,
    ``device`` is the CUDA device the guard watches (real, or simulated
    without a GPU: put inputs there with ``tmpatch.audit.to_sim_cuda``)."""

    def __init__(self, guard: Any) -> None:
        self.guard = guard
        self.device: Any = None


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
