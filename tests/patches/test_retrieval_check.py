"""retrieval_check: the retrieval metrics' binary-target check without a sync; its error at compute()."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st
from torchmetrics import retrieval as R
from torchmetrics.functional import retrieval as F

import tmpatch
from tests.conftest import assert_bitwise, cpu_shortcuts, examples
from tests.patches.eager import assert_eager_is_the_release
from tmpatch.runtime import deferred

#: one class per release ``update`` (RetrievalMetric's and RetrievalPrecisionRecallCurve's) and a few heirs
CLASSES = {
    "RetrievalMAP": lambda **kw: R.RetrievalMAP(**kw),
    "RetrievalMRR": lambda **kw: R.RetrievalMRR(**kw),
    "RetrievalPrecision": lambda **kw: R.RetrievalPrecision(top_k=2, **kw),
    "RetrievalPrecisionRecallCurve": lambda **kw: R.RetrievalPrecisionRecallCurve(max_k=3, **kw),
    "RetrievalRecallAtFixedPrecision": lambda **kw: R.RetrievalRecallAtFixedPrecision(min_precision=0.5, **kw),
}
TARGET_DTYPES = [torch.bool, torch.int32, torch.int64, torch.float16, torch.float32, torch.float64]


@pytest.fixture(autouse=True)
def _device_path():
    yield
    cpu_shortcuts(True)


def _apply() -> None:
    row = next(r for r in tmpatch.apply(["retrieval_check"]) if r.name == "retrieval_check")
    assert row.state == "applied", row


def _batch(n: int = 12, dtype=torch.int64, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    preds = torch.rand(n, generator=g)
    target = torch.randint(0, 2, (n,), generator=g).to(dtype)
    indexes = torch.randint(0, 3, (n,), generator=g)
    return preds, target, indexes


def _states(metric):
    return [torch.cat(getattr(metric, name)) for name in ("indexes", "preds", "target")]


def _values(result):
    return [result] if isinstance(result, torch.Tensor) else [t for item in result for t in _values(item)]


# -- sync ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.int64, torch.float32])
def test_update_is_sync_free_on_simulated_cuda(dtype):
    from tmpatch.audit import audit

    preds, target, indexes = _batch(dtype=dtype)
    for name in sorted(CLASSES):
        unpatched = audit(CLASSES[name]().update, preds, target, indexes=indexes, real=False)
        reads = [p for p in unpatched.sync_points if p.function == "_check_retrieval_target_and_prediction_types"]
        assert reads and {p.op for p in reads} == {"aten._local_scalar_dense"}, (name, str(unpatched))
    _apply()
    for name in sorted(CLASSES):
        for shortcuts in (True, False):  # the CPU flag must not matter on CUDA
            cpu_shortcuts(shortcuts)
            patched = audit(CLASSES[name]().update, preds, target, indexes=indexes, real=False)
            assert patched.count == 0, (name, str(patched))


def test_ignore_index_removal_stays_and_is_labelled_inherent():
    from tmpatch.audit import audit
    from tmpatch.audit.panel.run import label_for

    preds, target, indexes = _batch()
    target[::4] = -100
    _apply()
    patched = audit(R.RetrievalMAP(ignore_index=-100).update, preds, target, indexes=indexes, real=False)
    assert patched.count and all(p.function == "_check_retrieval_inputs" for p in patched.sync_points), str(patched)
    assert {label_for(p).category for p in patched.sync_points} == {"inherent"}


# -- same results ---------------------------------------------------------------------------------
@st.composite
def _batches(draw):
    dtype = draw(st.sampled_from(TARGET_DTYPES))
    ignore = draw(st.sampled_from([None, -1]))
    out = []
    for _ in range(draw(st.integers(1, 3))):
        n = draw(st.integers(1, 10))
        values = st.integers(0, 1) if ignore is None or dtype is torch.bool else st.sampled_from([0, 1, ignore])
        target = draw(st.lists(values, min_size=n, max_size=n))
        if ignore is not None and all(t == ignore for t in target):
            target[0] = 1  # upstream raises on a batch left empty
        preds = draw(st.lists(st.floats(-3, 3, width=32), min_size=n, max_size=n))
        indexes = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
        out.append((torch.tensor(preds), torch.tensor(target).to(dtype), torch.tensor(indexes)))
    return ignore, out


def _run(case, build):
    """A metric built now, fed the case's batches (``forward`` or ``update``)."""
    (ignore, batches), forward = case[:2]
    metric = build(ignore_index=ignore)
    for p, t, i in batches:
        (metric if forward else metric.update)(p, t, indexes=i)
    return metric


