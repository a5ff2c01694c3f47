"""update_bookkeeping: plain stores where nn.Module.__setattr__ ends in one, the grad-mode block without its
context manager where the mode is set; the release's code elsewhere."""
from __future__ import annotations

import pickle
from dataclasses import replace

import pytest
import torch
from torchmetrics import MeanMetric, Metric
from torchmetrics.classification import MulticlassAccuracy, MulticlassConfusionMatrix

import tmpatch
from tests.conftest import assert_bitwise, torch_at_least, torchmetrics_release
from tmpatch.control import api, gating
from tmpatch.control.report import State
from tmpatch.engine.fingerprint import fingerprint
from tmpatch.patches import update_bookkeeping
from tmpatch.spec import Requirement

#: torch's Module.__setattr__ (and its metaclass checks), which ``Metric.__setattr__``'s repair stands
#: for, is recognised from torch 2.1.2: with torch 2.0 that target is left alone. The grad-mode code
#: ``Metric._wrap_update``'s edit stands for is torch 2.0's too: repaired there
TORCH_KNOWN = torch_at_least(2, 1)

#: the tests that hold with torch 2.0: the grad-mode edit's, the results', and the one of what is left alone
ON_TORCH_2_0 = ("test_torch_2_0_leaves_the_setattr_target_alone", "test_grad_mode_around_update_is_the_releases",
                "test_update_enters_no_grad_context_manager", "test_results_states_and_pickles_are_the_releases")


@pytest.fixture(autouse=True)
def _torch_known(request):
    if not TORCH_KNOWN and request.node.name not in ON_TORCH_2_0:
        pytest.skip("torch 2.0's Module.__setattr__ is not recognised (test_torch_2_0_leaves_the_setattr_target_alone)")

RELEASE_SETATTR = Metric.__setattr__
RELEASE_WRAP_UPDATE = Metric._wrap_update


def _release(target):
    if target.qualname == "Metric.__setattr__":
        return RELEASE_SETATTR
    if target.qualname == "Metric._wrap_update":
        return RELEASE_WRAP_UPDATE
    return api._original(target)  # a requirement: torch's code


def _row():
    return next(r for r in tmpatch.apply(["update_bookkeeping"]) if r.name == "update_bookkeeping")


def _module_setattr_calls(run):
    """The names ``run()`` assigns through torch's Module.__setattr__ (counted by a wrapper put
    there after apply: the patch reads that function's fingerprint when it is applied)."""
    calls = []
    module_setattr = torch.nn.Module.__setattr__

    def counting(self, name, value):
        calls.append(name)
        module_setattr(self, name, value)

    torch.nn.Module.__setattr__ = counting
    try:
        run()
    finally:
        torch.nn.Module.__setattr__ = module_setattr
    return calls


def test_update_assigns_without_module_setattr():
    preds, target = torch.rand(16, 5).softmax(1), torch.randint(0, 5, (16,))
    metrics = [MulticlassConfusionMatrix(num_classes=5), MeanMetric()]

    def run():
        metrics[0].update(preds, target)
        metrics[1].update(torch.rand(4))

    unpatched_calls = _module_setattr_calls(run)  # MeanMetric's state names differ by release
    assert {"_computed", "_update_count", "confmat", "weight"} <= set(unpatched_calls) and len(unpatched_calls) >= 7
    unpatched = metrics[0].confmat.clone()
    assert _row().state == State.APPLIED
    assert _module_setattr_calls(run) == []
    assert_bitwise(metrics[0].confmat, 2 * unpatched)
    assert metrics[0]._update_count == metrics[1]._update_count == 2


