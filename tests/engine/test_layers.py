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


# --- what TorchScript and a traceback see of a wrapper ---------------------------------------------------------------

_JIT_TOY = '''
from typing import Tuple

import torch


def original(x: torch.Tensor) -> torch.Tensor:  # named as the generic wrapper's closure once named its target
    return x * 2


class Plain(torch.nn.Module):  # a matching wrapper (fixed parameters, constant defaults)
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return original(x) + 1


class Spread(torch.nn.Module):  # the generic wrapper (a tuple default)
    def forward(self, x: torch.Tensor, dims: Tuple[int, int] = (0, 1)) -> torch.Tensor:
        return original(x).sum(dims[0])


class Rest(torch.nn.Module):  # the generic wrapper; TorchScript refuses ``*rest``
    def forward(self, x: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
        return original(x)


def failing(x):
    raise ValueError(x)
'''


@pytest.fixture
def jit_toy(tmp_path, monkeypatch):
    import sys

    (tmp_path / "jittoy.py").write_text(_JIT_TOY)
    monkeypatch.syspath_prepend(str(tmp_path))
    import jittoy

    yield jittoy
    sys.modules.pop("jittoy", None)


def _scripted(module, name: str):
    """What ``torch.jit.script`` makes of a fresh subclass of ``module.<name>`` (TorchScript keeps
    what it compiled of a class): its value and the source locations of its graph, or its error."""
    import re
    import warnings

    import torch

    cls = type(name, (getattr(module, name),), {"__module__": module.__name__})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit.script is deprecated on torch 2.13
        try:
            scripted = torch.jit.script(cls())
        except Exception as exc:  # noqa: BLE001 - the release's refusal is compared
            return f"{type(exc).__name__}: {exc}"
    return scripted(torch.ones(2, 2)).tolist(), re.findall(r"# (\S+:\d+:\d+)", str(scripted.graph))


def test_torchscript_compiles_a_wrapped_method_as_the_targets_own(jit_toy):
    """TorchScript compiles the source ``inspect.getsourcelines`` finds through ``__wrapped__``, but
    names the wrapper's own file and resolves the names in the wrapper's globals and closure: those
    are the target's (a name of its module resolves, its file is named, in the graph and in an error)."""
    names = ("Plain", "Spread", "Rest")
    release = {name: _scripted(jit_toy, name) for name in names}
    assert isinstance(release["Plain"], tuple) and isinstance(release["Spread"], tuple)
    assert release["Rest"].startswith("NotSupportedError") and f'File "{jit_toy.__file__}"' in release["Rest"]
    assert all(jit_toy.__file__ in where for name in ("Plain", "Spread") for where in release[name][1])
    engine = Engine()
    keys = [("jittoy", f"{name}.forward") for name in names]
    engine.install(keys[0], lambda original, self, x: original(self, x), method=True, scope="jittoy", sweep=False)
    for key in keys[1:]:
        engine.install(key, lambda original, *a, **k: original(*a, **k), method=True, scope="jittoy", sweep=False)
    assert not hasattr(jit_toy.Spread.forward, "_tmpatch_params")  # the generic wrapper
    patched = {name: _scripted(jit_toy, name) for name in names}
    for key in keys:
        engine.remove(key, scope="jittoy")
    assert patched == release


def test_a_traceback_through_a_wrapper_shows_the_targets_first_line(jit_toy):
    """The wrapper's frame names the target's file and first line (where TorchScript looks for it),
    as ``wrapper``: every instruction on that line, no columns (no carets under the line)."""
    import dis
    import sys
    import traceback

    engine = Engine()
    engine.install(("jittoy", "failing"), lambda original, x: original(x), method=False, scope="jittoy", sweep=False)
    engine.install(("jittoy", "Rest.forward"), lambda original, *a, **k: original(*a, **k), method=True,
                   scope="jittoy", sweep=False)
    first = jit_toy.failing.__wrapped__.__code__.co_firstlineno
    with pytest.raises(ValueError) as caught:
        jit_toy.failing(1)
    frames = traceback.extract_tb(caught.value.__traceback__)[1:]
    assert [(f.filename, f.name) for f in frames] == [
        (jit_toy.__file__, "wrapper"), (__file__, "<lambda>"), (jit_toy.__file__, "failing")]
    assert frames[0].lineno == first and frames[0].line == "def failing(x):"
    if sys.version_info >= (3, 11):
        assert frames[0].colno is None and "^" not in "".join(traceback.format_list(frames[:1]))
    forward = jit_toy.Rest.forward
    assert forward.__code__.co_filename == jit_toy.__file__  # the generic wrapper too
    assert {line for _, line in dis.findlinestarts(forward.__code__)} == {forward.__wrapped__.__code__.co_firstlineno}
    engine.remove(("jittoy", "failing"), scope="jittoy")
    engine.remove(("jittoy", "Rest.forward"), scope="jittoy")