@settings(max_examples=examples(6), deadline=None)
@given(st.lists(st.tuples(_batches(), st.booleans(), st.booleans()), min_size=1, max_size=6))
def test_states_and_results_equal_the_releases(cases):
    """Several cases per example: one revert/apply for all of them (the slow part)."""
    tmpatch.revert()
    expected = [{name: _run(case, build) for name, build in CLASSES.items()} for case in cases]
    _apply()
    for case, want in zip(cases, expected):
        cpu_shortcuts(case[2])
        for name, build in CLASSES.items():
            metric = _run(case, build)
            for got, exp in zip(_states(metric), _states(want[name])):
                assert_bitwise(got, exp)
            assert int(deferred.local_records(metric).get("retrieval_check", 0)) == 0
            for got, exp in zip(_values(metric.compute()), _values(want[name].compute())):
                assert_bitwise(got, exp)


# -- the check, at compute ---------------------------------------------------------------------------
BAD_TARGETS = {  # query 0 sums to 0 (skipped by compute), query 1 has a positive
    "int 2 and -2": torch.tensor([2, -2, 0, 1]),
    "int -1 and 1": torch.tensor([-1, 1, 1, 0]),
    "float 1.5 and -1.5": torch.tensor([1.5, -1.5, 1.0, 0.0]),
    "float64 just above 1": torch.tensor([1.0 + 2**-40, -(1.0 + 2**-40), 1.0, 1.0], dtype=torch.float64),
}


def _outcomes(metric, steps):
    """Each step's result or error (type, message), as a user sees it."""
    out = []
    for step in steps:
        try:
            value = step(metric)
            out.append(("ok", None if value is None else [v.tolist() for v in _values(value)]))
        except Exception as exc:  # noqa: BLE001 - the outcome compared
            out.append((type(exc).__name__, str(exc)))
    return out


#: the forward of a bad batch, then compute(), reset() and a good epoch (the report's example)
EPOCHS = [
    lambda m: m(torch.tensor([.1, .2, .3]), torch.tensor([0, 2, 1]), indexes=torch.tensor([0, 0, 0])),
    lambda m: m.compute(),
    lambda m: m.reset(),
    lambda m: m.update(torch.tensor([.1, .2, .3, .4]), torch.tensor([0, 1, 1, 0]), indexes=torch.tensor([0, 0, 0, 0])),
    lambda m: m.compute(),
]


@pytest.mark.parametrize("held", [False, True])
@pytest.mark.parametrize("bad", sorted(BAD_TARGETS))
def test_on_the_cpu_every_call_is_the_releases(bad, held, monkeypatch):
    """The release's check, from the same update, before the batch is appended: forward, update,
    compute, reset and the next epoch give what the release gives, call by call."""
    if held:  # nothing waits for a settle point on the CPU either
        from tmpatch.runtime.deferred import landing

        monkeypatch.setattr(landing, "read_at_once", lambda tensor: False)
        monkeypatch.setattr(landing, "new_event", lambda device: landing.NEVER)
    preds, indexes = torch.tensor([0.2, 0.7, 0.4, 0.3]), torch.tensor([0, 0, 1, 1])
    steps = EPOCHS + [
        lambda m: m.update(preds, torch.tensor([0, 1, 1, 0]), indexes=indexes),
        lambda m: m.update(preds, BAD_TARGETS[bad], indexes=indexes),
        lambda m: m.compute(),
        lambda m: m(preds, BAD_TARGETS[bad], indexes=indexes),
        lambda m: m.compute(),
        lambda m: m.reset(),
        lambda m: m.compute(),
    ]
    for name, build in CLASSES.items():
        tmpatch.revert()
        expected = _outcomes(build(), steps)
        _apply()
        metric = build()
        assert _outcomes(metric, steps) == expected, name
        assert not deferred.pending(metric)
    assert expected[:5] == [("ValueError", "`target` must contain `binary` values"), expected[1], ("ok", None),
                            ("ok", None), expected[4]] and expected[1][0] == "ValueError"


