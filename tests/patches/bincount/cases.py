"""What the bincount tests share: the covered metrics, generated batches, and comparisons
with the release (a reference metric built unpatched in every example)."""
from __future__ import annotations

import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from hypothesis import strategies as st
from torchmetrics import classification as cls

import tmpatch
from tests.conftest import assert_bitwise, release_in

#: the start of tmpatch's note in a deferred bincount error (after the release's words)
MESSAGE = "tmpatch bincount: "

STAT_SCORES = [cls.MulticlassStatScores, cls.MulticlassAccuracy, cls.MulticlassPrecision, cls.MulticlassRecall,
               cls.MulticlassF1Score]
AVERAGES = ["micro", "macro", "weighted", "none"]
CONFUSION = {
    "binary": [cls.BinaryConfusionMatrix, cls.BinaryJaccardIndex, cls.BinaryMatthewsCorrCoef, cls.BinaryCohenKappa],
    "multiclass": [cls.MulticlassConfusionMatrix, cls.MulticlassJaccardIndex, cls.MulticlassMatthewsCorrCoef,
                   cls.MulticlassCohenKappa],
    "multilabel": [cls.MultilabelConfusionMatrix, cls.MultilabelJaccardIndex, cls.MultilabelMatthewsCorrCoef],
}
CURVES = {
    "binary": [cls.BinaryPrecisionRecallCurve, cls.BinaryROC, cls.BinaryAUROC, cls.BinaryAveragePrecision],
    "multiclass": [cls.MulticlassPrecisionRecallCurve, cls.MulticlassROC, cls.MulticlassAUROC,
                   cls.MulticlassAveragePrecision],
    "multilabel": [cls.MultilabelPrecisionRecallCurve, cls.MultilabelROC, cls.MultilabelAUROC,
                   cls.MultilabelAveragePrecision],
}
#: ``average`` of the multiclass curve ("micro": one-hot, flattened) from 1.3.0
MULTICLASS_CURVE_AVERAGE = release_in(">=1.3.0")
#: 0.10.0-0.10.1: the release's ``_bincount`` counts with ``index_add_`` (no device read; an int64 index
#: only, counts in the input's dtype, IndexError out of range), not ``torch.bincount``
INDEX_ADD = release_in("<0.10.2")
#: the error the release's ``_bincount`` gives for a negative value
NEGATIVE = (IndexError, "out of range") if INDEX_ADD else (RuntimeError, "non-negative")
#: torch.bincount's message for a negative value (the release's words of a deferred error)
NEGATIVE_TEXT = "bincount only supports 1-d non-negative integral inputs."
#: index_add_'s error on a code outside the bins (0.10.0-0.10.1, on the CPU). On a GPU that release's
#: index_add_ fails with a device-side assert instead, which names nothing: a deferred report there
#: gives torch.bincount's words (the error of every later release)
INDEX_ADD_ERROR = "IndexError: index out of range in self"
def release_raises(torch_message: str) -> Any:
    """``pytest.raises`` of the release's error on a code past the bins: ``torch_message`` (a pattern of
    the reshape's RuntimeError) from 0.10.2 on, index_add_'s IndexError before."""
    import pytest

    if INDEX_ADD:
        return pytest.raises(IndexError, match=r"^index out of range in self$")
    return pytest.raises(RuntimeError, match=torch_message)


#: the starts of the deferred errors that stand for INDEX_ADD_ERROR
INDEX_ADD_DEFERRED = ("RuntimeError: " + NEGATIVE_TEXT, "RuntimeError: shape '")


def apply() -> None:
    """Apply bincount (with deferred_reports, which it requires)."""
    states = tmpatch.apply("bincount").states()
    assert states["bincount"] == states["deferred_reports"] == "applied", states


def unpatched() -> None:
    """Revert before building a reference: a hypothesis test runs many examples in one
    test (the conftest fixture reverts once per test)."""
    tmpatch.revert()


def build(kind: str, metric_cls: type, size: int, **kwargs: Any):
    return metric_cls(**kwargs) if kind == "binary" else metric_cls(size, **kwargs)


def tensors(value: Any) -> List[torch.Tensor]:
    """Every tensor of a metric result (a tensor, or nested tuples / lists / dicts of them)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for key in sorted(value) for t in tensors(value[key])]
    return [t for item in value for t in tensors(item)]


def outcome(metric) -> Any:
    """``compute()``'s tensors, or the error it raised (class and message)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with torch.no_grad():
                return tensors(metric.compute())
        except Exception as exc:  # noqa: BLE001 - the release's own errors are compared
            return f"{type(exc).__name__}: {exc}"


def updates(metric, batches: Sequence[Tuple[Any, Any]], forward: bool = False) -> Any:
    """Run the updates (or forwards); the per-batch values, or the error raised (class and message)."""
    out = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            for p, t in batches:
                out.append(metric(p, t) if forward else metric.update(p, t))
        except Exception as exc:  # noqa: BLE001 - the release's own errors are compared
            return f"{type(exc).__name__}: {exc}"
    return out


def states(metric) -> List[Any]:
    return [getattr(metric, name) for name in metric._defaults]


