"""scalar_tensors: the counts and fill values of eight update functions made on the device, bit for bit."""
from __future__ import annotations

import importlib
import warnings

import pytest
import torch
from hypothesis import given, settings, strategies as st
from torchmetrics import classification as C, regression as R
from torchmetrics.text import Perplexity

import tmpatch
from tests.conftest import assert_bitwise, cpu_shortcuts, examples, release_in

FUNCTIONS = {  # module, function
    "exact_mc": ("torchmetrics.functional.classification.exact_match", "_multiclass_exact_match_update"),
    "exact_ml": ("torchmetrics.functional.classification.exact_match", "_multilabel_exact_match_update"),
    "hinge_bin": ("torchmetrics.functional.classification.hinge", "_binary_hinge_loss_update"),
    "hinge_mc": ("torchmetrics.functional.classification.hinge", "_multiclass_hinge_loss_update"),
    "ranking": ("torchmetrics.functional.classification.ranking", "_multilabel_ranking_average_precision_update"),
    "log_cosh": ("torchmetrics.functional.regression.log_cosh", "_log_cosh_error_update"),
    "tweedie": ("torchmetrics.functional.regression.tweedie_deviance", "_tweedie_deviance_score_update"),
    "perplexity": ("torchmetrics.functional.text.perplexity", "_perplexity_update"),
}
#: ExactMatch and LogCoshError came in 0.11.0
LATER = () if release_in(">=0.11.0") else ("exact_mc", "exact_ml", "log_cosh")
FUNCTIONS = {key: value for key, value in FUNCTIONS.items() if key not in LATER}


@pytest.fixture(autouse=True)
def _device_path():
    yield
    cpu_shortcuts(True)


def _apply(*others: str) -> None:
    row = next(r for r in tmpatch.apply(["scalar_tensors", *others]) if r.name == "scalar_tensors")
    assert row.state == "applied", row


def _function(key: str):
    module, name = FUNCTIONS[key]
    return getattr(importlib.import_module(module), name)


