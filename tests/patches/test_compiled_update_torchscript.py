"""TorchScript with tmpatch applied: ``torch.jit.script(metric)`` works patched wherever it works
on the release, and gives the release's scripted module.

The metrics are the audit panel's (tmpatch/audit/panel/rows.py): one of each class, updated once
with its first row's inputs, and a MetricCollection of the training step's. Each is scripted
unpatched, patched and after ``revert()``: the outcome (scripted, or refused: the release itself
refuses CatMetric and RunningMean), the saved archive (``torch.jit.save``: the compiled code of
every method and property, every attribute's type and value) and what the scripted module answers
(its properties; ``forward``, which the release marks unused, raises) must be the release's.
TorchScript keeps the classes it compiled for the process: a class first scripted with tmpatch
applied scripts after ``revert()`` as the release's does (fresh subclasses, never scripted before).
"""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
import warnings
from typing import Any, Dict, List, Tuple

import pytest
import torch

import tmpatch
from tests.conftest import assert_bitwise
from tmpatch.audit.panel.rows import ROWS, _resolve

Outcome = Tuple[str, Any]


def _available(row: Any) -> bool:
    try:
        for name in row.requires:
            _resolve(name)
    except (ImportError, AttributeError):
        return False
    return True


def _panel() -> List[Tuple[str, Any, tuple]]:
    """``(name, metric, update arguments)`` of each metric class of the panel (its first row's
    arguments: a script costs about 0.3 s, and a row's arguments only change the values of
    attributes), updated once, and a MetricCollection of the training step's."""
    built, classes = [], set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for row in ROWS:
            if row.helper or not _available(row):
                continue
            calls = row.build()
            for index, (metric, args, kwargs) in enumerate(calls):
                if type(metric) in classes:
                    continue
                classes.add(type(metric))
                metric.update(*args, **kwargs)
                built.append((f"{row.name} [{index}]" if len(calls) > 1 else row.name, metric, args))
            if row.name == "training step":  # its four classification metrics, in a collection
                from torchmetrics import MetricCollection

                collection = MetricCollection({type(m).__name__: m for m, _, _ in calls[1:]})
                collection.update(*calls[1][1])
                built.append(("MetricCollection (training step)", collection, calls[1][1]))
    return built


def _answer(call: Any) -> Any:
    """What a call gives: a value (tensors as their bits), or its error as text."""
    try:
        value = call()
    except Exception as exc:  # noqa: BLE001 - the scripted module's own error is compared
        return f"{type(exc).__name__}: {exc}"
    return value.clone() if isinstance(value, torch.Tensor) else repr(value)


def _portrait(scripted: Any, args: tuple) -> Dict[str, Any]:
    """The scripted module: its archive, each property's value and the call of ``forward``."""
    archive = io.BytesIO()
    torch.jit.save(scripted, archive)
    seen: Dict[str, Any] = {"archive": archive.getvalue()}
    for prop in scripted._c._properties():
        seen[f"property {prop.name}"] = _answer(lambda n=prop.name: scripted._c._get_method(f"__{n}_getter")())
    seen["forward"] = _answer(lambda: scripted(*args))
    return seen


def _script(metric: Any, args: tuple) -> Outcome:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            scripted = torch.jit.script(metric)
        except Exception as exc:  # noqa: BLE001 - the release's refusal is compared
            return "refused", f"{type(exc).__name__}"
        return "scripted", _portrait(scripted, args)  # torch.jit.save: deprecated on torch 2.13


def _same(got: Outcome, want: Outcome, name: str) -> None:
    assert got[0] == want[0], (name, got, want)
    if want[0] == "refused":
        return
    assert got[1].keys() == want[1].keys(), name
    for key, value in want[1].items():
        if isinstance(value, torch.Tensor):
            assert_bitwise(got[1][key], value)
        else:
            assert got[1][key] == value, (name, key)


def _scripts() -> Dict[str, Outcome]:
    return {name: _script(metric, args) for name, metric, args in _panel()}


def test_the_panels_metrics_script_as_on_the_release():
    """Unpatched, patched (metrics built after ``apply()``), then reverted: the same outcome and
    the same scripted module, bit for bit."""
    release = _scripts()
    assert any(outcome[0] == "scripted" for outcome in release.values())
    tmpatch.apply()
    patched = _scripts()
    tmpatch.revert()
    reverted = _scripts()
    for name, want in release.items():
        _same(patched[name], want, f"patched: {name}")
        _same(reverted[name], want, f"reverted: {name}")


def _fresh(cls: type) -> type:
    """A subclass of ``cls`` that TorchScript has never compiled (its own qualified name)."""
    return type(cls.__name__, (cls,), {"__module__": __name__})


