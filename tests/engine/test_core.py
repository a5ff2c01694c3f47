"""The engine on toy packages: no torchmetrics involved."""
from __future__ import annotations

import importlib
import sys
import types

import pytest
import wrapt

from tmpatch.engine.core import Engine
from tmpatch.engine.references import PatchError

pytestmark = pytest.mark.once  # nothing here depends on the torchmetrics release


def _add_one(original, x):
    return original(x) + 1


def test_install_reaches_attribute_importers_and_defaults(toy):
    import toypkg.core as core
    import toypkg.user as user

    original = core.target
    engine = Engine()
    layer = engine.install(("toypkg.core", "target"), _add_one, method=False, scope="toypkg", sweep=True)
    assert core.target is layer.wrapper and user.target is layer.wrapper
    assert user.call.__defaults__[0] is layer.wrapper
    assert user.call_kw.__kwdefaults__["fn"] is layer.wrapper
    assert user.Runner.run.__defaults__[0] is layer.wrapper
    assert core.target(2) == 5 and user.call(2) == 5
    assert engine.remove(("toypkg.core", "target"), scope="toypkg") == ""
    assert core.target is original and user.target is original
    assert user.call.__defaults__[0] is original
    assert user.call_kw.__kwdefaults__["fn"] is original
    assert user.Runner.run.__defaults__[0] is original


def test_install_twice_is_one_layer_and_reuses_the_wrapper(toy):
    import toypkg.core as core

    engine = Engine()
    first = engine.install(("toypkg.core", "target"), _add_one, method=False, scope="toypkg", sweep=True)
    again = engine.install(("toypkg.core", "target"), _add_one, method=False, scope="toypkg", sweep=True)
    assert first is again and core.target(2) == 5
    wrapper = first.wrapper
    engine.remove(("toypkg.core", "target"), scope="toypkg")
    engine.install(("toypkg.core", "target"), _add_one, method=False, scope="toypkg", sweep=True)
    assert core.target is wrapper and core.target(2) == 5


def test_modules_imported_after_install_are_reverted_too(toy):
    import toypkg.core as core

    original = core.target
    engine = Engine()
    engine.install(("toypkg.core", "target"), _add_one, method=False, scope="toypkg", sweep=True)
    late = importlib.import_module("toypkg.late")
    assert late.target is core.target
    engine.remove(("toypkg.core", "target"), scope="toypkg")
    assert late.target is original


def test_method_target_gets_self(toy):
    import toypkg.core as core

    def plus_ten(original, self, x):
        assert isinstance(self, core.Thing)
        return original(self, x) + 10

    original = vars(core.Thing)["method"]
    engine = Engine()
    engine.install(("toypkg.core", "Thing.method"), plus_ten, method=True, scope="toypkg", sweep=False)
    thing = core.Thing()
    assert thing.method(1) == 13 and core.Thing.method(thing, 1) == 13
    bound = thing.method  # a reference that outlives the patch
    engine.remove(("toypkg.core", "Thing.method"), scope="toypkg")
    assert vars(core.Thing)["method"] is original
    assert thing.method(1) == 3 and bound(1) == 3  # the lingering reference passes through


def test_a_strangers_layer_on_top_is_never_unwrapped(toy):
    import toypkg.core as core

    engine = Engine()
    layer = engine.install(("toypkg.core", "target"), _add_one, method=False, scope="toypkg", sweep=True)

    def stranger(wrapped, instance, args, kwargs):
        return wrapped(*args, **kwargs) * 100

    core.target = wrapt.FunctionWrapper(core.target, stranger)
    theirs = core.target
    note = engine.remove(("toypkg.core", "target"), scope="toypkg")
    assert "wrapped on top of tmpatch" in note
    assert core.target is theirs and theirs.__wrapped__ is layer.wrapper
    assert core.target(2) == 400  # our layer passes through: original * 100
    engine.install(("toypkg.core", "target"), _add_one, method=False, scope="toypkg", sweep=True)
    assert core.target is theirs and core.target(2) == 500  # re-armed, still one layer of ours