# -- sync ---------------------------------------------------------------------------------------
def _g(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _mc_hinge():
    return C.MulticlassHingeLoss(num_classes=3, multiclass_mode="one-vs-all", validate_args=False)


#: a metric, its update's arguments, and whether the patch leaves its update with no sync at all
CASES = {
    "MulticlassExactMatch": (lambda: C.MulticlassExactMatch(num_classes=3, validate_args=False),
                             lambda: (torch.randint(0, 3, (6, 4), generator=_g()),) * 2, True),
    "MultilabelExactMatch": (lambda: C.MultilabelExactMatch(num_labels=3, validate_args=False),
                             lambda: (torch.rand(6, 3, generator=_g()), torch.randint(0, 2, (6, 3), generator=_g())),
                             True),
    "BinaryHingeLoss": (lambda: C.BinaryHingeLoss(validate_args=False),
                        lambda: (torch.rand(6, generator=_g()), torch.randint(0, 2, (6,), generator=_g())), False),
    "MulticlassHingeLoss": (_mc_hinge, lambda: (torch.rand(6, 3, generator=_g()),
                                                torch.randint(0, 3, (6,), generator=_g())), False),
    "MultilabelRankingAveragePrecision": (
        lambda: C.MultilabelRankingAveragePrecision(num_labels=3, validate_args=False),
        lambda: (torch.rand(4, 3, generator=_g()), torch.randint(0, 2, (4, 3), generator=_g())), False),
    "LogCoshError": (lambda: R.LogCoshError(), lambda: (torch.rand(6, generator=_g()), torch.rand(6, generator=_g(1))),
                     True),
    "TweedieDevianceScore": (R.TweedieDevianceScore,
                             lambda: (torch.rand(6, generator=_g()), torch.rand(6, generator=_g(1))), True),
    "Perplexity": (lambda: Perplexity(ignore_index=-1),
                   lambda: (torch.rand(2, 4, 5, generator=_g()), torch.randint(0, 5, (2, 4), generator=_g())), False),
}
if LATER:
    for _name in ("MulticlassExactMatch", "MultilabelExactMatch", "LogCoshError"):
        del CASES[_name]
PATCHED_FUNCTIONS = {name for _, name in FUNCTIONS.values()}


def _copies(report):
    from tmpatch.audit import SyncKind

    return [p for p in report.of_kind(SyncKind.H2D_COPY) if p.function in PATCHED_FUNCTIONS]


def test_updates_copy_no_number_to_simulated_cuda():
    """Each class copies its number unpatched (the test can fail); patched, no copy is left in the
    eight functions, and the classes with no other sync make none in update() or forward()."""
    from tmpatch.audit import audit

    def run(name):
        build, args, clean = CASES[name]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return audit(build().update, *args(), real=False), audit(build(), *args(), real=False), clean

    for name in CASES:
        update, _, _ = run(name)
        assert _copies(update), (name, str(update))
    _apply("logits_check", "safe_divide")  # the formatters' read before 1.6.1, compute's copy in 1.4.x
    for name in CASES:
        update, forward, clean = run(name)
        assert not _copies(update) and not _copies(forward), (name, str(update), str(forward))
        if clean:
            assert update.count == 0 and forward.count == 0, (name, str(update), str(forward))


# -- same results -------------------------------------------------------------------------------
def _ints(draw, shape, high):
    n = 1
    for s in shape:
        n *= s
    values = draw(st.lists(st.integers(0, high - 1), min_size=n, max_size=n))
    return torch.tensor(values, dtype=torch.long).reshape(shape)


def _floats(draw, shape, low=-3.0, high=3.0, dtype=torch.float32):
    n = 1
    for s in shape:
        n *= s
    values = draw(st.lists(st.floats(low, high, width=32), min_size=n, max_size=n))
    return torch.tensor(values, dtype=torch.float64).reshape(shape).to(dtype)


@st.composite
def _calls(draw):
    """``(key, args, kwargs)`` for one of the eight functions."""
    key = draw(st.sampled_from(sorted(FUNCTIONS)))
    rows, cols = draw(st.integers(1, 5)), draw(st.integers(2, 4))
    dtype = draw(st.sampled_from([torch.float32, torch.float64, torch.float16]))
    if key == "exact_mc":
        shape = (rows, cols)
        preds, target = _ints(draw, shape, 3), _ints(draw, shape, 3)
        kwargs = {"multidim_average": draw(st.sampled_from(["global", "samplewise"]))}
        return key, (preds, target), kwargs
    if key == "exact_ml":
        shape = (rows, cols, draw(st.integers(1, 3)))
        preds, target = _ints(draw, shape, 2), _ints(draw, shape, 2)
        return key, (preds, target, cols), {"multidim_average": draw(st.sampled_from(["global", "samplewise"]))}
    if key == "hinge_bin":
        return key, (_floats(draw, (rows,), dtype=dtype), _ints(draw, (rows,), 2), draw(st.booleans())), {}
    if key == "hinge_mc":
        mode = draw(st.sampled_from(["crammer-singer", "one-vs-all"]))
        return key, (_floats(draw, (rows, cols), 0.0, 1.0, dtype), _ints(draw, (rows,), cols), draw(st.booleans()),
                     mode), {}
    if key == "ranking":
        return key, (_floats(draw, (rows, cols), dtype=dtype), _ints(draw, (rows, cols), 2)), {}
    if key == "log_cosh":
        shape = (rows,) if draw(st.booleans()) else (rows, cols)
        outputs = 1 if len(shape) == 1 else cols
        return key, (_floats(draw, shape, dtype=dtype), _floats(draw, shape, dtype=dtype), outputs), {}
    if key == "tweedie":
        power = draw(st.sampled_from([0.0, 1.0, 2.0, 3.0, 1.5, -1.0]))
        return key, (_floats(draw, (rows,), 0.125, 3.0, dtype), _floats(draw, (rows,), 0.125, 3.0, dtype), power), {}
    ignore = draw(st.sampled_from([None, -1, 2]))
    target = _ints(draw, (1, rows), cols)
    if ignore is not None and rows > 1:
        target[0, 0] = ignore
    return key, (_floats(draw, (1, rows, cols), dtype=torch.float32).softmax(-1), target, ignore), {}


def _flat(result):
    if isinstance(result, torch.Tensor):
        return [result]
    if isinstance(result, (tuple, list)):
        return [t for item in result for t in _flat(item)]
    return [torch.tensor(result)]  # a Python count


@settings(max_examples=examples(25), deadline=None)
@given(st.lists(st.tuples(_calls(), st.booleans()), min_size=1, max_size=8))
def test_functions_return_the_releases_tensors_bit_for_bit(calls):
    """The release's function (``get_original``) and the edited one, on the same arguments: the
    eight functions call no other patched code, so one apply serves every example."""
    _apply()
    for (key, args, kwargs), shortcuts in calls:
        cpu_shortcuts(shortcuts)
        function = _function(key)
        original = tmpatch.get_original(function)
        assert function is not original
        try:
            want = _flat(original(*args, **kwargs))
        except Exception as exc:  # noqa: BLE001 - the same error patched
            with pytest.raises(type(exc)):
                function(*args, **kwargs)
            continue
        got = _flat(function(*args, **kwargs))
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert_bitwise(a, b)


def test_metric_results_equal_the_releases():
    def run():
        out = {}
        for name, (build, args, _) in CASES.items():
            metric = build()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                metric.update(*args())
                first = metric(*args())
                out[name] = _flat(first) + _flat(metric.compute())
        return out

    want = run()
    _apply()
    cpu_shortcuts(False)
    got = run()
    for name in CASES:
        for a, b in zip(got[name], want[name]):
            assert_bitwise(a, b)
