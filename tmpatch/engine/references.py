"""Where a function is held: module attributes and default arguments, found and indexed.

The engine's look through ``sys.modules``: :func:`find_references` yields every
:class:`Place` that holds one of a set of objects; an :class:`_Index` shares one look per
scope between the sweeps of a batch. Nothing here knows torchmetrics or wrapt.
"""
from __future__ import annotations

import gc
import itertools
import sys
import types
from dataclasses import dataclass
from typing import Any, Dict, Iterator, Optional, Set, Tuple

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


def owner_of(module_name: str, qualname: str) -> Tuple[Any, str]:
    """``(owner, attribute)`` for a loaded module's dotted ``qualname``: the module or class
    whose own ``__dict__`` holds the attribute, or would (the attribute may be absent)."""
    module = sys.modules.get(module_name)
    if module is None:
        raise PatchError(f"module {module_name} is not imported")
    owner: Any = module
    parts = qualname.split(".")
    for part in parts[:-1]:
        owner = vars(owner).get(part)
        if owner is None:
            raise PatchError(f"{module_name}.{qualname}: {part} not found")
    return owner, parts[-1]


def resolve(module_name: str, qualname: str) -> Tuple[Any, str, Any]:
    """``(owner, attribute, value)`` for a loaded module's dotted ``qualname``.

    The value is read from the owner's own ``__dict__`` (no descriptor
    binding, no inherited attribute).
    """
    owner, attr = owner_of(module_name, qualname)
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
    """Functions defined in ``module``, at top level and in its classes, and the plain
    functions under a wrapper there (``__wrapped__``): a wrapped function's defaults still
    serve every call that reaches it (tmpatch's own layers wrap such functions)."""
    name = module.__name__
    for value in list(vars(module).values()):
        if isinstance(value, types.FunctionType):
            yield from _unwrapped(value)
        elif isinstance(value, type) and value.__module__ == name:
            for member in list(vars(value).values()):
                if isinstance(member, (staticmethod, classmethod)):
                    member = member.__func__
                if isinstance(member, types.FunctionType):
                    yield from _unwrapped(member)


def _unwrapped(func: types.FunctionType) -> Iterator[types.FunctionType]:
    """``func`` and the plain functions it wraps, outermost first."""
    yield func
    if type(func) is types.FunctionType and "__wrapped__" not in func.__dict__:
        return  # the common case, without the look-up's exception
    for inner in itertools.islice(_chain(func), 1, None):
        if type(inner) is types.FunctionType:
            yield inner


def _sweepable(module_name: str, module: Any) -> Optional[Dict[str, Any]]:
    """The namespace of a loaded module to look through (None for tmpatch and oddities)."""
    if module is None or module_name == "tmpatch" or module_name.startswith("tmpatch."):
        return None
    namespace = getattr(module, "__dict__", None)
    return namespace if type(namespace) is dict else None


def _in_scope(module_name: str, scope: str) -> bool:
    return module_name == scope or module_name.startswith(scope + ".")


def _default_places(module: types.ModuleType) -> Iterator[Tuple[Any, str, Any, Any]]:
    """``(value, kind, function, slot)`` for each default argument of the functions of ``module``."""
    for func in _functions_of(module):
        defaults = func.__defaults__
        if defaults:
            for index, value in enumerate(defaults):
                yield value, "defaults", func, index
        kwdefaults = func.__kwdefaults__
        if kwdefaults:
            for kw, value in kwdefaults.items():
                yield value, "kwdefaults", func, kw


def _initializing(module: Any) -> bool:
    """Whether ``module`` is still executing its own code (an import under way)."""
    return bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


class _Scan:
    """What an :class:`_Index` found for one scope: ``places`` maps ``id(value)`` to where it
    was held (one ``(kind, holder, slot)``, or a list of them)."""

    __slots__ = ("indexed", "places", "interest", "count", "unfinished")

    def __init__(self) -> None:
        self.indexed: Dict[str, Any] = {}  # module name -> the module indexed under it
        self.places: Dict[int, Any] = {}
        #: plain functions only: the ids looked for in modules outside the scope (the functions
        #: held by the scope's modules); None: every value is indexed
        self.interest: Optional[Set[int]] = None
        self.count = -1  # len(sys.modules) at the last look
        self.unfinished: Dict[str, int] = {}  # modules still importing when indexed -> their size then


