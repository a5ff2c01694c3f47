"""perplexity_mask: Perplexity without ignore_index takes every token without a mask, as the release."""
from __future__ import annotations

import importlib

import torch
from hypothesis import given, settings, strategies as st
from torchmetrics.functional.text.perplexity import perplexity
from torchmetrics.text import Perplexity

import tmpatch
from tests.conftest import assert_bitwise, examples


def _apply() -> None:
    row = next(r for r in tmpatch.apply(["perplexity_mask"]) if r.name == "perplexity_mask")
    assert row.state == "applied", row


def _batch(seed: int, n: int = 2, length: int = 5, vocab: int = 7):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, length, vocab, generator=g), torch.randint(0, vocab, (n, length), generator=g)


# -- sync ---------------------------------------------------------------------------------------
def test_update_and_forward_have_no_sync_without_ignore_index_on_simulated_cuda():
    """Unpatched: the boolean index by the all-True mask. Patched: none. With ignore_index the
    release's selection stays (see the patch)."""
    from tmpatch.audit import audit

    preds, target = _batch(0)
    unpatched = audit(Perplexity().update, preds, target, real=False)
    assert unpatched.count and {p.op for p in unpatched.sync_points} == {"aten.index"}, str(unpatched)
    _apply()
    for call in (Perplexity().update, Perplexity()):
        report = audit(call, preds, target, real=False)
        assert report.error is None and report.count == 0, str(report)
    kept = audit(Perplexity(ignore_index=-100).update, preds, target, real=False)
    assert "aten.index" in [p.op for p in kept.sync_points]


# -- same results ---------------------------------------------------------------------------------
@st.composite
def _cases(draw):
    n, length, vocab = draw(st.integers(1, 3)), draw(st.integers(1, 6)), draw(st.integers(2, 6))
    logits = draw(st.lists(st.one_of(st.floats(-20, 20, width=32), st.sampled_from([float("-inf"), 0.0, -0.0])),
                           min_size=n * length * vocab, max_size=n * length * vocab))
    labels = draw(st.lists(st.integers(-1, vocab - 1), min_size=n * length, max_size=n * length))
    ignore = draw(st.sampled_from([None, -1]))
    labels = [max(label, 0) if ignore is None else label for label in labels]
    preds = torch.tensor(logits).view(n, length, vocab).to(draw(st.sampled_from([torch.float32, torch.float64])))
    return preds, torch.tensor(labels).view(n, length), ignore, draw(st.booleans())


def _run(case):
    preds, target, ignore, forward = case
    preds = preds.clone().requires_grad_(True)
    metric = Perplexity(ignore_index=ignore)
    out = []
    if forward:
        value = metric(preds, target)
        value.backward()
        out += [value.detach(), preds.grad]
    else:
        metric.update(preds, target)
    return out + [metric.total_log_probs.detach(), metric.count, metric.compute().detach()]


@settings(max_examples=examples(6), deadline=None)
@given(st.lists(_cases(), min_size=1, max_size=6))
def test_states_results_and_gradients_equal_the_releases(cases):
    tmpatch.revert()
    want = [_run(case) for case in cases]
    _apply()
    for case, expected in zip(cases, want):
        for got, exp in zip(_run(case), expected):
            assert_bitwise(got, exp)


def test_functional_api_and_the_release_when_excluded():
    module = importlib.import_module("torchmetrics.functional.text.perplexity")

    preds, target = _batch(1)
    want = perplexity(preds, target)
    _apply()
    assert_bitwise(perplexity(preds, target), want)
    tmpatch.revert()
    tmpatch.apply(exclude=["perplexity_mask", "scalar_tensors"])  # scalar_tensors edits it too
    assert not tmpatch.is_patched(module._perplexity_update)
