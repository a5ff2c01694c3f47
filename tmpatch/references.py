"""Where a function is held: module attributes and default arguments, found and indexed.

The engine's look through ``sys.modules``: :func:`find_references` yields every
:class:`Place` that holds one of a set of objects; an :class:`_Index` shares one look per
scope between the sweeps of a batch. Nothing here knows torchmetrics or wrapt.
"""
from __future__ import annotations

import gc
import sys
import types
from dataclasses import dataclass
from typing import Any, Dict, Iterator, Optional, Tuple

_MAX_WRAP_DEPTH = 32


class PatchError(RuntimeError):
    """A target could not be resolved or wrapped."""


@dataclass
class Place:
    """One reference that held the original: ``kind`` is attr, defaults or kwdefaults."""

    kind: str
    holder: Any
    slot: Any

    def get(self) -> Any:
        if self.kind == "attr":
            return vars(self.holder).get(self.slot)
        if self.kind == "defaults":
            return self.holder.__defaults__[self.slot]
        return self.holder.__kwdefaults__[self.slot]

    def set(self, value: Any) -> None:
        if self.kind == "attr":
            setattr(self.holder, self.slot, value)
        elif self.kind == "defaults":
            values = list(self.holder.__defaults__)
            values[self.slot] = value
            self.holder.__defaults__ = tuple(values)
        else:
            kwdefaults = dict(self.holder.__kwdefaults__)
            kwdefaults[self.slot] = value
            self.holder.__kwdefaults__ = kwdefaults

    def describe(self) -> str:
        name = getattr(self.holder, "__qualname__", None) or getattr(self.holder, "__name__", "?")
        if self.kind == "attr":
            return f"{name}.{self.slot}"
        return f"{name}() default {self.slot}"


def resolve(module_name: str, qualname: str) -> Tuple[Any, str, Any]:
    """``(owner, attribute, value)`` for a loaded module's dotted ``qualname``.

    The value is read from the owner's own ``__dict__`` (no descriptor
    binding, no inherited attribute).
    """
    module = sys.modules.get(module_name)
    if module is None:
        raise PatchError(f"module {module_name} is not imported")
    owner: Any = module
    parts = qualname.split(".")
    for part in parts[:-1]:
        owner = vars(owner).get(part)
        if owner is None:
            raise PatchError(f"{module_name}.{qualname}: {part} not found")
    attr = parts[-1]
    if attr not in vars(owner):
        raise PatchError(f"{module_name}.{qualname} not found")
    return owner, attr, vars(owner)[attr]


def _chain(obj: Any) -> Iterator[Any]:
    """``obj`` and the objects it wraps, following ``__wrapped__``."""
    for _ in range(_MAX_WRAP_DEPTH):
        yield obj
        try:
            obj = object.__getattribute__(obj, "__wrapped__")
        except AttributeError:
            try:
                obj = obj.__wrapped__
            except Exception:  # noqa: BLE001 - foreign objects may raise anything
                return
        except Exception:  # noqa: BLE001
            return


def _functions_of(module: types.ModuleType) -> Iterator[types.FunctionType]:
    """Functions defined in ``module``, at top level and in its classes."""
    name = module.__name__
    for value in list(vars(module).values()):
        if isinstance(value, types.FunctionType):
            yield value
        elif isinstance(value, type) and value.__module__ == name:
            for member in list(vars(value).values()):
                if isinstance(member, (staticmethod, classmethod)):
                    member = member.__func__
                if isinstance(member, types.FunctionType):
                    yield member


def _sweepable(module_name: str, module: Any) -> Optional[Dict[str, Any]]:
    """The namespace of a loaded module to look through (None for tmpatch and oddities)."""
    if module is None or module_name == "tmpatch" or module_name.startswith("tmpatch."):
        return None
    namespace = getattr(module, "__dict__", None)
    return namespace if type(namespace) is dict else None


def _in_scope(module_name: str, scope: str) -> bool:
    return module_name == scope or module_name.startswith(scope + ".")


def _default_places(module: types.ModuleType) -> Iterator[Tuple[Any, Place]]:
    """``(value, place)`` for each default argument of the functions of ``module``."""
    for func in _functions_of(module):
        for index, value in enumerate(func.__defaults__ or ()):
            yield value, Place("defaults", func, index)
        for kw, value in (func.__kwdefaults__ or {}).items():
            yield value, Place("kwdefaults", func, kw)


class _Index:
    """One look through ``sys.modules`` per scope, shared by the sweeps of one
    :meth:`Engine.batch`: ``id(value)`` -> where it was held. Modules imported since are
    added at the next lookup, and each place is checked against its current value."""

    def __init__(self) -> None:
        self._scopes: Dict[Tuple[str, bool], Tuple[Dict[str, Any], Dict[int, Any]]] = {}

    @staticmethod
    def _note(places: Dict[int, Any], value: Any, entry: Tuple[str, Any, Any]) -> None:
        key = id(value)
        found = places.get(key)
        if found is None:
            places[key] = entry  # one holder, the common case: no list
        elif type(found) is list:
            found.append(entry)
        else:
            places[key] = [found, entry]

    def _add(self, module_name: str, module: Any, scope: str, places: Dict[int, Any], plain: bool) -> None:
        namespace = _sweepable(module_name, module)
        if namespace is None:
            return
        note = self._note
        function = types.FunctionType
        for attr, value in list(namespace.items()):
            if not plain or type(value) is function:
                note(places, value, ("attr", module, attr))
        if _in_scope(module_name, scope):
            for value, place in _default_places(module):
                if not plain or type(value) is function:
                    note(places, value, (place.kind, place.holder, place.slot))

    def find(self, old: Dict[int, Any], scope: str) -> Iterator[Place]:
        # plain functions (what tmpatch looks for, but for a stranger's wrapper object) are held
        # only where a plain function is: an index of those alone is a fifth of the size
        plain = all(type(obj) is types.FunctionType for obj in old.values())
        indexed, places = self._scopes.setdefault((scope, plain), ({}, {}))
        collecting = gc.isenabled()
        gc.disable()  # tens of thousands of small tuples: the collector would triple the cost
        try:
            for module_name, module in list(sys.modules.items()):
                if indexed.get(module_name) is not module:
                    indexed[module_name] = module
                    self._add(module_name, module, scope, places, plain)
        finally:
            if collecting:
                gc.enable()
        seen = set()
        for key, obj in old.items():
            found = places.get(key)
            if found is None:
                continue
            for kind, holder, slot in (found if type(found) is list else (found,)):
                mark = (id(holder), kind, slot)
                if mark in seen:
                    continue
                place = Place(kind, holder, slot)
                try:
                    current = place.get()
                except Exception:  # noqa: BLE001 - the holder changed since it was indexed
                    continue
                if current is obj:
                    seen.add(mark)
                    yield place


def find_references(old: Dict[int, Any], scope: str, index: Optional[_Index] = None) -> Iterator[Place]:
    """Every module attribute, and every default argument of a function in a
    module under ``scope``, that holds one of ``old`` (keyed by ``id``).
    With ``index``, the look through ``sys.modules`` is shared with other calls."""
    if index is not None:
        yield from index.find(old, scope)
        return

    for module_name, module in list(sys.modules.items()):
        namespace = _sweepable(module_name, module)
        if namespace is None:
            continue
        for attr, value in list(namespace.items()):
            if id(value) in old and old[id(value)] is value:
                yield Place("attr", module, attr)
        if _in_scope(module_name, scope):
            for value, place in _default_places(module):
                if id(value) in old and old[id(value)] is value:
                    yield place