class _Index:
    """One look through ``sys.modules`` per scope, shared by the sweeps of one
    :meth:`Engine.batch`: ``id(value)`` -> where it was held. Modules imported since (names
    new to ``sys.modules``; when a name has left it, every entry's object is compared), and
    modules that were still importing (whose namespace has grown or is complete since), are
    added at the next lookup, and each place is checked against its current value.

    For plain functions (what tmpatch looks for, but for a stranger's wrapper object) only
    values held by a module of the scope are indexed: every plain function of the scope's
    modules, and in other modules those same functions alone (a C-level test skips a module
    that holds none). A function looked for that no module of the scope held when indexed is
    looked for in a second index of every plain function of every module, made once per batch
    when first needed."""

    def __init__(self, resumable: bool = False) -> None:
        #: (scope, plain) -> its scan; (scope, None): every plain function of every module
        self._scopes: Dict[Tuple[str, Optional[bool]], _Scan] = {}
        #: kept for later batches of an import under way: modules still importing are looked at
        #: again once they have grown or finished
        self.resumable = resumable

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

    def _add(self, module_name: str, module: Any, scope: str, places: Dict[int, Any], plain: bool,
             interest: Optional[Set[int]] = None) -> None:
        namespace = _sweepable(module_name, module)
        if namespace is None:
            return
        note = self._note
        function = types.FunctionType
        inside = _in_scope(module_name, scope)
        if plain and not inside and interest is not None:
            if interest.isdisjoint(map(id, namespace.values())):
                return  # holds none of the scope's functions (the common case, decided in C)
            for attr, value in list(namespace.items()):
                if id(value) in interest and type(value) is function:
                    note(places, value, ("attr", module, attr))
            return
        for attr, value in list(namespace.items()):
            if not plain or type(value) is function:
                note(places, value, ("attr", module, attr))
                if inside and interest is not None:
                    interest.add(id(value))
        if inside:
            for value, kind, holder, slot in _default_places(module):
                if not plain or type(value) is function:
                    note(places, value, (kind, holder, slot))

    def _update(self, scan: _Scan, scope: str, plain: bool) -> None:
        """Index the modules imported since the last look, and those that were still importing."""
        modules = sys.modules
        if len(modules) == scan.count and not scan.unfinished:
            return
        indexed = scan.indexed
        names = modules.keys() - indexed.keys()  # the names imported since (in C: a few hundred microseconds less)
        if len(modules) == len(indexed) + len(names):
            fresh = [(name, modules.get(name)) for name in names]
        else:  # a module left sys.modules: forget it, and compare every entry's object
            for name in indexed.keys() - modules.keys():
                del indexed[name]
            fresh = [item for item in list(modules.items()) if indexed.get(item[0]) is not item[1]]
        for module_name, module in fresh:
            indexed[module_name] = module
        for module_name, size in list(scan.unfinished.items()):
            module = modules.get(module_name)
            namespace = _sweepable(module_name, module)
            if module is not scan.indexed.get(module_name) or namespace is None:
                del scan.unfinished[module_name]
            elif not _initializing(module) or len(namespace) != size:
                fresh.append((module_name, module))
        scan.count = len(modules)
        fresh.sort(key=lambda item: not _in_scope(item[0], scope))  # the scope's functions first
        for module_name, module in fresh:
            self._add(module_name, module, scope, scan.places, plain, scan.interest)
            if not self.resumable:
                continue
            if _initializing(module):
                namespace = _sweepable(module_name, module)
                scan.unfinished[module_name] = len(namespace) if namespace is not None else 0
            else:
                scan.unfinished.pop(module_name, None)

    def find(self, old: Dict[int, Any], scope: str) -> Iterator[Place]:
        plain = all(type(obj) is types.FunctionType for obj in old.values())
        scan = self._scopes.get((scope, plain))
        if scan is None:
            scan = self._scopes[(scope, plain)] = _Scan()
            if plain:
                scan.interest = set()
        self._refresh(scan, scope, plain)
        seen: Set[Tuple[int, str, Any]] = set()
        unknown = {}
        if scan.interest is not None:
            unknown = {key: obj for key, obj in old.items() if key not in scan.interest}
            old = {key: obj for key, obj in old.items() if key in scan.interest}
        yield from self._held(scan.places, old, seen)
        if unknown:
            # held by no module of the scope when indexed (a replacement tmpatch made earlier, say):
            # one look at every plain function of every module, shared by the batch's later lookups
            every = self._scopes.get((scope, None))
            if every is None:
                every = self._scopes[(scope, None)] = _Scan()
            self._refresh(every, scope, True)
            yield from self._held(every.places, unknown, seen)

    def _refresh(self, scan: _Scan, scope: str, plain: bool) -> None:
        collecting = gc.isenabled()
        gc.disable()  # thousands of small tuples: the collector would triple the cost
        try:
            self._update(scan, scope, plain)
        finally:
            if collecting:
                gc.enable()

    @staticmethod
    def _held(places: Dict[int, Any], old: Dict[int, Any], seen: Set[Tuple[int, str, Any]]) -> Iterator[Place]:
        """The places of ``places`` that hold one of ``old`` now, each once (``seen``)."""
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
            for value, kind, holder, slot in _default_places(module):
                if id(value) in old and old[id(value)] is value:
                    yield Place(kind, holder, slot)