def test_a_failing_rebind_leaves_everything_as_it_was(toy, monkeypatch):
    import toypkg.core as core
    import toypkg.user as user

    from tmpatch.engine import references

    original = core.target

    class Frozen(types.ModuleType):
        def __setattr__(self, name, value):
            raise AttributeError("read-only module")

    frozen = Frozen("frozenmod")
    frozen.__dict__["target"] = original
    monkeypatch.setitem(sys.modules, "frozenmod", frozen)
    engine = Engine()
    with pytest.raises(AttributeError):
        engine.install(("toypkg.core", "target"), _add_one, method=False, scope="toypkg", sweep=True)
    assert core.target is original and user.target is original and frozen.target is original
    assert references.resolve("toypkg.core", "target")[2] is original


def test_unknown_targets_are_reported(toy):
    import toypkg.core  # noqa: F401

    engine = Engine()
    with pytest.raises(PatchError, match="not found"):
        engine.install(("toypkg.core", "missing"), _add_one, method=False, scope="toypkg", sweep=False)
    with pytest.raises(PatchError, match="not imported"):
        engine.install(("toypkg.nowhere", "x"), _add_one, method=False, scope="toypkg", sweep=False)


def test_hooks_fire_on_import_and_disarm_leaves_nothing(toy):
    engine = Engine()
    seen = []
    engine.arm("toypkg.core", lambda module: seen.append(module.__name__))
    assert engine.armed() == ["toypkg.core"]
    import toypkg.core  # noqa: F401

    assert seen == ["toypkg.core"] and engine.armed() == []
    engine.arm("toypkg.late", seen.append)
    engine.disarm()
    assert "toypkg.late" not in wrapt.importer._post_import_hooks
    import toypkg.late  # noqa: F401

    assert seen == ["toypkg.core"]


def test_a_failing_hook_never_breaks_the_import(toy, caplog):
    engine = Engine()

    def boom(module):
        raise RuntimeError("patch bug")

    engine.arm("toypkg.core", boom)
    import toypkg.core

    assert toypkg.core.target(2) == 4
    assert "post-import hook for toypkg.core failed" in caplog.text


def test_a_batch_shares_one_sweep_and_sees_modules_imported_meanwhile(toy, monkeypatch):
    import toypkg.core as core
    import toypkg.user as user

    from tmpatch.engine import references

    built = []
    real_add = references._Index._add

    def counting_add(self, name, module, *rest):
        built.append(name)
        return real_add(self, name, module, *rest)

    monkeypatch.setattr(references._Index, "_add", counting_add)
    original = core.target
    engine = Engine()
    with engine.batch():
        layer = engine.install(("toypkg.core", "target"), _add_one, method=False, scope="toypkg", sweep=True)
        swept = len(built)
        assert swept >= len([m for m in sys.modules.values() if m is not None]) - 5
        method = engine.install(("toypkg.core", "Thing.method"), lambda original, self, x: original(self, x) + 1,
                                method=True, scope="toypkg", sweep=True)
        import toypkg.late as late  # imported after the index was built: added at the next lookup

        assert late.target is layer.wrapper
        engine.remove(("toypkg.core", "target"), scope="toypkg")
        assert "toypkg.late" in built[swept:] and len(built) - swept < 10  # only the new modules
    assert core.target is original and user.target is original and late.target is original
    assert user.call.__defaults__[0] is original and method.active
    with engine.batch():
        layer = engine.install(("toypkg.core", "target"), _add_one, method=False, scope="toypkg", sweep=True)
        assert late.target is layer.wrapper and user.call_kw.__kwdefaults__["fn"] is layer.wrapper
    engine.remove(("toypkg.core", "target"), scope="toypkg")  # outside a batch: the plain sweep
    assert late.target is original and user.call_kw.__kwdefaults__["fn"] is original


