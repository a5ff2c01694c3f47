"""Every argument combination the release takes gives the release's result, patched.

A property over the constructor arguments of each classification class of the audit panel
(tmpatch/audit/panel/rows.py): those of its signature among ``num_classes`` (``None`` included:
1.9.0 takes it for ``average="micro"``, other combinations are refused by the release and must be
refused alike), ``num_labels``, ``average``, ``top_k``, ``ignore_index``, ``multidim_average``,
``thresholds``, ``threshold``, ``normalize``, ``normalization``, ``max_fpr``, ``n_bins``, ``norm``,
``zero_division`` and ``validate_args``, with valid inputs (classes in range, or ignored) of
scores or labels, with and without extra dimensions. The reference is built unpatched in each
example; the patched metric is built after ``tmpatch.apply()`` (every patch, default policies):
the constructor's error, each ``update()``'s or ``forward()``'s error or value, the states and
``compute()`` are the release's, bit for bit. The CPU shortcuts are drawn on or off (off: the
path a GPU takes).
"""
from __future__ import annotations

import inspect
import warnings
from typing import Any, Dict, List, Tuple

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

import tmpatch
from tests.conftest import cpu_shortcuts, examples
from tests.patches.bincount import cases
from tmpatch.audit.panel.rows import ROWS, _resolve

PREFIX = "torchmetrics.classification:"


def _panel_classes() -> List[type]:
    """The panel's classification classes that this release has."""
    found: Dict[str, type] = {}
    for row in ROWS:
        for name in row.requires:
            if name.startswith(PREFIX) and name not in found:
                try:
                    found[name] = _resolve(name)
                except (ImportError, AttributeError):
                    continue
    return [found[name] for name in sorted(found)]


CLASSES = _panel_classes()


def _task(metric_cls: type) -> str:
    name = metric_cls.__name__
    return "binary" if name.startswith("Binary") else "multilabel" if name.startswith("Multilabel") else "multiclass"


def _thresholds(draw: Any) -> Any:
    form = draw(st.sampled_from(["none", "int", "list", "tensor"]))
    if form == "none":
        return None
    if form == "int":
        return draw(st.integers(2, 6))
    values = sorted(draw(st.lists(st.floats(0, 1, width=32), min_size=1, max_size=5)))
    return values if form == "list" else torch.tensor(values)


def _arguments(draw: Any, metric_cls: type, size: int) -> Dict[str, Any]:
    """Constructor arguments of ``metric_cls`` (those of its signature), ``size`` classes or labels."""
    params = inspect.signature(metric_cls.__init__).parameters
    options: Dict[str, Any] = {
        "num_classes": lambda: draw(st.sampled_from([size, size, None])),
        "num_labels": lambda: size,
        "top_k": lambda: draw(st.sampled_from([1, 1, 2, size])),
        "average": lambda: draw(st.sampled_from(["micro", "macro", "weighted", "none", None])),
        "multidim_average": lambda: draw(st.sampled_from(["global", "samplewise"])),
        "ignore_index": lambda: draw(st.sampled_from([None, -1, 0, 1, 255])),
        "thresholds": lambda: _thresholds(draw),
        "threshold": lambda: draw(st.sampled_from([0.5, 0.3])),
        "normalize": lambda: draw(st.sampled_from([None, "true", "pred", "all", "none"])),
        "normalization": lambda: draw(st.sampled_from([None, "sigmoid"])),
        "max_fpr": lambda: draw(st.sampled_from([None, 0.5])),
        "n_bins": lambda: draw(st.sampled_from([3, 15])),
        "norm": lambda: draw(st.sampled_from(["l1", "l2", "max"])),
        "zero_division": lambda: draw(st.sampled_from([0, 1])),
        "validate_args": lambda: draw(st.booleans()),
    }
    kwargs = {}
    for name in params:
        if name in options and (name in ("num_classes", "num_labels") or draw(st.integers(0, 3)) > 0):
            kwargs[name] = options[name]()
    return kwargs


