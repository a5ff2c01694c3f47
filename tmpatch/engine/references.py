"""Where a function is held: module attributes and default arguments, found and indexed.

The engine's look through ``sys.modules``: :func:`find_references` yields every
:class:`Place` that holds one of a set of objects; an :class:`_Index` shares one look per
scope between the sweeps of a batch, and looks through the modules outside the scope only
for a function that something outside the scope holds: where reference counts are exact
(CPython with its GIL), a function whose count is that of the places the scope's modules
hold it in (and of the references the engine knows it holds) is held by no other module.
Nothing here knows torchmetrics or wrapt.
"""
from __future__ import annotations

import gc
import itertools
import sys
import types
from typing import Any, Callable, Dict, Iterator, List, Optional, Set, Tuple

_MAX_WRAP_DEPTH = 32


def _exact_counts() -> bool:
    """Whether ``sys.getrefcount`` counts every reference (CPython with its GIL; not a
    free-threaded build, whose deferred reference counting leaves some out, nor PyPy)."""
    if sys.implementation.name != "cpython" or not hasattr(sys, "getrefcount"):
        return False
    if sys.version_info < (3, 13):
        return True
    import sysconfig  # here: free-threaded builds exist from 3.13 on (tests/test_architecture.py)

    return not sysconfig.get_config_var("Py_GIL_DISABLED")


#: whether :class:`_Index` may leave out modules outside the scope by reference counts
EXACT_COUNTS = _exact_counts()


def _counts(objects: Dict[int, Any]) -> List[int]:
    """The references to each of ``objects`` (its values, in order) held elsewhere than in
    ``objects``: each one's count, less that of an object a dict alone holds, counted the same
    way (one C-level path, whatever the Python version adds while counting)."""
    base = next(map(sys.getrefcount, {0: object()}.values()))
    return [count - base for count in list(map(sys.getrefcount, objects.values()))]


class PatchError(RuntimeError):
    """A target could not be resolved or wrapped."""


class Place:
    """One reference that held the original: ``kind`` is attr, defaults or kwdefaults."""

    __slots__ = ("kind", "holder", "slot")

    def __init__(self, kind: str, holder: Any, slot: Any) -> None:
        self.kind = kind
        self.holder = holder
        self.slot = slot

    def __repr__(self) -> str:
        return f"Place({self.kind!r}, {self.describe()})"

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


#: the types of values that are neither functions, nor classes, nor proxies passing for one:
#: a module's values of these are passed over without an ``isinstance`` look-up of ``__class__``
_PLAIN = frozenset({str, bytes, int, float, complex, bool, type(None), tuple, list, dict, set, frozenset,
                    types.ModuleType, types.BuiltinFunctionType, types.MethodType, property, type(Ellipsis)})


def _functions_of(module: types.ModuleType) -> List[types.FunctionType]:
    """Functions defined in ``module``, at top level and in its classes, and the plain
    functions under a wrapper there (``__wrapped__``): a wrapped function's defaults still
    serve every call that reaches it (tmpatch's own layers wrap such functions)."""
    name = module.__name__
    function = types.FunctionType
    plain = _PLAIN
    found: List[types.FunctionType] = []
    add = found.append
    for value in list(vars(module).values()):
        kind = type(value)
        if kind is function:  # the common case first: no isinstance, no __dict__ made
            add(value)
            if getattr(value, "__wrapped__", None) is not None:
                found += _inner(value)
        elif kind in plain:
            continue
        elif isinstance(value, function):  # a proxy that passes for one
            found += _unwrapped(value)
        elif isinstance(value, type) and value.__module__ == name:
            for member in list(vars(value).values()):
                kind = type(member)
                if kind in plain:
                    continue
                if kind is staticmethod or kind is classmethod or isinstance(member, (staticmethod, classmethod)):
                    member = member.__func__
                    kind = type(member)
                if kind is function:
                    add(member)
                    if getattr(member, "__wrapped__", None) is not None:
                        found += _inner(member)
                elif isinstance(member, function):
                    found += _unwrapped(member)
    return found


def _unwrapped(func: types.FunctionType) -> List[types.FunctionType]:
    """``func`` and the plain functions it wraps, outermost first."""
    return [func] + _inner(func)