@pytest.mark.usefixtures("held_reports")  # at compute(), as on a GPU before the copy lands
def test_on_a_device_the_releases_error_comes_once_at_the_next_compute():
    """The bad values sit in a query that compute() skips (no positive target: its sum is 0),
    so the release's compute, which checks each query again, passes and the report is ours:
    the release's type and words first, tmpatch's note after them, once."""
    preds, indexes = torch.tensor([0.2, 0.7, 0.4, 0.3]), torch.tensor([0, 0, 1, 1])
    for target in BAD_TARGETS.values():
        with pytest.raises(ValueError, match="^`target` must contain `binary` values$"):  # upstream: in update()
            R.RetrievalMAP().update(preds, target, indexes=indexes)
    _apply()
    cpu_shortcuts(False)
    for target in BAD_TARGETS.values():
        metric = R.RetrievalMAP()
        metric.update(preds, target, indexes=indexes)  # no error here
        metric.update(preds, target, indexes=indexes)
        metric.update(preds, torch.tensor([0, 0, 0, 1]), indexes=indexes)
        with pytest.raises(ValueError,
                           match=r"^`target` must contain `binary` values \(tmpatch retrieval_check: 2 upd"):
            metric.compute()
        metric.compute()  # reported once
        metric.update(preds, target, indexes=indexes)
        with pytest.raises(ValueError, match=r"^`target` must contain `binary` values .*reported at reset\(\)"):
            metric.reset()  # the batch is dropped: its report comes there, once
        assert metric._update_count == 0 and not metric.preds  # the reset was done all the same
        metric.update(preds, torch.tensor([0, 1, 1, 0]), indexes=indexes)
        metric.compute()


@pytest.mark.usefixtures("held_reports")  # at compute(), as on a GPU before the copy lands
def test_on_a_device_reset_is_never_blocked_by_the_report():
    """The report's example on the device path: the bad batch is in the states (the deliberate
    difference there), so the release's compute checks it and raises its own error; reset()
    gives the deferred report once, after resetting; the next good epoch is the release's."""
    tmpatch.revert()
    expected = _outcomes(R.RetrievalMAP(), EPOCHS)
    _apply()
    cpu_shortcuts(False)
    got = _outcomes(R.RetrievalMAP(), EPOCHS)
    assert got[0] == expected[0] == ("ValueError", "`target` must contain `binary` values")  # forward's compute
    assert got[1] == ("ValueError", "`target` must contain `binary` values")  # the release's compute, batch kept
    assert got[2][0] == "ValueError" and got[2][1].startswith(
        "`target` must contain `binary` values (tmpatch retrieval_check: 1 update(s) of RetrievalMAP"), got[2]
    assert got[3:] == expected[3:] and expected[4] == ("ok", [pytest.approx(0.5833, abs=1e-4)])


@pytest.mark.usefixtures("held_reports")  # at compute(), as on a GPU before the copy lands
def test_where_the_releases_compute_checks_the_query_its_error_comes_first():
    """A bad value in a query compute() evaluates: the release's compute raises its own
    error (the batch is in the states) until reset(); reset() resets and gives the report, once."""
    _apply()
    cpu_shortcuts(False)
    metric = R.RetrievalMAP()
    metric.update(torch.tensor([0.2, 0.7]), torch.tensor([1, 2]), indexes=torch.tensor([0, 0]))
    for _ in range(2):
        with pytest.raises(ValueError, match="^`target` must contain `binary` values$"):
            metric.compute()
    assert deferred.local_records(metric)
    with pytest.raises(ValueError, match=r"tmpatch retrieval_check: 1 update.*reported at reset\(\)"):
        metric.reset()
    assert not deferred.local_records(metric)
    metric.update(torch.tensor([0.2, 0.7]), torch.tensor([0, 1]), indexes=torch.tensor([0, 0]))
    assert metric.compute() == 1.0


