"""The reference index on toy packages: the scope's modules looked through at once, the other
modules only for a function that something outside the scope holds (reference counts)."""
from __future__ import annotations

import sys
import types

import pytest

from tmpatch.engine import fingerprint, references
from tmpatch.engine.core import Engine

pytestmark = pytest.mark.once  # nothing here depends on the torchmetrics release

KEY = ("toypkg.core", "target")

needs_counts = pytest.mark.skipif(not references.EXACT_COUNTS, reason="reference counts are not exact here")


def _add_one(original, x):
    return original(x) + 1


@pytest.fixture
def looked(monkeypatch):
    """The names of the modules the index looks through, in order."""
    names = []
    real_add = references._Index._add

    def counting_add(self, name, module, *rest):
        names.append(name)
        return real_add(self, name, module, *rest)

    monkeypatch.setattr(references._Index, "_add", counting_add)
    return names


def _outside(monkeypatch, name, **values):
    """A module outside the toy package (a user's), in sys.modules."""
    module = types.ModuleType(name)
    vars(module).update(values)
    monkeypatch.setitem(sys.modules, name, module)
    return module


def _install(engine):
    with engine.batch():
        engine.prepare("toypkg")  # as apply() does, before anything holds the original
        return engine.install(KEY, _add_one, method=False, scope="toypkg", sweep=True)


@needs_counts
def test_a_function_only_the_scope_holds_needs_no_look_at_other_modules(toy, looked):
    import toypkg.core as core
    import toypkg.user as user

    engine = Engine()
    layer = _install(engine)
    assert looked and all(name.startswith("toypkg") for name in looked), looked
    assert core.target is user.target is layer.wrapper and user.call.__defaults__[0] is layer.wrapper
    assert user.call_kw.__kwdefaults__["fn"] is layer.wrapper and user.Runner.run.__defaults__[0] is layer.wrapper
    engine.remove(KEY, scope="toypkg")
    assert user.target is core.target is layer.original


def test_a_module_outside_the_scope_is_reached_under_another_name(toy, looked, monkeypatch):
    import toypkg.core as core

    outside = _outside(monkeypatch, "toy_user_outside", renamed=core.target)
    engine = Engine()
    layer = _install(engine)
    assert "toy_user_outside" in looked
    assert outside.renamed is layer.wrapper and outside.renamed(2) == 5
    engine.remove(KEY, scope="toypkg")
    assert outside.renamed is layer.original is core.target


def test_a_module_imported_after_the_first_look_is_looked_at(toy, monkeypatch):
    import toypkg.core as core

    engine = Engine()
    with engine.batch():
        engine.prepare("toypkg")
        outside = _outside(monkeypatch, "toy_user_late", renamed=core.target)
        layer = engine.install(KEY, _add_one, method=False, scope="toypkg", sweep=True)
    assert outside.renamed is layer.wrapper
    engine.remove(KEY, scope="toypkg")
    assert outside.renamed is core.target


def test_a_defaults_tuple_two_functions_share_counts_once(toy, monkeypatch):
    """Two places that are one reference (a shared defaults tuple) must not hide a holder outside."""
    import toypkg.core as core
    import toypkg.user as user

    twin = types.FunctionType(user.call.__code__, vars(user), "twin")
    twin.__defaults__ = user.call.__defaults__  # the same tuple object
    monkeypatch.setattr(user, "twin", twin, raising=False)
    outside = _outside(monkeypatch, "toy_user_shared", renamed=core.target)
    engine = Engine()
    layer = _install(engine)
    assert outside.renamed is layer.wrapper and twin.__defaults__[0] is layer.wrapper
    engine.remove(KEY, scope="toypkg")
    assert outside.renamed is core.target


@needs_counts
def test_the_engines_own_references_are_not_taken_for_a_holder(toy, looked):
    """A fingerprint remembered (one reference the engine keeps) is no reason to look further."""
    import toypkg.core as core

    fingerprint.fingerprint(core.target)
    assert fingerprint.held(core.target) == 1
    engine = Engine()
    layer = _install(engine)
    assert all(name.startswith("toypkg") for name in looked), looked
    engine.remove(KEY, scope="toypkg")
    assert core.target is layer.original


def test_without_exact_counts_every_module_is_looked_through(toy, looked, monkeypatch):
    import toypkg.core as core

    monkeypatch.setattr(references, "EXACT_COUNTS", False)
    outside = _outside(monkeypatch, "toy_user_uncounted", renamed=core.target)
    engine = Engine()
    layer = _install(engine)
    assert len(looked) >= len([m for m in sys.modules.values() if m is not None]) - 5
    assert outside.renamed is layer.wrapper
    engine.remove(KEY, scope="toypkg")


@needs_counts
def test_a_module_still_importing_is_looked_at_in_a_kept_look(toy, looked, monkeypatch):
    """In a look kept for the later batches of an import, a module outside the scope that is still
    importing is looked through at once (it may bind a function before those batches), not left
    out by the counts."""
    spec = types.SimpleNamespace(_initializing=True)
    importing = _outside(monkeypatch, "toy_user_importing", __spec__=spec)
    engine = Engine()
    with engine.batch(resume=True):
        engine.prepare("toypkg")
    assert "toy_user_importing" in looked
    import toypkg.core as core

    importing.renamed = core.target  # bound between two batches of the import
    spec._initializing = False
    with engine.batch(resume=True):
        layer = engine.install(KEY, _add_one, method=False, scope="toypkg", sweep=True)
    assert importing.renamed is layer.wrapper
    engine.remove(KEY, scope="toypkg")
    assert importing.renamed is core.target
