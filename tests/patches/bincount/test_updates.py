"""bincount's edited code-making statements (updates.py): outside a recorded update the
release's codes (in one op where both classes are int64: the same int64 arithmetic, bit for
bit, overflow included) and its confusion-matrix statistics in one kernel fewer; in a
recorded update, the release's codes, those outside the count's bins (and the positions the release
removes) past them."""
from __future__ import annotations

import torch
from hypothesis import given, settings, strategies as st
from torchmetrics import classification as cls

from tests.conftest import assert_bitwise, examples
from tmpatch.patches.bincount import counting, updates

INT64 = st.integers(-(2**63), 2**63 - 1)


@settings(max_examples=examples(60), deadline=None)
@given(st.lists(st.tuples(INT64, INT64), min_size=0, max_size=20), st.integers(1, 2**31 - 1))
def test_outside_a_recorded_update_the_class_codes_are_the_releases(pairs, n):
    preds = torch.tensor([p for p, _ in pairs], dtype=torch.int64)
    target = torch.tensor([t for _, t in pairs], dtype=torch.int64)
    assert_bitwise(updates.class_codes(preds, target, n), target.to(torch.long) * n + preds.to(torch.long))
    assert updates.class_codes(preds, target, n, ignore_index=0) is None  # its removal first: the release's
    assert updates.class_codes(preds.int(), target.int(), n) is None


@settings(max_examples=examples(60), deadline=None)
@given(st.lists(st.tuples(st.booleans(), INT64), min_size=0, max_size=20))
def test_outside_a_recorded_update_the_binary_codes_are_the_releases(pairs):
    target = torch.tensor([t for _, t in pairs], dtype=torch.int64)
    for preds in (torch.tensor([p for p, _ in pairs], dtype=torch.bool),
                  torch.tensor([int(p) for p, _ in pairs], dtype=torch.int64)):
        assert_bitwise(updates.binary_codes(preds, target), (target * 2 + preds).to(torch.long))


@settings(max_examples=examples(60), deadline=None)
@given(st.integers(1, 12), st.integers(0, 400), st.integers(0, 2**31))
def test_the_statistics_of_a_confusion_matrix_are_the_releases(n, total, seed):
    confmat = torch.randint(0, max(1, total), (n, n), generator=torch.Generator().manual_seed(seed))
    tp = confmat.diag()
    fp = confmat.sum(0) - tp
    fn = confmat.sum(1) - tp
    tn = confmat.sum() - (fp + fn + tp)
    for got, want in zip(updates.confmat_stats(confmat), (tp, fp, fn, tn)):
        assert_bitwise(got, want)


@settings(max_examples=examples(40), deadline=None)
@given(st.integers(1, 9), st.lists(st.integers(-12, 20), min_size=1, max_size=30), st.booleans())
def test_in_a_recorded_update_the_releases_codes_count_in_its_bins(n, targets, labels):
    """The release's codes ``target * n + preds`` where they lie in its ``n * n`` bins (an invalid
    class included: the release counts it there); every other code past the bins (wrapped)."""
    target = torch.tensor(targets)
    preds = torch.arange(len(targets)) % n if labels else (torch.arange(len(targets)) % (n + 4)) - 2
    metric = cls.MulticlassStatScores(num_classes=n, validate_args=False)
    update = counting.Update(metric, labels=labels)
    token = counting.current.set(update)
    try:
        codes = updates.class_codes(preds, target, n)
    finally:
        counting.current.reset(token)
    release = target * n + preds
    inside = (release >= 0) & (release < n * n)
    assert torch.equal(codes[inside], release[inside])
    assert bool(((codes >= -update.space) & (codes < update.space)).all())
    assert bool(((codes[~inside] % update.space) >= n * n).all())  # wrapped: past the bins