@pytest.mark.usefixtures("held_reports")  # at compute(), as on a GPU before the copy lands
def test_a_collections_reset_resets_every_member_before_the_report():
    from torchmetrics import MetricCollection

    _apply()
    cpu_shortcuts(False)
    collection = MetricCollection([R.RetrievalMAP(), R.RetrievalMRR()])
    collection.update(torch.tensor([0.2, 0.7]), torch.tensor([0, 3]), indexes=torch.tensor([0, 0]))
    with pytest.raises(ValueError, match=r"^`target` must contain `binary` values \(tmpatch retrieval_check: 2 upd"):
        collection.reset()
    assert all(m._update_count == 0 and not m.preds for m in collection.values())
    collection.reset()


def test_nan_targets_pass_as_in_the_release():
    """``max() > 1`` and ``min() < 0`` are False for a NaN maximum: the release lets it pass."""
    preds, indexes = torch.tensor([0.2, 0.7, 0.4]), torch.tensor([0, 0, 1])
    target = torch.tensor([0.0, float("nan"), 5.0])
    R.RetrievalMAP().update(preds, target, indexes=indexes)  # upstream: no error
    _apply()
    for shortcuts in (True, False):
        cpu_shortcuts(shortcuts)
        metric = R.RetrievalMAP()
        metric.update(preds, target, indexes=indexes)
        assert int(deferred.local_records(metric).get("retrieval_check", 0)) == 0


@pytest.mark.usefixtures("held_reports")  # at compute(), as on a GPU before the copy lands
def test_forward_reports_at_the_users_compute_not_inside_forward():
    _apply()
    cpu_shortcuts(False)
    metric = R.RetrievalMRR()
    metric(torch.tensor([0.2, 0.7]), torch.tensor([0, 1]), indexes=torch.tensor([1, 1]))
    metric(torch.tensor([0.2, 0.7]), torch.tensor([3, -3]), indexes=torch.tensor([0, 0]))  # forward's compute skips it
    with pytest.raises(ValueError, match="1 update"):
        metric.compute()


def test_dtype_errors_stay_in_update():
    _apply()
    metric = R.RetrievalMAP()
    with pytest.raises(ValueError, match="`preds` must be a tensor of floats"):
        metric.update(torch.tensor([1, 0]), torch.tensor([0, 1]), indexes=torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="`target` must be a tensor of booleans, integers or floats"):
        metric.update(torch.tensor([0.1, 0.2]), torch.tensor([0, 1], dtype=torch.uint8), indexes=torch.tensor([0, 0]))


def test_functional_api_metrics_built_before_apply_and_ndcg_keep_the_release():
    early = R.RetrievalMAP()
    _apply()
    preds, indexes = torch.tensor([0.2, 0.7]), torch.tensor([0, 0])
    with pytest.raises(ValueError, match="`target` must contain `binary` values$"):
        F.retrieval_average_precision(preds, torch.tensor([0, 2]))
    with pytest.raises(ValueError, match="`target` must contain `binary` values$"):
        early.update(preds, torch.tensor([0, 2]), indexes=indexes)
    ndcg = R.RetrievalNormalizedDCG()  # non-binary targets are allowed: no check, nothing recorded
    ndcg.update(preds, torch.tensor([0, 3]), indexes=indexes)
    assert not deferred.local_records(ndcg)
    ndcg.compute()


def test_excluded_the_release_raises_in_update():
    tmpatch.apply(exclude=["retrieval_check"])
    with pytest.raises(ValueError, match="`target` must contain `binary` values$"):
        R.RetrievalMAP().update(torch.tensor([0.2, 0.7]), torch.tensor([0, 2]), indexes=torch.tensor([0, 0]))


@pytest.mark.parametrize("shortcuts", [True, False])
@pytest.mark.parametrize("bad", sorted(BAD_TARGETS))
def test_the_eager_policy_raises_the_releases_error_in_update(bad, shortcuts):
    preds, indexes = torch.tensor([0.2, 0.7, 0.4, 0.3]), torch.tensor([0, 0, 1, 1])
    good = (preds, torch.tensor([0, 1, 1, 0]), indexes)
    assert_eager_is_the_release(R.RetrievalMAP, [good], (preds, BAD_TARGETS[bad], indexes), ["retrieval_check"],
                                shortcuts)
