"""Policy ``checks="eager"`` (tmpatch/runtime/deferred/marking.py): a deferred check's patch gives
the release's error from ``update()``, as the release gives it.

:func:`assert_eager_is_the_release` runs the same updates on a metric built unpatched and on one
built with the patches applied under ``checks="eager"``: the bad update raises the same exception
(class and message) from ``update()`` in both, the states after it are the same, bit for bit (the
release raised before adding the batch), and so is ``compute()``'s outcome (nothing deferred).
"""
from __future__ import annotations

import warnings
from typing import Any, Callable, Sequence

import pytest
import torch

import tmpatch
from tests.conftest import assert_bitwise, cpu_shortcuts
from tmpatch.runtime import deferred, policies


def _states(metric: Any) -> list:
    out = []
    for name in metric._defaults:
        value = getattr(metric, name)
        out.append(list(value) if isinstance(value, list) else value)
    return out


def same_states(got: list, want: list) -> None:
    """Bitwise equal states (a list state: its tensors one by one)."""
    assert len(got) == len(want)
    for g, w in zip(got, want):
        if isinstance(w, list):
            assert len(g) == len(w)
            for a, b in zip(g, w):
                assert_bitwise(a, b)
        else:
            assert_bitwise(g, w)


def _compute(metric: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            result = metric.compute()
        except Exception as exc:  # noqa: BLE001 - the release's own outcome is compared
            return f"{type(exc).__name__}: {exc}"
    return result


def _same_result(got: Any, want: Any) -> None:
    if isinstance(want, str) or isinstance(got, str):
        assert got == want
    elif isinstance(want, torch.Tensor):
        assert_bitwise(got, want)
    elif isinstance(want, dict):
        assert sorted(got) == sorted(want)
        for key in want:
            _same_result(got[key], want[key])
    else:
        assert len(got) == len(want)
        for g, w in zip(got, want):
            _same_result(g, w)


def _run(make: Callable[[], Any], good: Sequence[tuple], bad: tuple) -> tuple:
    metric = make()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for args in good:
            metric.update(*args)
        with pytest.raises(Exception) as raised:
            metric.update(*bad)
    return metric, raised.value


def assert_eager_is_the_release(make: Callable[[], Any], good: Sequence[tuple], bad: tuple,
                                patches: Sequence[str], shortcuts: bool = True) -> None:
    """``make()`` updated with each of ``good``, then ``bad``: the release raises in ``update()``;
    patched (``patches``, policy ``checks="eager"``, the CPU shortcuts on or off) it raises the
    same exception there, and the states and ``compute()`` are the release's."""
    tmpatch.revert()
    expected, error = _run(make, good, bad)
    want_states, want = _states(expected), _compute(expected)
    try:
        report = tmpatch.apply(list(patches), checks="eager")
        assert all(report[name].state == "applied" for name in patches), report
        cpu_shortcuts(shortcuts)
        metric, raised = _run(make, good, bad)
        assert type(raised) is type(error), (raised, error)
        assert str(raised) == str(error)
        assert not deferred.local_records(metric)
        same_states(_states(metric), want_states)
        _same_result(_compute(metric), want)
    finally:
        policies.current["checks"] = "deferred"
        cpu_shortcuts(True)
