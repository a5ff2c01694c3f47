"""classification_masks: hinge losses and coverage error select on the device, bit for bit as the release."""
from __future__ import annotations

import torch
from hypothesis import given, settings, strategies as st
from torchmetrics.classification import BinaryHingeLoss, MulticlassHingeLoss, MultilabelCoverageError
from torchmetrics.functional.classification import binary_hinge_loss, multiclass_hinge_loss

import tmpatch
from tests.conftest import assert_bitwise, examples, release_in

C = 4
#: name -> (build, batch maker); validate_args=False: validation reads the data by design
CLASSES = {
    "BinaryHingeLoss": lambda **kw: BinaryHingeLoss(validate_args=False, **kw),
    "MulticlassHingeLoss": lambda **kw: MulticlassHingeLoss(num_classes=C, validate_args=False, **kw),
    "MulticlassHingeLoss(ova)": lambda **kw: MulticlassHingeLoss(num_classes=C, multiclass_mode="one-vs-all",
                                                                 validate_args=False, **kw),
    "MultilabelCoverageError": lambda **kw: MultilabelCoverageError(num_labels=C, validate_args=False, **kw),
}
FUNCTIONS = {
    "BinaryHingeLoss": "_binary_hinge_loss_update",
    "MulticlassHingeLoss": "_multiclass_hinge_loss_update",
    "MulticlassHingeLoss(ova)": "_multiclass_hinge_loss_update",
    "MultilabelCoverageError": "_multilabel_coverage_error_update",
}


def _apply() -> None:
    row = next(r for r in tmpatch.apply(["classification_masks"]) if r.name == "classification_masks")
    assert row.state == "applied", row


def _batch(name: str, preds: torch.Tensor, labels: torch.Tensor):
    """``preds`` (n, C) scores and ``labels`` (n, C) in {0, 1}, shaped for the metric."""
    if name == "BinaryHingeLoss":
        return preds[:, 0], labels[:, 0]
    if name.startswith("Multiclass"):
        return preds, labels.argmax(1)
    return preds, labels


def _points(metric, *args):
    """The sync points of ``metric.update(*args)`` on simulated CUDA, also where the simulation
    cannot go on (the release's crammer-singer margin takes every element for ``preds[target]``)."""
    from tmpatch.audit import simulated_cuda

    with simulated_cuda("cuda:0") as sim:
        sim.put(metric)
        args = sim.put(args)
        del sim.sync_points[:]
        try:
            metric.update(*args)
        except RuntimeError:
            pass
        return list(sim.sync_points)


# -- sync ---------------------------------------------------------------------------------------
def test_updates_select_without_a_sync_on_simulated_cuda():
    """Unpatched: a boolean index or a mask assignment of a tensor in each update function (and,
    before 1.6.1, the multiclass softmax read). Patched: none; what is left is the release's
    ``tensor(target.shape[0], device=...)`` copy of the hinge count (a host value made a tensor)."""
    g = torch.Generator().manual_seed(0)
    scores, labels = torch.rand(16, C, generator=g), torch.randint(0, 2, (16, C), generator=g)
    for name, build in CLASSES.items():
        mine = [p for p in _points(build(), *_batch(name, scores, labels)) if p.function == FUNCTIONS[name]]
        assert {p.op for p in mine} & {"aten.index", "aten.index_put_"}, (name, mine)
    _apply()
    for name, build in CLASSES.items():
        for call in (build().update, build()):
            from tmpatch.audit import audit

            report = audit(call, *_batch(name, scores, labels), real=False)
            left = [p for p in report.sync_points if p.kind.value != "host-to-device copy"
                    and p.function != "compute"]  # the coverage error's compute reads its count (int(total))
            assert report.error is None and not left, (name, str(report))


# -- same results ---------------------------------------------------------------------------------
_VALUES = st.one_of(st.floats(-4, 4, width=32), st.sampled_from([0.0, -0.0, 1.0, float("inf"), -float("inf"),
                                                                   float("nan")]))