def _inner(func: Any) -> List[types.FunctionType]:
    """The plain functions ``func`` wraps (``__wrapped__``), outermost first."""
    return [inner for inner in itertools.islice(_chain(func), 1, None) if type(inner) is types.FunctionType]


def _sweepable(module_name: str, module: Any) -> Optional[Dict[str, Any]]:
    """The namespace of a loaded module to look through (None for tmpatch and oddities)."""
    if module is None or module_name == "tmpatch" or module_name.startswith("tmpatch."):
        return None
    namespace = getattr(module, "__dict__", None)
    return namespace if type(namespace) is dict else None


def _in_scope(module_name: str, scope: str) -> bool:
    return module_name.startswith(scope) and (len(module_name) == len(scope) or module_name[len(scope)] == ".")


def _default_places(module: types.ModuleType, plain: bool = False) -> List[Tuple[Any, str, Any, Any]]:
    """``(value, kind, function, slot)`` for each default argument of the functions of ``module``
    (``plain``: those whose value is a plain function alone)."""
    found: List[Tuple[Any, str, Any, Any]] = []
    function = types.FunctionType
    for func in _functions_of(module):
        defaults = func.__defaults__
        if defaults:
            found += [(value, "defaults", func, index) for index, value in enumerate(defaults)
                      if not plain or type(value) is function]
        kwdefaults = func.__kwdefaults__
        if kwdefaults:
            found += [(value, "kwdefaults", func, kw) for kw, value in kwdefaults.items()
                      if not plain or type(value) is function]
    return found


def _initializing(module: Any) -> bool:
    """Whether ``module`` is still executing its own code (an import under way)."""
    return bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


