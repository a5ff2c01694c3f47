"""On the CPU a deferred check's patch is the release, call by call.

:func:`assert_calls_are_the_releases` runs the same calls (updates, forwards, computes, resets) on a
metric built unpatched and on one built with the patches applied (their CPU shortcuts on): each call
gives the same outcome in both (the exception's class and message, or the same value, bit for bit),
the states after each call are the same, bit for bit (the release raised before adding a bad
batch), and nothing is left pending for a later report.
"""
from __future__ import annotations

import warnings
from typing import Any, Callable, List, Sequence

import tmpatch
from tests.conftest import cpu_shortcuts
from tests.patches.eager import _same_result, same_states
from tmpatch.runtime import deferred


def outcome(call: Callable[[Any], Any], metric: Any) -> Any:
    """``call(metric)``'s value, or ``"Type: message"`` for what it raised."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return call(metric)
        except Exception as exc:  # noqa: BLE001 - the release's own outcome is compared
            return f"{type(exc).__name__}: {exc}"


def _states(metric: Any) -> list:
    """Copies of the metric's states (tensors updated in place keep their value of now)."""
    out = []
    for name in metric._defaults:
        value = getattr(metric, name)
        out.append([v.clone() for v in value] if isinstance(value, list) else value.clone())
    return out


def _run(make: Callable[[], Any], calls: Sequence[Callable[[Any], Any]]) -> List[tuple]:
    metric = make()
    out = []
    for call in calls:
        got = outcome(call, metric)
        out.append((got, _states(metric), metric))
    return out


def assert_calls_are_the_releases(make: Callable[[], Any], calls: Sequence[Callable[[Any], Any]],
                                  patches: Sequence[str]) -> List[Any]:
    """``calls`` on ``make()`` unpatched and patched (CPU shortcuts on): the same outcomes and states
    after each; returns the release's outcomes."""
    tmpatch.revert()
    want = _run(make, calls)
    report = tmpatch.apply(list(patches))
    assert all(report[name].state == "applied" for name in patches), report
    cpu_shortcuts(True)
    got = _run(make, calls)
    for index, ((g, g_states, metric), (w, w_states, _)) in enumerate(zip(got, want)):
        if g is None or w is None:
            assert g is w, index
        else:
            _same_result(g, w)
        same_states(g_states, w_states)
        assert not deferred.pending(metric), index
    return [w for w, _, _ in want]