@st.composite
def _cases(draw):
    dtype = draw(st.sampled_from([torch.float32, torch.float64, torch.bfloat16]))
    batches = []
    for _ in range(draw(st.integers(1, 3))):
        n = draw(st.integers(1, 6))
        preds = torch.tensor(draw(st.lists(_VALUES, min_size=n * C, max_size=n * C))).view(n, C).to(dtype)
        labels = torch.tensor(draw(st.lists(st.integers(0, 1), min_size=n * C, max_size=n * C))).view(n, C)
        batches.append((preds, labels))
    return dict(squared=draw(st.booleans()), forward=draw(st.booleans()), batches=batches)


def _run(case, name):
    kw = {} if name == "MultilabelCoverageError" else {"squared": case["squared"]}
    metric = CLASSES[name](**kw)
    grads = []
    for preds, labels in case["batches"]:
        preds = preds.clone().requires_grad_(name != "MultilabelCoverageError")
        out = (metric if case["forward"] else metric.update)(*_batch(name, preds, labels))
        if case["forward"] and preds.requires_grad and out.requires_grad:
            out.sum().backward()
            grads.append(preds.grad)
    return [getattr(metric, k).detach() for k in sorted(metric._defaults)] + [metric.compute().detach()], grads


@settings(max_examples=examples(5), deadline=None)
@given(st.lists(_cases(), min_size=1, max_size=4))
def test_states_results_and_gradients_equal_the_releases(cases):
    """Several cases per example (one revert/apply for all of them: the slow part)."""
    tmpatch.revert()
    expected = [{name: _run(case, name) for name in CLASSES} for case in cases]
    _apply()
    signless = release_in("<1.6.1")  # sigmoid/softmax selections: a zero gradient may come back as +0.0
    for case, want in zip(cases, expected):
        for name in CLASSES:
            (values, grads), (want_values, want_grads) = _run(case, name), want[name]
            assert len(values) == len(want_values) and len(grads) == len(want_grads)
            for a, b in zip(values, want_values):
                assert_bitwise(a, b)
            for a, b in zip(grads, want_grads):
                if signless:
                    a, b = a + 0.0, b + 0.0
                assert_bitwise(a, b)


def test_functional_api_takes_the_edited_code_too():
    g = torch.Generator().manual_seed(1)
    preds, target = torch.randn(9, C, generator=g), torch.randint(0, C, (9,), generator=g)
    calls = [lambda: binary_hinge_loss(preds[:, 0], (target > 1).long()),
             lambda: multiclass_hinge_loss(preds, target, C),
             lambda: multiclass_hinge_loss(preds, target, C, squared=True, multiclass_mode="one-vs-all")]
    want = [call() for call in calls]
    _apply()
    for call, expected in zip(calls, want):
        assert_bitwise(call(), expected)


# -- inputs the edits leave to the release ------------------------------------------------------------
def test_inputs_outside_the_edits_behave_as_in_the_release():
    """A single column (one-hot of two classes against one score: the release's mask does not fit)
    and an empty batch raise the release's errors; integer probabilities take its statements."""
    def outcomes():
        out = []
        for call in (lambda: multiclass_hinge_loss(torch.rand(3, 1), torch.zeros(3, dtype=torch.long), 1),
                     lambda: multiclass_hinge_loss(torch.rand(0, C), torch.zeros(0, dtype=torch.long), C),
                     lambda: multiclass_hinge_loss(torch.tensor([[0, 1], [1, 0]]), torch.tensor([1, 1]), 2)):
            try:
                out.append(call())
            except (RuntimeError, IndexError) as exc:
                out.append(type(exc))
        return out

    want = outcomes()
    _apply()
    for got, expected in zip(outcomes(), want):
        if isinstance(expected, torch.Tensor):
            assert_bitwise(got, expected)
        else:
            assert got is expected


def test_excluded_the_release_runs():
    # scalar_tensors edits the hinge updates too (its own tests): both out, the release runs
    tmpatch.apply(exclude=["classification_masks", "scalar_tensors"])
    from torchmetrics.functional.classification import hinge, ranking

    for function in (hinge._binary_hinge_loss_update, hinge._multiclass_hinge_loss_update,
                     ranking._multilabel_coverage_error_update):
        assert not tmpatch.is_patched(function)
