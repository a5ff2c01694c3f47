"""Gating at the grain of a target: a patch is repaired where its code is recognised, target by
target, the targets declared to go together (``spec.Together``) are left alone together, and code a
target relies on (``spec.Requirement``) costs only the targets that rely on it."""
from __future__ import annotations

from typing import Dict, Optional

import pytest

from tmpatch import patches as catalogue
from tmpatch.control import gating
from tmpatch.control.report import State
from tmpatch.engine.fingerprint import fingerprint
from tmpatch.engine.references import PatchError
from tmpatch.spec import Patch, Requirement, Target, Together, Variant, since, span


def one(x):
    return x + 1


def two(x):
    return x * 2


def three(x):
    return x - 3


def changed(x):  # what a new release may hold at a target: code tmpatch has not seen
    return x - 3 + 0


def helper(x):  # code outside the targets that a repair relies on
    return -x


def _build(module):
    return lambda original, *args: original(*args)


RELEASES = span("1.0.0", "1.9.0")
KNOWN = {"one": one, "two": two, "three": three}


def _patch(*together: Together, fixed: str = "", needs: tuple = ()) -> Patch:
    targets = tuple(
        Target("pkg.mod", name, (Variant(RELEASES, fingerprint(fn), None if name == fixed else _build),))
        for name, fn in KNOWN.items())
    return Patch("toy", "a toy", since("1.0.0"), targets, together=together, relies_on=needs)


def _original(found: Dict[str, Optional[object]]):
    def original(target):
        fn = found.get(target.qualname, {**KNOWN, "helper": helper}[target.qualname])
        if fn is None:
            raise PatchError(f"{target.path} not found")
        return fn

    return original


def _recognise(patch: Patch, **found):
    state, reason, recognised = gating.recognise(patch, "1.9.0", _original(found))
    return state, reason, [target.qualname for target, _ in recognised]


def test_every_target_recognised_is_applied_whole():
    assert _recognise(_patch()) == (State.APPLIED, "code of 1.0.0-1.9.0 recognised", ["one", "two", "three"])


def test_a_target_not_recognised_is_left_alone_and_the_others_are_repaired():
    state, reason, found = _recognise(_patch(), three=changed)
    assert (state, found) == (State.PARTIAL, ["one", "two"])
    assert reason == (f"code of 1.0.0-1.9.0 recognised but for 1 of 3 targets, left alone: pkg.mod.three (code not "
                      f"recognised, fingerprint {fingerprint(changed)})")


def test_a_missing_target_is_named_once_with_why():
    state, reason, found = _recognise(_patch(), two=None)
    assert (state, found) == (State.PARTIAL, ["one", "three"])
    assert reason.endswith("left alone: pkg.mod.two (not found)")


def test_a_group_is_left_alone_with_its_member_and_the_row_says_why():
    patch = _patch(Together("one defers what two reports", targets=("one", "two")))
    state, reason, found = _recognise(patch, two=changed)
    assert (state, found) == (State.PARTIAL, ["three"])
    assert "2 of 3 targets" in reason and "pkg.mod.two (code not recognised" in reason
    assert reason.endswith("pkg.mod.one left alone with pkg.mod.two (one defers what two reports)")


def test_a_dependence_goes_one_way_and_along_a_chain():
    patch = _patch(Together("one needs two", targets=("one",), on=("two",)),
                   Together("two needs three", targets=("two",), on=("three",)))
    assert _recognise(patch, one=changed)[0::2] == (State.PARTIAL, ["two", "three"])
    state, reason, found = _recognise(patch, three=changed)
    assert (state, found) == (State.MISMATCH, [])
    assert "pkg.mod.two left alone with pkg.mod.three (two needs three)" in reason
    assert "pkg.mod.one left alone with pkg.mod.two (one needs two)" in reason and reason.endswith("; left alone")


def test_a_whole_patch_goes_with_any_of_its_targets():
    state, reason, found = _recognise(_patch(Together("all or none")), one=changed)
    assert (state, found) == (State.MISMATCH, [])
    assert "pkg.mod.two, pkg.mod.three left alone with pkg.mod.one (all or none)" in reason


def test_nothing_left_to_repair_is_a_mismatch():
    state, reason, found = _recognise(_patch(fixed="two"), one=changed, three=changed)
    assert (state, found) == (State.MISMATCH, [])
    assert "pkg.mod.one (code not recognised" in reason and "pkg.mod.three (code not recognised" in reason


def test_a_target_of_another_tool_is_left_alone_and_named():
    state, reason, _ = _recognise(_patch(), two=staticmethod(two))
    assert state == State.PARTIAL and "pkg.mod.two (a staticmethod, not the release's own function" in reason


def _needs(*targets: str) -> Requirement:
    return Requirement("pkg.mod", "helper", (fingerprint(helper),), targets)


def test_code_relied_on_costs_only_the_targets_that_rely_on_it():
    patch = _patch(needs=(_needs("two"),))
    assert _recognise(patch)[0::2] == (State.APPLIED, ["one", "two", "three"])
    state, reason, found = _recognise(patch, helper=changed)
    assert (state, found) == (State.PARTIAL, ["one", "three"])
    assert reason == ("code of 1.0.0-1.9.0 recognised but for 1 of 3 targets, left alone: pkg.mod.two (relies on "
                      f"pkg.mod.helper, whose code is not recognised (fingerprint {fingerprint(changed)}))")
    state, reason, found = _recognise(patch, helper=None)  # absent
    assert (state, found) == (State.PARTIAL, ["one", "three"]) and "pkg.mod.helper, which is absent" in reason


def test_code_relied_on_takes_what_goes_with_its_targets_along():
    patch = _patch(Together("one needs two", targets=("one",), on=("two",)), needs=(_needs("two"),))
    state, reason, found = _recognise(patch, helper=changed)
    assert (state, found) == (State.PARTIAL, ["three"])
    assert reason.endswith("pkg.mod.one left alone with pkg.mod.two (one needs two)")


def test_code_every_target_relies_on_leaves_the_patch_alone_and_says_so():
    state, reason, found = _recognise(_patch(needs=(_needs(),)), helper=changed)
    assert (state, found) == (State.MISMATCH, [])
    assert reason == (f"relies on pkg.mod.helper, whose code is not recognised (fingerprint {fingerprint(changed)}); "
                      "every target relies on it: left alone")


@pytest.mark.parametrize("name", catalogue.NAMES)
def test_what_goes_together_names_targets_of_the_patch(name):
    patch = catalogue.load(name)
    for together in patch.together:
        assert together.reason
        for target in together.targets + together.on:
            assert gating.named(patch, target), (name, target)
    for requirement in patch.relies_on:  # the targets that rely on code outside them
        for target in requirement.targets:
            assert gating.named(patch, target), (name, requirement.path, target)
