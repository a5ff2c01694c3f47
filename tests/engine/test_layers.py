"""Layers (tmpatch.engine.layers) on the toy package of tests/conftest.py: inline forms and wrappers
with the target's own parameters. No torchmetrics involved."""
from __future__ import annotations

import textwrap

import pytest

from tmpatch.engine.core import Engine
from tmpatch.engine.references import PatchError

pytestmark = pytest.mark.once  # nothing here depends on the torchmetrics release


def _add_one(original, x):
    return original(x) + 1


def _plus_hundred(self, x, *, _tmpatch_route):
    """An inline form (spec.inline): the method's arguments and the layer's route."""
    if not _tmpatch_route.on:
        return _tmpatch_route.original(self, x)
    return _tmpatch_route.original(self, x) + 100


def test_an_inline_replacement_is_installed_itself_and_passes_through_once_removed(toy):
    """spec.inline: the owner holds the form itself (no wrapper's frame), bound to a route that
    the engine turns off on removal, so a reference left behind calls the original alone."""
    import toypkg.core as core

    from tmpatch import spec

    key = ("toypkg.core", "Thing.method")
    original = vars(core.Thing)["method"]
    replacement = spec.inline(_plus_hundred)
    engine = Engine()
    layer = engine.install(key, replacement, method=True, scope="toypkg", sweep=False)
    installed = vars(core.Thing)["method"]
    assert installed is layer.wrapper and installed.__code__ is _plus_hundred.__code__  # the form, no wrapper
    assert installed.__wrapped__ is original and installed.__name__ == "method"
    assert installed.__kwdefaults__["_tmpatch_route"] is layer.route and layer.route.on
    thing = core.Thing()
    assert thing.method(1) == 103
    assert replacement(original, thing, 1) == 103  # the usual form, for joining with other wrappers
    kept = thing.method
    assert engine.remove(key, scope="toypkg") == ""
    assert vars(core.Thing)["method"] is original and not layer.route.on
    assert thing.method(1) == 3 and kept(1) == 3  # the reference left behind passes through
    again = engine.install(key, replacement, method=True, scope="toypkg", sweep=False)
    assert again is layer and vars(core.Thing)["method"] is installed and kept(1) == 103
    with pytest.raises(PatchError, match="other kind"):
        engine.swap(key, _add_one)  # a plain replacement has nothing to call it in an inline layer
    assert thing.method(1) == 103
    engine.remove(key, scope="toypkg")
    assert vars(core.Thing)["method"] is original
    engine.install(("toypkg.core", "target"), _add_one, method=False, scope="toypkg", sweep=False)
    with pytest.raises(PatchError, match="other kind"):
        engine.swap(("toypkg.core", "target"), replacement)  # nor the other way round
    engine.remove(("toypkg.core", "target"), scope="toypkg")


def test_an_inline_layer_given_another_form_puts_its_copy_in_every_place(toy):
    import toypkg.core as core
    import toypkg.user as user

    from tmpatch import spec

    def plus_one(x, *, _tmpatch_route):
        return _tmpatch_route.original(x) + (1 if _tmpatch_route.on else 0)

    def plus_two(x, *, _tmpatch_route):
        return _tmpatch_route.original(x) + (2 if _tmpatch_route.on else 0)

    key = ("toypkg.core", "target")
    original = core.target
    engine = Engine()
    layer = engine.install(key, spec.inline(plus_one), method=False, scope="toypkg", sweep=True)
    assert core.target(2) == 5 and user.target(2) == 5 and user.call(2) == 5
    engine.swap(key, spec.inline(plus_two))
    assert core.target is layer.wrapper and user.target is layer.wrapper
    assert user.call.__defaults__[0] is layer.wrapper and core.target(2) == 6 and user.call(2) == 6
    engine.remove(key, scope="toypkg")
    assert core.target is original and user.target is original and user.call.__defaults__[0] is original