def _batches(draw: Any, task: str, size: int, ignore: Any) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    """Valid batches: targets in range or ``ignore``; scores (probabilities or logits) or labels."""
    extra = draw(st.sampled_from([(), (2,), (3,)]))
    classes = size if task == "multiclass" else 2
    out = []
    for _ in range(draw(st.integers(1, 3))):
        n = draw(st.integers(1, 6))
        shape = (n, size) + extra if task == "multilabel" else (n,) + extra
        count = int(torch.Size(shape).numel())
        choices = [st.integers(0, classes - 1)] + ([st.just(ignore)] if ignore is not None else [])
        target = torch.tensor(draw(st.lists(st.one_of(*choices), min_size=count, max_size=count)),
                              dtype=torch.int64).reshape(shape)
        form = draw(st.sampled_from(["probs", "logits", "labels"]))
        if form == "labels":
            values = draw(st.lists(st.integers(0, classes - 1), min_size=count, max_size=count))
            preds = torch.tensor(values, dtype=torch.int64).reshape(shape)
        else:
            scores = (n, size) + extra if task == "multiclass" else shape
            low, high = (0.0, 1.0) if form == "probs" else (-4.0, 4.0)
            total = int(torch.Size(scores).numel())
            values = draw(st.lists(st.floats(low, high, width=32), min_size=total, max_size=total))
            preds = torch.tensor(values, dtype=torch.float32).reshape(scores)
        out.append((preds, target))
    return out


def _built(make: Any) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return make()
        except Exception as exc:  # noqa: BLE001 - the release's refusal is compared
            return f"{type(exc).__name__}: {exc}"


@settings(max_examples=examples(150), deadline=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_every_argument_combination_gives_the_releases_result(data):
    metric_cls = data.draw(st.sampled_from(CLASSES))
    task = _task(metric_cls)
    size = data.draw(st.integers(2, 4))
    kwargs = _arguments(data.draw, metric_cls, size)
    batches = _batches(data.draw, task, size, kwargs.get("ignore_index"))
    forward = data.draw(st.booleans())
    cpu_shortcuts(data.draw(st.booleans()))

    def make() -> Any:
        return metric_cls(**kwargs)

    tmpatch.revert()
    expected = _built(make)
    want = cases.updates(expected, batches, forward) if not isinstance(expected, str) else None
    tmpatch.apply()
    metric = _built(make)
    if isinstance(expected, str) or isinstance(metric, str):
        assert metric == expected, kwargs
        return
    got = cases.updates(metric, batches, forward)
    if isinstance(want, str) or isinstance(got, str):
        assert got == want, kwargs
        return
    if forward:
        for g, w in zip(got, want):
            cases.assert_same_outcome(cases.tensors(g), cases.tensors(w))
    cases.assert_same(metric, expected)


def test_num_classes_none_micro_with_ignore_index_is_the_releases():
    """torchmetrics' own corner case (1.9.0: ``num_classes=None`` with ``average="micro"``): every
    class counts; the patched forward() gave 0.0 and compute() a false report."""
    from torchmetrics.classification import MulticlassAccuracy

    if isinstance(_built(lambda: MulticlassAccuracy(num_classes=None, average="micro")), str):
        pytest.skip("this release wants num_classes")
    preds = target = torch.tensor([0, 1, 2, 0, 1, 2])
    for shortcuts in (True, False):
        cpu_shortcuts(shortcuts)
        tmpatch.revert()
        expected = MulticlassAccuracy(num_classes=None, average="micro", ignore_index=0)
        want = expected(preds, target)
        tmpatch.apply()
        metric = MulticlassAccuracy(num_classes=None, average="micro", ignore_index=0)
        cases.assert_same_outcome([metric(preds, target)], [want])
        cases.assert_same(metric, expected)