def test_the_count_descriptor_of_compiled_update_is_a_plain_store_while_nothing_is_pending():
    """compiled_update makes ``Metric._update_count`` a data descriptor: a class attribute, which
    this patch otherwise leaves to torch's path; a plain store while no compiled count waits."""
    from tmpatch.runtime.compiled import pending

    tmpatch.apply(["compiled_update", "update_bookkeeping"])
    metric = MulticlassConfusionMatrix(num_classes=5)
    preds, target = torch.rand(16, 5).softmax(1), torch.randint(0, 5, (16,))
    assert "_update_count" in vars(Metric)
    assert _module_setattr_calls(lambda: metric.update(preds, target)) == []
    pending.counts = True  # as a compiled update leaves it: stores take torch's path until a read folds
    try:
        assert _module_setattr_calls(lambda: metric.update(preds, target)) == ["_computed"]
        assert not pending.counts  # the update's read of its count folded
    finally:
        pending.counts = False
    assert metric._update_count == 2


def _sequence(metric, batches):
    out = []
    for preds, target in batches:
        out.append(metric(preds, target))
        metric.update(preds, target)
    out.append(metric.compute())
    return out


def test_results_states_and_pickles_are_the_releases():
    g = torch.Generator().manual_seed(0)
    batches = [(torch.rand(8, 4, generator=g).softmax(1), torch.randint(0, 4, (8,), generator=g)) for _ in range(3)]
    upstream = MulticlassAccuracy(num_classes=4, average=None)
    expected = _sequence(upstream, batches)
    tmpatch.apply(["update_bookkeeping"])
    patched = MulticlassAccuracy(num_classes=4, average=None)
    for got, want in zip(_sequence(patched, batches), expected):
        assert_bitwise(got, want)
    assert patched.state_dict().keys() == upstream.state_dict().keys()
    assert set(vars(patched)) == set(vars(upstream))
    assert patched._update_count == upstream._update_count and patched._computed is not None
    clone = pickle.loads(pickle.dumps(patched))
    assert_bitwise(clone.tp, patched.tp)


class _Odd(MeanMetric):
    """A subclass with a property, a class constant and a name set before Module.__init__."""

    level = 3

    def __init__(self) -> None:
        self.early = 1
        self.early = 2
        super().__init__()
        self._shown = 0

    @property
    def shown(self) -> int:
        return self._shown

    @shown.setter
    def shown(self, value: int) -> None:
        self._shown = value * 10


def _assignments(metric):
    """Assignments through every branch of the release's chain; what each leaves."""
    seen = []
    for name, value in [
        ("shown", 2), ("level", 4), ("early", 5), ("_update_count", 7), ("fresh", 1),
        ("weights", torch.nn.Parameter(torch.ones(2))), ("child", torch.nn.Linear(1, 1)),
    ]:
        setattr(metric, name, value)
        seen.append((name, type(getattr(metric, name)).__name__))
    metric.register_buffer("kept", torch.zeros(1))
    metric.kept = torch.ones(1)
    marked = torch.zeros(1)
    marked._is_param = True  # torch takes it for a Parameter
    try:
        metric.marked = marked
        seen.append(("marked", "set"))
    except TypeError as exc:  # an unregistered "Parameter"
        seen.append(("marked", str(exc)))
    for const in ("higher_is_better", "full_state_update"):
        with pytest.raises(RuntimeError, match="Can't change const"):
            setattr(metric, const, True)
    seen.append(("kept", "kept" in metric._buffers))
    seen.append(("params", sorted(metric._parameters)))
    seen.append(("modules", sorted(metric._modules)))
    seen.append(("dict", sorted(k for k in vars(metric) if not k.startswith("_"))))
    seen.append(("shown", metric._shown, type(metric).level, metric.level, metric.early))
    return seen


def test_every_other_assignment_takes_the_releases_path():
    expected = _assignments(_Odd())
    assert _row().state == State.APPLIED
    assert _assignments(_Odd()) == expected


def test_revert_puts_the_release_back():
    _row()
    installed = Metric.__setattr__
    assert installed is not RELEASE_SETATTR
    assert installed.__code__ is update_bookkeeping.assign.__code__  # installed itself: no wrapper's frame
    assert tmpatch.is_patched(installed) and tmpatch.get_original(installed) is RELEASE_SETATTR
    tmpatch.revert()
    assert Metric.__setattr__ is RELEASE_SETATTR
    metric = MeanMetric()
    calls = _module_setattr_calls(lambda: installed(metric, "_computed", None))
    assert calls == ["_computed"]  # a reference kept across revert calls the release's code


