"""wrapper_indices: MultioutputWrapper's index made on the device, BootStrapper's indices copied without blocking."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st
from torchmetrics import MeanSquaredError
from torchmetrics.classification import MulticlassAccuracy
from torchmetrics.wrappers import BootStrapper, MultioutputWrapper

import tmpatch
from tests.conftest import assert_bitwise, cpu_shortcuts, examples


@pytest.fixture(autouse=True)
def _device_path():
    yield
    cpu_shortcuts(True)


def _apply() -> None:
    row = next(r for r in tmpatch.apply(["wrapper_indices"]) if r.name == "wrapper_indices")
    assert row.state == "applied", row


def _g(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _pair(rows: int = 8, outputs: int = 2):
    return torch.rand(rows, outputs, generator=_g()), torch.rand(rows, outputs, generator=_g(1))


def _copies(report, function):
    from tmpatch.audit import SyncKind

    return [p for p in report.of_kind(SyncKind.H2D_COPY) if p.function == function]


# -- sync ---------------------------------------------------------------------------------------
def test_multioutput_index_is_made_on_simulated_cuda():
    from tmpatch.audit import audit
    from tmpatch.audit.panel.run import label_for

    def wrapper(remove_nans):
        return MultioutputWrapper(MeanSquaredError(), num_outputs=2, remove_nans=remove_nans)

    unpatched = audit(wrapper(False).update, *_pair(), real=False)
    assert len(_copies(unpatched, "_get_args_kwargs_by_output")) == 4, str(unpatched)  # 2 outputs x args, kwargs
    _apply()
    for call in (lambda m: m.update, lambda m: m):
        assert audit(call(wrapper(False)), *_pair(), real=False).count == 0
        kept = audit(call(wrapper(True)), *_pair(), real=False)  # the NaN-row removal stays, labelled inherent
        assert kept.count and {label_for(p).category for p in kept.sync_points} == {"inherent"}, str(kept)


def test_bootstrap_indices_are_copied_without_blocking_on_simulated_cuda():
    """Unpatched: a blocking copy per bootstrap. Patched: copies from pinned memory, non-blocking
    (no sync; an audit that cannot simulate pinned memory sees the non-blocking copies)."""
    from tmpatch.audit import SyncKind, audit

    def booted():
        return BootStrapper(MeanSquaredError(), num_bootstraps=3, sampling_strategy="multinomial")

    unpatched = audit(booted().update, torch.rand(8), torch.rand(8), real=False)
    copies = [p for p in unpatched.of_kind(SyncKind.H2D_COPY) if p.function == "update"]
    assert len(copies) == 3 and all(p.detail.startswith("blocking") for p in copies), str(unpatched)
    _apply()
    for call in (lambda m: m.update, lambda m: m):
        patched = audit(call(booted()), torch.rand(8), torch.rand(8), real=False)
        if hasattr(SyncKind, "PINNED_COPY"):  # an audit that knows pinned memory
            assert patched.count == 0, str(patched)
        else:
            assert patched.count and all(p.kind is SyncKind.H2D_COPY and p.detail.startswith("non_blocking")
                                         for p in patched.sync_points), str(patched)


def test_bootstrap_indices_go_through_pinned_memory(monkeypatch):
    from tmpatch.audit import simulated_cuda
    from tmpatch.patches.wrapper_indices import _copy_names

    to_device = _copy_names(None)["_tmpatch_to_device"]
    pinned = []

    def pin_memory(self):
        pinned.append(self)
        return self

    monkeypatch.setattr(torch.Tensor, "pin_memory", pin_memory)
    indices = torch.tensor([3, 1, 1, 0])
    with simulated_cuda("cuda:0") as sim:
        out = to_device(indices, torch.device("cuda:0"))
        assert out.device == torch.device("cuda:0") and out.dtype == torch.int64 and out.shape == (4,)
        assert len(sim.sync_points) == 1 and sim.sync_points[0].detail.startswith("non_blocking")
    assert len(pinned) == 1
    assert to_device(indices, "cpu") is indices  # off CUDA, the release's .to()


# -- same results -------------------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore:The ``compute`` method")  # a bootstrap that drew no sample
@settings(max_examples=examples(10), deadline=None)
@given(st.sampled_from(["poisson", "multinomial"]), st.integers(0, 2**16), st.integers(1, 9), st.booleans())
def test_bootstrap_draws_the_releases_samples(strategy, seed, rows, forward):
    """The same generator, the same draws: the bootstrapped states and results are the release's."""
    def run():
        torch.manual_seed(seed)
        metric = BootStrapper(MeanSquaredError(), num_bootstraps=4, sampling_strategy=strategy, raw=True)
        for step in range(2):
            args = (torch.rand(rows, generator=_g(step)), torch.rand(rows, generator=_g(step + 9)))
            (metric if forward else metric.update)(*args)
        states = [t for m in metric.metrics for t in (m.sum_squared_error, m.total)]
        return states + [metric.compute()["raw"], torch.rand(3)]  # and the generator's state after

    tmpatch.revert()
    want = run()
    _apply()
    for a, b in zip(run(), want):
        assert_bitwise(a, b)


@settings(max_examples=examples(10), deadline=None)
@given(st.integers(1, 3), st.integers(1, 6), st.booleans(), st.booleans())
def test_multioutput_results_equal_the_releases(outputs, rows, remove_nans, squeeze):
    preds, target = torch.rand(rows, outputs, generator=_g()), torch.rand(rows, outputs, generator=_g(1))
    preds[0, 0] = float("nan")
    labels = torch.randint(0, 3, (rows, outputs), generator=_g(2))

    def run():
        out = []
        regression = MultioutputWrapper(MeanSquaredError(), outputs, remove_nans=remove_nans,
                                        squeeze_outputs=squeeze)
        try:
            regression.update(preds, target=target)
        except RuntimeError as exc:  # before 1.0.0 keyword arguments are not squeezed: the release raises
            out.append(f"RuntimeError: {exc}")
            regression.reset()
        classification = MultioutputWrapper(MulticlassAccuracy(3, validate_args=False), outputs)
        classification.update(labels, labels.flip(0))
        results = [regression.compute(), classification.compute(), regression(preds, target)]
        for result in results:  # a list of tensors before 1.0.0, stacked after
            out.extend(result if isinstance(result, list) else [result])
        return out

    tmpatch.revert()
    want = run()
    _apply()
    cpu_shortcuts(False)
    got = run()
    assert len(got) == len(want)
    for a, b in zip(got, want):
        if isinstance(b, str):
            assert a == b
        else:
            assert_bitwise(a, b)