def test_a_plain_functions_wrapper_has_its_parameters_and_passes_them_on(toy):
    """A wrapper of a plain Python function takes the function's own parameters (its default
    objects too) and passes them on by position, keyword-only ones by name: no ``*args``."""
    import inspect

    import toypkg.core as core

    exec(textwrap.dedent('''
        def shaped(a, b=2, /, c=None, *, d="x"):
            return (a, b, c, d)
    '''), core.__dict__)
    seen = []

    def spy(original, a, b, c, *, d):
        seen.append((a, b, c, d))
        return original(a, b, c, d=d)

    original = core.shaped
    engine = Engine()
    layer = engine.install(("toypkg.core", "shaped"), spy, method=False, scope="toypkg", sweep=False)
    wrapper = core.shaped
    assert wrapper.__code__.co_varnames[:4] == ("a", "b", "c", "d") and not wrapper.__code__.co_flags & 0x0C
    assert wrapper.__defaults__ is original.__defaults__ and wrapper.__kwdefaults__ == {"d": "x"}
    assert inspect.signature(wrapper) == inspect.signature(original)
    assert core.shaped(1) == (1, 2, None, "x") and seen == [(1, 2, None, "x")]  # defaults spelt out
    assert core.shaped(1, 3, c=4, d="y") == (1, 3, 4, "y")
    with pytest.raises(TypeError):
        core.shaped(a=1)  # positional-only, as the original
    layer.active = False
    assert core.shaped(5) == (5, 2, None, "x") and len(seen) == 2
    layer.active = True
    engine.remove(("toypkg.core", "shaped"), scope="toypkg")
    assert core.shaped is original


def test_a_replacement_that_cannot_take_the_targets_arguments_is_refused(toy):
    import toypkg.core as core

    def narrow(original, x, *, scale=2):  # 'x' only: fine; here the target has one parameter
        return original(x)

    def wrong(original, *, x):  # keyword-only where the target's parameter is positional
        return original(x)

    original = core.target
    engine = Engine()
    engine.install(("toypkg.core", "target"), narrow, method=False, scope="toypkg", sweep=False)
    engine.remove(("toypkg.core", "target"), scope="toypkg")
    with pytest.raises(PatchError, match="does not take the target's arguments"):
        Engine().install(("toypkg.core", "target"), wrong, method=False, scope="toypkg", sweep=False)
    assert core.target is original and core.target(2) == 4


def test_a_function_with_a_function_as_default_keeps_the_generic_wrapper(toy):
    """Such a default is a place other layers rebind: it stays the function's own to fill in."""
    import toypkg.core as core
    import toypkg.user as user

    engine = Engine()
    layer = engine.install(("toypkg.user", "call"), lambda original, *a, **k: original(*a, **k) + 1,
                           method=False, scope="toypkg", sweep=False)
    assert user.call.__code__.co_flags & 0x0C and not hasattr(user.call, "_tmpatch_params")
    assert user.call(2) == core.target(2) + 1
    engine.remove(layer.key, scope="toypkg")


def test_an_inline_form_rebuilt_by_a_later_apply_runs_in_the_layers_one_function(toy):
    """A later apply builds the form again (a new closure of the same code): the layer keeps its
    installed function, which runs the new form's values."""
    import toypkg.core as core

    from tmpatch import spec

    def build(step):
        def form(x, *, _tmpatch_route):
            return _tmpatch_route.original(x) + (step if _tmpatch_route.on else 0)
        return spec.inline(form)

    key = ("toypkg.core", "target")
    engine = Engine()
    layer = engine.install(key, build(1), method=False, scope="toypkg", sweep=False)
    installed = core.target
    assert core.target(2) == 5
    engine.remove(key, scope="toypkg")
    assert installed(2) == 4  # kept across the removal: passes through
    engine.install(key, build(10), method=False, scope="toypkg", sweep=False)
    assert core.target is installed is layer.wrapper and core.target(2) == 14
    engine.swap(key, build(100))
    assert core.target is installed and core.target(2) == 104
    engine.remove(key, scope="toypkg")