def _fresh_cases() -> List[Tuple[str, Any, Any]]:
    from torchmetrics import MeanMetric, MeanSquaredError
    from torchmetrics.classification import BinaryAUROC, MulticlassAccuracy

    g = torch.Generator().manual_seed(0)
    logits, labels = torch.randn(6, 5, generator=g), torch.randint(0, 5, (6,), generator=g)
    probs, bits = torch.rand(6, generator=g), torch.randint(0, 2, (6,), generator=g)
    return [
        ("MeanMetric", lambda cls: cls(), (torch.randn(8, generator=g),), MeanMetric),
        ("MulticlassAccuracy", lambda cls: cls(num_classes=5), (logits, labels), MulticlassAccuracy),
        ("BinaryAUROC", lambda cls: cls(thresholds=10), (probs, bits), BinaryAUROC),
        ("MeanSquaredError", lambda cls: cls(), (probs, bits.float()), MeanSquaredError),
    ]


def _unarchived(outcome: Outcome) -> Outcome:
    """Without the archive: two fresh classes differ in their qualified names."""
    if outcome[0] != "scripted":
        return outcome
    return outcome[0], {k: v for k, v in outcome[1].items() if k != "archive"}


@pytest.mark.parametrize("patched_script", [True, False], ids=["scripted patched", "not scripted patched"])
def test_revert_leaves_nothing_a_later_script_trips_over(patched_script):
    """Metric classes TorchScript has never compiled, scripted with tmpatch applied (where tmpatch's
    count descriptor once failed the script and left the class half-compiled for the process) or
    only built then, script after ``revert()`` and answer as classes scripted on the release."""
    cases = _fresh_cases()
    release = {}
    for name, build, args, base in cases:
        metric = build(_fresh(base))
        metric.update(*args)
        release[name] = _unarchived(_script(metric, args))
        assert release[name][0] == "scripted", (name, release[name])
    classes = {name: _fresh(base) for name, _, _, base in cases}
    tmpatch.apply()
    for name, build, args, _ in cases:
        metric = build(classes[name])
        metric.update(*args)
        if patched_script:
            _same(_unarchived(_script(metric, args)), release[name], f"patched: {name}")
    tmpatch.revert()
    for name, build, args, _ in cases:
        metric = build(classes[name])
        metric.update(*args)
        _same(_unarchived(_script(metric, args)), release[name], f"reverted: {name}")


# --- what a script of a wrapper metric says: the error and the warnings, release against patched ----------------------

#: a child's script of each metric (a class TorchScript has never compiled in that process): its outcome (the
#: error's text, which names the file of the method TorchScript refused) and every warning, counted
_SCRIPT_CHILD = textwrap.dedent('''
    import collections, json, sys, warnings
    if sys.argv[1] == "patched":
        import tmpatch
        tmpatch.apply()
    import torch
    import torchmetrics
    from torchmetrics import MeanMetric, SumMetric
    from torchmetrics.wrappers import MinMaxMetric
    cases = {"MeanMetric": MeanMetric, "MinMaxMetric": lambda: MinMaxMetric(MeanMetric())}
    if hasattr(torchmetrics.wrappers, "Running"):
        cases["Running"] = lambda: torchmetrics.wrappers.Running(SumMetric(), window=3)
    seen = {}
    for name, build in cases.items():
        metric = build()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                torch.jit.script(metric)
                outcome = "scripted"
            except Exception as exc:
                outcome = f"{type(exc).__name__}: {exc}"
        counted = collections.Counter(f"{w.category.__name__}: {w.message} @ {w.filename}:{w.lineno}" for w in caught)
        seen[name] = {"outcome": outcome, "warnings": dict(counted)}
    print(json.dumps(seen))
''')


def _script_child(mode: str) -> Dict[str, Dict[str, Any]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TMPATCH")}
    env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in sys.path if p and os.path.isdir(p))
    done = subprocess.run([sys.executable, "-c", _SCRIPT_CHILD, mode], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def wrapper_scripts() -> Tuple[Dict[str, Dict[str, Any]], Dict[str, Dict[str, Any]]]:
    """The release's and the patched scripts, each in a child process of its own (what TorchScript
    compiled once, a function of torchmetrics say, it neither compiles nor warns about again)."""
    return _script_child("release"), _script_child("patched")


def test_a_wrapper_metric_is_refused_in_the_releases_words_naming_its_file(wrapper_scripts):
    """``Running.forward`` is a tmpatch layer: TorchScript read its source through ``__wrapped__``,
    but named tmpatch/engine/layers.py as the file (``inspect.getsourcefile`` does not unwrap)."""
    release, patched = wrapper_scripts
    assert release.keys() == patched.keys()
    for name, want in release.items():
        assert patched[name]["outcome"] == want["outcome"], name
    if "Running" in release:
        assert release["Running"]["outcome"].startswith("NotSupportedError")
        assert "torchmetrics" in release["Running"]["outcome"].split('File "')[1].split('"')[0]


@pytest.mark.parametrize("name", ["MeanMetric", "MinMaxMetric", "Running"])
def test_scripting_a_metric_gives_the_releases_warnings(wrapper_scripts, name):
    """Each warning of the script (``torch.jit.script is deprecated`` once per script TorchScript
    makes, torchmetrics' own), with its count, file and line, as on the release."""
    release, patched = wrapper_scripts
    if name not in release:
        pytest.skip(f"no {name} in this release")
    assert patched[name]["warnings"] == release[name]["warnings"]