# -- issue #11 item 8: another tool's layer, mock.patch, re-apply -------------------------------
def _places(core, user, late=None):
    """What every binding of ``target`` holds: the defining module, an importer, its defaults."""
    held = {"core": core.target, "user": user.target, "call": user.call.__defaults__[0],
            "call_kw": user.call_kw.__kwdefaults__["fn"], "run": user.Runner.run.__defaults__[0]}
    if late is not None:
        held["late"] = late.target
    return held


def test_reinstall_after_a_strangers_layer_and_a_removal_rebinds_every_place(toy):
    """install, another tool wraps the defining module's binding, remove (ours stays under
    theirs as a pass-through; every other place gets the original), install again: every
    place calls the replacement again, the defining one through the stranger's layer."""
    import toypkg.core as core
    import toypkg.user as user

    original = core.target
    engine = Engine()
    layer = engine.install(("toypkg.core", "target"), _add_one, method=False, scope="toypkg", sweep=True)
    wrapt.wrap_function_wrapper(core, "target", lambda wrapped, instance, args, kwargs: wrapped(*args, **kwargs) * 100)
    theirs = core.target
    assert "wrapped on top of tmpatch" in engine.remove(("toypkg.core", "target"), scope="toypkg")
    assert {k: v for k, v in _places(core, user).items() if k != "core"} == dict.fromkeys(
        ["user", "call", "call_kw", "run"], original)
    late = importlib.import_module("toypkg.late")  # imported while reverted: binds the stranger's layer
    engine.install(("toypkg.core", "target"), _add_one, method=False, scope="toypkg", sweep=True)
    held = _places(core, user, late)
    assert held.pop("core") is theirs and held.pop("late") is theirs and theirs.__wrapped__ is layer.wrapper
    assert all(value is layer.wrapper for value in held.values()), held
    assert core.target(2) == 500 and user.call(2) == 5 and late.target(2) == 500
    engine.remove(("toypkg.core", "target"), scope="toypkg")
    held = _places(core, user, late)
    assert held.pop("core") is theirs and held.pop("late") is theirs
    assert all(value is original for value in held.values()), held
    assert core.target(2) == 400 and user.call(2) == 4


def test_a_mock_that_puts_the_wrapper_back_after_a_removal_is_seen_and_reinstall_rearms(toy):
    """install, mock.patch the defining module's binding, remove inside the mock, leave it:
    the mock puts back what it found (tmpatch's wrapper, now inactive): lingering() names
    that place. A later install re-arms it and rebinds every other place."""
    from unittest import mock

    import toypkg.core as core
    import toypkg.user as user

    original = core.target
    engine = Engine()
    key = ("toypkg.core", "target")
    layer = engine.install(key, _add_one, method=False, scope="toypkg", sweep=True)
    with mock.patch("toypkg.core.target", lambda x: -x):
        engine.remove(key, scope="toypkg")
        assert engine.lingering(key) == []
        assert user.target is original and user.call.__defaults__[0] is original
    assert core.target is layer.wrapper and not layer.active
    assert core.target(2) == 4  # inactive: passes through
    assert engine.lingering(key) == ["toypkg.core.target"]
    engine.install(key, _add_one, method=False, scope="toypkg", sweep=True)
    assert engine.lingering(key) == []
    assert all(value is layer.wrapper for value in _places(core, user).values())
    engine.remove(key, scope="toypkg")
    assert all(value is original for value in _places(core, user).values())
    assert engine.lingering(key) == []