def assert_same_outcome(got: Any, want: Any) -> None:
    assert type(got) is type(want), (got, want)
    if isinstance(want, str):
        assert got == want
    else:
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert_bitwise(g, w)


def assert_same(patched, expected) -> None:
    """Same states (bitwise) and the same ``compute()`` outcome."""
    for got, want in zip(states(patched), states(expected)):
        if isinstance(want, list):
            assert len(got) == len(want)
            for g, w in zip(got, want):
                assert_bitwise(g, w)
        else:
            assert_bitwise(got, want)
    assert_same_outcome(outcome(patched), outcome(expected))


def pair(make, batches, forward: bool = False):
    """A reference built unpatched and the same metric patched, both fed ``batches``
    (``forward``: by forward(), whose per-batch values are compared too)."""
    unpatched()
    expected = make()
    want = updates(expected, batches, forward)
    apply()
    metric = make()
    got = updates(metric, batches, forward)
    if isinstance(want, str) or isinstance(got, str):  # the release's own error, the same
        assert got == want
    elif forward:
        for g, w in zip(got, want):
            assert_same_outcome(tensors(g), tensors(w))
    return metric, expected


# -- generated batches -----------------------------------------------------------------------
def _floats(draw, shape, form: str) -> torch.Tensor:
    count = int(torch.Size(shape).numel())
    if form == "probs":
        values = st.floats(0.0, 1.0, width=32)
    elif form == "logits":  # outside [0, 1] everywhere: any subset of them is "logits" too
        values = st.one_of(st.floats(-4.0, -0.25, width=32), st.floats(1.25, 4.0, width=32))
    else:  # anything: the formatter decides on all of them
        values = st.floats(-4.0, 4.0, width=32)
    return torch.tensor(draw(st.lists(values, min_size=count, max_size=count)), dtype=torch.float32).reshape(shape)


@st.composite
def classification_batches(draw, kind: str, labels_allowed: bool, invalid: bool = False,
                           extra_dims: bool = True):
    """Batches for ``kind``: ``(size, ignore_index, [(preds, target)])``. ``invalid``: some
    targets (and label preds) are not valid classes (never equal to ``ignore_index``)."""
    size = draw(st.integers(2, 5))
    ignore = draw(st.sampled_from([None, -1, 0, 1, 255]))
    classes = 2 if kind != "multiclass" else size
    extra = draw(st.sampled_from([(), (2,)])) if extra_dims else ()
    wrong = [v for v in (classes, classes + 1, -1, -100, 255, 7) if v != ignore]
    batches = []
    for _ in range(draw(st.integers(1, 3))):
        n = draw(st.integers(1, 9))
        shape = (n, size) + extra if kind == "multilabel" else (n,) + extra
        count = int(torch.Size(shape).numel())
        choices = [st.integers(0, classes - 1)]
        if ignore is not None:
            choices.append(st.just(ignore))
        if invalid:
            choices.append(st.sampled_from(wrong))
        target = torch.tensor(draw(st.lists(st.one_of(*choices), min_size=count, max_size=count)),
                              dtype=torch.int64).reshape(shape)
        preds_shape = (n, size) + extra if kind == "multiclass" else shape
        forms = ["probs", "logits", "mixed"] + (["labels"] if labels_allowed else [])
        form = draw(st.sampled_from(forms if not invalid else [f for f in forms if f != "mixed"]))
        if form == "labels":
            labels = [st.integers(0, classes - 1)] + ([st.sampled_from(wrong)] if invalid else [])
            preds = torch.tensor(draw(st.lists(st.one_of(*labels), min_size=count, max_size=count)),
                                 dtype=torch.int64).reshape(shape)
        else:
            preds = _floats(draw, preds_shape, form)
            if ignore is not None and draw(st.booleans()):  # logits at ignored positions only
                ignored = (target == ignore).unsqueeze(1) if kind == "multiclass" else target == ignore
                preds = torch.where(ignored.expand_as(preds), preds * 3 - 5, preds)
        batches.append((preds, target))
    return size, ignore, batches


def thresholds(draw) -> Any:
    form = draw(st.sampled_from(["int", "list", "tensor"]))
    if form == "int":
        return draw(st.integers(2, 7))
    values = draw(st.lists(st.floats(0, 1, width=32), min_size=1, max_size=6))
    return values if form == "list" else torch.tensor(values)


def reports(metric) -> Tuple[Optional[str], Any]:
    """``(the report raised at the first compute, or None; the next compute's outcome)``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with torch.no_grad():
                metric.compute()
            first = None
        except RuntimeError as exc:
            first = str(exc)
    return first, outcome(metric)


def curve_kwargs(draw, kind: str, metric_cls: type, validate: bool) -> Dict[str, Any]:
    """Binned-curve arguments: thresholds, and ``average`` of the multiclass curve (1.3.0+)."""
    chosen = thresholds(draw)
    kwargs: Dict[str, Any] = {"thresholds": chosen}
    if kind == "multiclass" and metric_cls is cls.MulticlassPrecisionRecallCurve and MULTICLASS_CURVE_AVERAGE:
        kwargs["average"] = draw(st.sampled_from([None, "micro", "macro"]))
    if isinstance(chosen, list) and validate:
        kwargs["thresholds"] = sorted(chosen)  # the release's validation wants them sorted
    return kwargs