def _odd(patch, path: str):
    """``patch`` as it would be on a torch whose code at ``path`` is not any tmpatch knows."""
    return replace(patch, relies_on=tuple(Requirement(r.module, r.qualname, ("0" * 16,), r.targets)
                                          if r.path == path else r for r in patch.relies_on))


@pytest.mark.parametrize("path, left", [("torch.nn.modules.module.Module.__setattr__", "Metric.__setattr__"),
                                        ("torch.autograd.grad_mode.set_grad_enabled.__exit__", "Metric._wrap_update")])
def test_unrecognised_torch_code_costs_the_target_that_stands_for_it(path, left):
    patch = update_bookkeeping.PATCH
    state, reason, found = gating.recognise(_odd(patch, path), str(torchmetrics_release()), _release)
    assert state == State.PARTIAL and f"left alone: torchmetrics.metric.{left} (relies on {path}, whose code is not " \
        "recognised" in reason, reason
    assert [target.qualname for target, _ in found] == [t.qualname for t in patch.targets if t.qualname != left]
    state, _, _ = gating.recognise(patch, str(torchmetrics_release()), _release)
    assert state == State.APPLIED
    absent = replace(patch, relies_on=(Requirement("torch.nn.parameter", "_NoSuchMeta.__instancecheck__", (None,)),))
    assert gating.recognise(absent, str(torchmetrics_release()), _release)[0] == State.APPLIED


class _GradProbe(MeanMetric):
    """Sees the grad mode inside update(); can raise, or leave the mode changed."""

    def __init__(self, action: str = "") -> None:
        super().__init__()
        self.action, self.seen = action, []

    def update(self, value) -> None:  # noqa: D102
        self.seen.append(torch.is_grad_enabled())
        if self.action == "flip":
            torch.set_grad_enabled(not torch.is_grad_enabled())
        if self.action == "raise":
            raise ValueError("probe")
        super().update(value)


def _grad_story():
    story = []
    for outside in (True, False):
        for enable in (False, True):
            for action in ("", "flip", "raise"):
                torch.set_grad_enabled(outside)
                metric = _GradProbe(action)
                metric._enable_grad = enable
                try:
                    metric.update(torch.ones(2))
                    error = ""
                except ValueError as exc:
                    error = str(exc)
                story.append((outside, enable, action, metric.seen, torch.is_grad_enabled(), error))
    torch.set_grad_enabled(True)
    return story


def test_grad_mode_around_update_is_the_releases():
    expected = _grad_story()
    _row()
    assert _grad_story() == expected


def test_update_enters_no_grad_context_manager(monkeypatch):
    _row()
    metric = MeanMetric()  # built after apply: its update is the edited wrapped_func
    entered = []
    init = torch.set_grad_enabled.__init__

    def counting(self, mode):
        entered.append(mode)
        init(self, mode)

    monkeypatch.setattr(torch.set_grad_enabled, "__init__", counting)
    metric.update(torch.ones(2))
    assert entered == []
    tmpatch.revert()
    metric = MeanMetric()
    entered.clear()
    metric.update(torch.ones(2))
    assert entered[:1] == [False]  # the release's block (its update may enter others)


@pytest.mark.skipif(TORCH_KNOWN, reason="torch 2.0 only")
def test_torch_2_0_leaves_the_setattr_target_alone():
    row = _row()
    assert row.state == State.PARTIAL and row.reason.endswith(
        "left alone: torchmetrics.metric.Metric.__setattr__ (relies on torch.nn.modules.module.Module.__setattr__, "
        f"whose code is not recognised (fingerprint {fingerprint(torch.nn.Module.__setattr__)}))"), row
    assert Metric.__setattr__ is RELEASE_SETATTR and Metric._wrap_update is not RELEASE_WRAP_UPDATE