class _Scan:
    """What an :class:`_Index` found for one scope: ``places`` maps ``id(value)`` to where it
    was held (one ``(kind, holder, slot)``, or a list of them)."""

    __slots__ = ("indexed", "places", "interest", "count", "unfinished", "suspects", "deferred", "holders")

    def __init__(self) -> None:
        self.indexed: Dict[str, Any] = {}  # module name -> the module indexed under it
        self.places: Dict[int, Any] = {}
        #: plain functions only: the ids looked for in modules outside the scope (the functions
        #: held by the scope's modules); None: every value is indexed
        self.interest: Optional[Set[int]] = None
        self.count = -1  # len(sys.modules) at the last look
        self.unfinished: Dict[str, int] = {}  # modules still importing when indexed -> their size then
        #: of ``interest``: the functions held somewhere besides the places the scope's modules hold
        #: them in and the engine's known references, when counted (:func:`_counts`)
        self.suspects: Set[int] = set()
        #: modules outside the scope, finished importing at the first look, not looked through yet:
        #: they can hold none but ``suspects`` (their references were counted); None once looked through
        self.deferred: Optional[Dict[str, Any]] = None
        #: id(function) -> how many entries of ``places`` name it as the holder of a default (each
        #: entry holds a reference to it)
        self.holders: Dict[int, int] = {}


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
    when first needed.

    Where reference counts are exact (:data:`EXACT_COUNTS`), the first look counts the
    references to each function the scope's modules hold: one held nowhere but in the places
    indexed (and by the engine itself: ``known``) is in no other module. The modules outside
    the scope that had finished importing then are looked through only when a function held
    elsewhere too (a *suspect*) is looked for; modules imported since, or still importing
    then, are looked through as they come. So the look costs what the scope's modules hold,
    not what the program has loaded."""

    def __init__(self, resumable: bool = False, known: Optional[Callable[[Any], int]] = None) -> None:
        #: (scope, plain) -> its scan; (scope, None): every plain function of every module
        self._scopes: Dict[Tuple[str, Optional[bool]], _Scan] = {}
        #: kept for later batches of an import under way: modules still importing are looked at
        #: again once they have grown or finished
        self.resumable = resumable
        #: how many references to an object the engine holds itself (not evidence of a holder elsewhere)
        self.known = known

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
             interest: Optional[Set[int]] = None, new: Optional[Dict[int, Any]] = None,
             holders: Optional[Dict[int, int]] = None) -> None:
        """Index ``module``'s values (a module outside the scope: those in ``interest`` alone); the
        functions of a scope's module that are new to ``interest`` go into ``new`` too, and the
        functions whose defaults are noted are counted in ``holders``."""
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
                if inside and interest is not None and id(value) not in interest:
                    interest.add(id(value))
                    if new is not None:
                        new[id(value)] = value
        if inside:
            for value, kind, holder, slot in _default_places(module, plain):
                note(places, value, (kind, holder, slot))
                if holders is not None:
                    holders[id(holder)] = holders.get(id(holder), 0) + 1

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
                if scan.deferred is not None:
                    scan.deferred.pop(name, None)
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
        first = scan.count < 0
        scan.count = len(modules)
        if first and plain and EXACT_COUNTS and scan.interest is not None:
            # the first look: modules outside the scope wait until a function held outside the scope
            # is looked for (their references are counted below). Not those still importing when the
            # look is kept for later batches of an import (they may bind a function before those).
            resumable = self.resumable
            scan.deferred = {name: module for name, module in fresh if not _in_scope(name, scope)
                             and not (resumable and _initializing(module))}
            fresh = [item for item in fresh if item[0] not in scan.deferred]
        fresh.sort(key=lambda item: not _in_scope(item[0], scope))  # the scope's functions first
        new: Dict[int, Any] = {}
        for module_name, module in fresh:
            self._add(module_name, module, scope, scan.places, plain, scan.interest, new, scan.holders)
            if not self.resumable:
                continue
            if _initializing(module):
                namespace = _sweepable(module_name, module)
                scan.unfinished[module_name] = len(namespace) if namespace is not None else 0
            else:
                scan.unfinished.pop(module_name, None)
        if new and scan.deferred is not None:
            self._count(scan, new)

    def _count(self, scan: _Scan, new: Dict[int, Any]) -> None:
        """Mark the functions of ``new`` (newly indexed) held elsewhere than in their indexed places
        and by the engine (``known``) as :attr:`_Scan.suspects`."""
        counts = _counts(new)  # first: nothing else of this look holds them yet
        known = self.known
        for (key, obj), elsewhere in zip(new.items(), counts):
            elsewhere -= self._holding(scan.places.get(key), obj) + scan.holders.get(key, 0)
            if elsewhere - (known(obj) if known is not None else 0) > 0:
                scan.suspects.add(key)
        new.clear()

    @staticmethod
    def _holding(found: Any, obj: Any) -> int:
        """How many references to ``obj`` the indexed places ``found`` hold now: one per slot of
        each distinct container (a namespace, a defaults tuple or dict shared by two functions
        counts once)."""
        slots = set()
        for kind, holder, slot in (found if type(found) is list else (found,)) if found is not None else ():
            try:
                if kind == "attr":
                    container = vars(holder)
                    held = container.get(slot) is obj
                elif kind == "defaults":
                    container = holder.__defaults__
                    held = container[slot] is obj
                else:
                    container = holder.__kwdefaults__
                    held = container.get(slot) is obj
            except Exception:  # noqa: BLE001 - the holder changed since it was indexed
                continue
            if held:
                slots.add((id(container), slot))
        return len(slots)

    def _open(self, scan: _Scan, scope: str) -> None:
        """Look through the deferred modules outside the scope, for the suspects (the only
        functions of the scope they can hold); from now on every module is looked through."""
        deferred, scan.deferred = scan.deferred, None
        if not deferred:
            return
        collecting = gc.isenabled()
        gc.disable()
        try:
            for module_name, module in deferred.items():
                if scan.indexed.get(module_name) is module:
                    self._add(module_name, module, scope, scan.places, True, scan.suspects)
        finally:
            if collecting:
                gc.enable()

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
        if scan.deferred is not None and not scan.suspects.isdisjoint(old):
            self._open(scan, scope)  # held outside the scope too: the other modules are looked through
        yield from self._held(scan.places, old, seen)
        if unknown:
            # held by no module of the scope when indexed (a replacement tmpatch made earlier, say):
            # one look at every plain function of every module, shared by the batch's later lookups
            every = self._scopes.get((scope, None))
            if every is None:
                every = self._scopes[(scope, None)] = _Scan()
            self._refresh(every, scope, True)
            yield from self._held(every.places, unknown, seen)

    def prepare(self, scope: str) -> None:
        """Make (or bring up to date) the look for plain functions of ``scope`` now: its counts
        (:meth:`_count`) then see no reference the caller is about to make."""
        scan = self._scopes.get((scope, True))
        if scan is None:
            scan = self._scopes[(scope, True)] = _Scan()
            scan.interest = set()
        self._refresh(scan, scope, True)

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