def test_a_mock_of_an_importers_binding_is_left_to_the_mock(toy):
    from unittest import mock

    import toypkg.core as core
    import toypkg.user as user

    original = core.target
    engine = Engine()
    key = ("toypkg.core", "target")
    layer = engine.install(key, _add_one, method=False, scope="toypkg", sweep=True)
    with mock.patch("toypkg.user.target", lambda x: -x):
        engine.remove(key, scope="toypkg")
        engine.install(key, _add_one, method=False, scope="toypkg", sweep=True)
        assert user.target(2) == -2  # the mock's, as long as it is in place
    assert user.target is layer.wrapper and user.target(2) == 5  # what the mock found: ours, active
    engine.remove(key, scope="toypkg")
    assert user.target is original and core.target is original


def test_a_gated_replacement_runs_only_while_its_gate_answers(toy):
    """A replacement with a gate (spec.gated) is not called while the gate's get() answers None."""
    import toypkg.core as core

    from tmpatch import spec
    from tmpatch.engine import layers
    from tmpatch.runtime.compiled import ContextSlot

    assert spec.GATE == layers.GATE
    slot, calls = ContextSlot("toy_gate"), []

    @spec.gated(slot)
    def counted(original, x):
        calls.append(x)
        return original(x) + 1

    engine = Engine()
    engine.install(("toypkg.core", "target"), counted, method=False, scope="toypkg", sweep=False)
    assert core.target(2) == 4 and calls == []  # the gate answers None: the original, directly
    token = slot.set("open")
    try:
        assert core.target(2) == 5 and calls == [2]
    finally:
        slot.reset(token)
    engine.swap(("toypkg.core", "target"), _add_one)  # no gate: always called
    assert core.target(2) == 5
    engine.remove(("toypkg.core", "target"), scope="toypkg")



# -- settings: attributes set while applied, put back exactly -------------------
def test_a_setting_absent_before_is_absent_again_after_take(toy):
    import toypkg.core as core

    engine = Engine()
    marker = object()
    engine.put(("toypkg.core", "Thing.flag"), marker)
    assert vars(core.Thing)["flag"] is marker and engine.settings() == [("toypkg.core", "Thing.flag")]
    assert engine.take(("toypkg.core", "Thing.flag")) == ""
    assert "flag" not in vars(core.Thing) and engine.settings() == []  # deleted, not set to None


def test_a_setting_present_before_is_put_back_by_identity(toy):
    import toypkg.core as core

    engine = Engine()
    original = core.target
    engine.put(("toypkg.core", "target"), True)
    assert core.target is True
    assert engine.take(("toypkg.core", "target")) == ""
    assert vars(core)["target"] is original
    assert engine.take(("toypkg.core", "target")) == ""  # taken already: nothing to do


def test_a_setting_replaced_by_somebody_else_is_left_to_them(toy, caplog):
    import toypkg.core as core

    engine = Engine()
    original, mine, theirs = core.target, object(), object()
    engine.put(("toypkg.core", "target"), mine)
    core.target = theirs
    note = engine.take(("toypkg.core", "target"))
    assert core.target is theirs and "toypkg.core.target" in note and "another tool" in note
    assert "another tool" in caplog.text
    engine.put(("toypkg.core", "Thing.flag"), mine)
    del core.Thing.flag
    assert "left absent" in engine.take(("toypkg.core", "Thing.flag")) and "flag" not in vars(core.Thing)
    assert original is not theirs


def test_a_setting_is_refused_twice_and_where_its_owner_is_missing(toy):
    import toypkg.core  # noqa: F401

    engine = Engine()
    engine.put(("toypkg.core", "value"), 1)
    with pytest.raises(PatchError, match="set by tmpatch already"):
        engine.put(("toypkg.core", "value"), 2)
    assert toypkg.core.value == 1
    with pytest.raises(PatchError, match="not imported"):
        engine.put(("toypkg.nowhere", "value"), 1)
    with pytest.raises(PatchError, match="Nothing not found"):
        engine.put(("toypkg.core", "Nothing.value"), 1)
    assert engine.take(("toypkg.core", "value")) == "" and not hasattr(toypkg.core, "value")
