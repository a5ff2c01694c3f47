"""The patching engine: wrappers, rebinding, and post-import hooks on wrapt.

It knows nothing of torchmetrics. It is told a target (module name and dotted
qualname) and a replacement, and it

* wraps the original in a layer (:mod:`tmpatch.engine.layers`: a plain function with
  ``__wrapped__``, with the original's parameters where it has plain ones; gated and
  inline replacements) that calls the replacement while the layer is active and the
  original once it is not;
* puts the wrapper in every place that held the original: the owner's
  attribute, every module that bound the name with ``from ... import``, and
  default arguments of functions in the target's package;
* on removal puts the original back in each of those places (``is``-identical),
  and never unwraps a layer somebody else put on top of its own: that layer is
  left in place, turned into a pass-through, and the reason reported;
* sets an attribute of a module or class (a *setting*: a value, not a function wrapped) and
  on removal puts back exactly what was there (an absent attribute is deleted again), unless
  somebody else has set it since: their object is left in place, and that is reported;
* arms wrapt post-import hooks that run a callback when a module is imported,
  and disarms them; a callback's exception never reaches the importer, but for
  an :class:`ImportRefused` (strict mode: the caller asked for the error);
* survives ``os.fork()`` (DataLoader workers) while another thread holds ``lock``: the
  fork waits for it a little (:data:`FORK_WAIT_S`), so the child starts from a finished
  apply or revert, and the child never inherits the lock as held by a thread it lacks.

Originals are saved once per target (``original()``), so a later apply reuses
the same wrapper object and no second layer is ever stacked. Finding the places that
hold a function is :mod:`tmpatch.engine.references`.
"""
from __future__ import annotations

import contextlib
import gc
import logging
import os
import threading
import types
import weakref
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import wrapt

from tmpatch.engine import fingerprint
from tmpatch.engine.layers import Key, Layer, Replacement, give, wrap
from tmpatch.engine.references import PatchError, Place, _chain, _Index, find_references, owner_of, resolve

log = logging.getLogger("tmpatch")

#: how long ``os.fork()`` waits for another thread's hold of an engine's lock to end (seconds);
#: past it the child gets a fresh lock and whatever state that thread had reached
FORK_WAIT_S = 2.0

_engines: "weakref.WeakSet[Engine]" = weakref.WeakSet()

#: what a setting found where its attribute was absent (:meth:`Engine.put`)
_ABSENT = object()


def _before_fork() -> None:
    for engine in list(_engines):
        engine._fork.held = engine.lock.acquire(timeout=FORK_WAIT_S)


def _let_go(engine: "Engine") -> bool:
    """Release the forking thread's hold of ``engine.lock``; False if the fork got none."""
    if not getattr(engine._fork, "held", False):
        return False
    engine._fork.held = False
    engine.lock.release()
    return True


def _after_fork_in_parent() -> None:
    for engine in list(_engines):
        _let_go(engine)


def _after_fork_in_child() -> None:
    for engine in list(_engines):
        if not _let_go(engine):  # held by a thread the child lacks: a lock of its own, and no batch of that thread
            engine.lock = threading.RLock()
            engine._index = engine._kept = None


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                        after_in_child=_after_fork_in_child)


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Run the block with Python's cyclic garbage collector off, and put it back as it was (on
    only if it was on). The objects a block makes and drops again then never reach an older
    generation (a full collection of a large program's heap costs a tenth of a second, and the
    survivors of many young collections set one off); those it keeps are collected as ever
    afterwards. Nothing else of the collector (thresholds, frozen objects) is touched. The
    switch is the process's: a block that found it on turns it on again when it ends, even if
    another thread of the program turned it off meanwhile (the one case it is not put back)."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()


def _holds(current: Any, layer: Layer) -> bool:
    """Whether ``current`` is the layer's wrapper (or an earlier copy of it), or wraps it."""
    ours = layer.ours()
    return any(obj is mine for obj in _chain(current) for mine in ours)


class ImportRefused(RuntimeError):
    """An error a post-import hook's callback raises on purpose: it reaches the import that fired
    the hook (every other error is logged, and the import goes on)."""


class Engine:
    """Installs and removes layers; owns the post-import hooks. Use ``lock``."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self._layers: Dict[Key, Layer] = {}
        self._settings: Dict[Key, Tuple[Any, Any]] = {}  # key -> (what was there, or _ABSENT; ours)
        self._hooks: Dict[str, Callable[[types.ModuleType], None]] = {}
        self._index: Optional[_Index] = None
        self._kept: Optional[_Index] = None
        self._fork = threading.local()  # ``held``: the forking thread's hold of ``lock`` (:func:`_before_fork`)
        _engines.add(self)

    @contextlib.contextmanager
    def batch(self, *, resume: bool = False) -> Iterator[None]:
        """Installs and removes in the block share one look through ``sys.modules``
        (one sweep costs tens of milliseconds with torch loaded). Hold ``lock``.

        ``resume``: the block runs in an import that is still under way (a post-import hook),
        as did the last such block: it starts from that block's look, to which only the
        modules imported since and those still importing then are added (the others ran no
        code since). Any other block starts afresh and drops the kept look."""
        if self._index is not None:  # nested: the outer batch's index serves
            yield
            return
        self._index = self._kept if resume and self._kept is not None else \
            _Index(resumable=resume, known=fingerprint.held)
        self._kept = None
        try:
            yield
        finally:
            if resume:
                self._kept = self._index
            self._index = None

    def prepare(self, scope: str) -> None:
        """In a batch, look through ``sys.modules`` for ``scope`` now, before the caller builds
        a replacement (which holds the original): the look counts who else holds each function
        of the scope (:mod:`tmpatch.engine.references`), and one held by the scope's modules
        alone needs no look through the program's other modules. Nothing outside a batch."""
        if self._index is not None:
            self._index.prepare(scope)

    # -- layers -----------------------------------------------------------
    def layer(self, key: Key) -> Optional[Layer]:
        return self._layers.get(key)

    def layer_of(self, obj: Any) -> Optional[Layer]:
        """The layer whose wrapper ``obj`` is (None for anything else: never raises, whatever
        ``obj``'s attributes do)."""
        try:
            key = getattr(obj, "_self_tmpatch_key", None)
            layer = self._layers.get(key) if type(key) is tuple else None
        except Exception:  # noqa: BLE001 - a foreign object: a __getattr__ that raises, an unhashable key
            return None
        return layer if layer is not None and layer.wrapper is obj else None

    def original(self, key: Key) -> Any:
        """What the target is underneath tmpatch: the saved original where
        tmpatch's layer is (still) in the object's wrap chain, else the object."""
        current = resolve(*key)[2]
        layer = self._layers.get(key)
        if layer is not None and _holds(current, layer):
            return layer.original
        return current

    def install(self, key: Key, replacement: Replacement, *, method: bool, scope: str, sweep: bool) -> Layer:
        """Wrap the object at ``key`` and put the wrapper everywhere it was.

        ``method``: the target is a function in a class body (``self`` is
        passed first). ``sweep``: look through every loaded module for
        references too (needed when the target's module was imported before).
        When tmpatch's layer is still in the owner's wrap chain (under a
        stranger's layer, or put back by a mock after a revert) it is re-armed
        and the references that hold the original again are rebound to it.
        On any error nothing is left changed.
        """
        owner, attr, current = resolve(*key)
        layer = self._layers.get(key)
        rearm = False
        if layer is not None and current is not layer.original:
            if _holds(current, layer):
                rearm = True  # ours is still there (on top, or under a stranger's layer)
            else:
                layer = None  # the target was replaced since: start afresh
        if layer is None:
            layer = Layer(key=key, original=current)
            layer.wrapper = wrap(layer, replacement, method)
        else:
            give(layer, replacement)
        places: List[Place] = [] if rearm else [Place("attr", owner, attr)]
        if sweep and not method:
            places += [p for p in find_references({id(layer.original): layer.original}, scope, self._index)
                       if not (p.kind == "attr" and p.holder is owner and p.slot == attr)]
        done: List[Place] = []
        try:
            for place in places:
                place.set(layer.wrapper)
                done.append(place)
        except Exception:
            for place in done:
                place.set(layer.original)
            raise
        if rearm:
            known = {(id(p.holder), p.kind, p.slot) for p in layer.places}
            layer.places += [p for p in done if (id(p.holder), p.kind, p.slot) not in known]
            if not any(p.kind == "attr" and p.holder is owner and p.slot == attr for p in layer.places):
                layer.places.append(Place("attr", owner, attr))
        else:
            layer.places = done
        layer.turn(True)
        layer.residue = ""
        self._layers[key] = layer
        return layer

    def swap(self, key: Key, replacement: Replacement) -> None:
        """Give an installed layer another replacement (the wrapper and its places stay)."""
        layer = self._layers.get(key)
        if layer is None:
            raise PatchError(f"{key[0]}.{key[1]} has no tmpatch layer")
        give(layer, replacement)

    def lingering(self, key: Key) -> List[str]:
        """After a removal: the places tmpatch's (inactive, pass-through) wrapper is in again,
        or still in, such as a binding a mock put back on exit. Empty while the layer is active."""
        layer = self._layers.get(key)
        if layer is None or layer.active:
            return []
        found = []
        ours = layer.ours()
        for place in layer.watch:
            try:
                current = place.get()
            except Exception:  # noqa: BLE001 - the holder changed shape
                continue
            if any(obj is mine for obj in _chain(current) for mine in ours):
                found.append(place.describe())
        return found

    def remove(self, key: Key, *, scope: str) -> str:
        """Put the original back everywhere; return what had to be left, if anything.
        Never raises: a place that cannot be restored keeps the layer, inactive (it calls
        the original), and is named in the returned text."""
        layer = self._layers.get(key)
        if layer is None or not layer.active:
            return ""
        layer.turn(False)  # from now on every remaining reference passes through
        notes: List[str] = []
        places = list(layer.places)
        known = {(id(p.holder), p.kind, p.slot) for p in places}
        ours = layer.ours()
        try:
            for place in find_references({id(obj): obj for obj in ours}, scope, self._index):
                if (id(place.holder), place.kind, place.slot) not in known:
                    places.append(place)
        except Exception as exc:  # noqa: BLE001 - a module that cannot be looked through
            notes.append(f"the look for other references failed ({type(exc).__name__}: {exc}); "
                         "any left there pass through to the original")
        for place in places:
            try:
                current = place.get()
            except Exception:  # noqa: BLE001 - the holder changed shape; nothing of ours there
                continue
            if any(current is mine for mine in ours):
                try:
                    place.set(layer.original)
                except Exception as exc:  # noqa: BLE001 - a holder that refuses: the rest still go back
                    notes.append(f"{place.describe()} refused the original ({type(exc).__name__}: {exc}); "
                                 "tmpatch's layer is left there as a pass-through")
            elif any(obj is mine for obj in _chain(current) for mine in ours):
                notes.append(
                    f"{place.describe()} is wrapped on top of tmpatch by {type(current).__name__}; "
                    "tmpatch's layer is left there as a pass-through"
                )
        layer.watch = places
        layer.places = []
        layer.residue = "; ".join(notes)
        for note in notes:
            log.warning("revert: %s", note)
        return layer.residue

    # -- settings ---------------------------------------------------------
    def put(self, key: Key, value: Any) -> None:
        """Set the attribute at ``key`` (in its owner's own namespace: a module's or a class's)
        to ``value``, keeping what was there, or that nothing was, for :meth:`take`. Raises
        :class:`PatchError` when the owner is not found or tmpatch has set the attribute already."""
        if key in self._settings:
            raise PatchError(f"{key[0]}.{key[1]} is set by tmpatch already")
        owner, attr = owner_of(*key)
        before = vars(owner).get(attr, _ABSENT)
        setattr(owner, attr, value)
        self._settings[key] = (before, value)

    def take(self, key: Key) -> str:
        """Put back what :meth:`put` found at ``key``: the object that was there, or no attribute
        where there was none. Never raises: an attribute that holds another object than the one
        put (set by somebody else since) is left as it is, and the returned text says so."""
        entry = self._settings.pop(key, None)
        if entry is None:
            return ""
        before, ours = entry
        path = f"{key[0]}.{key[1]}"
        try:
            owner, attr = owner_of(*key)
            current = vars(owner).get(attr, _ABSENT)
            if current is _ABSENT:
                note = f"{path} was deleted by another tool after tmpatch: it is left absent"
            elif current is not ours:
                note = f"{path} was set again by another tool after tmpatch: its value is left there"
            elif before is _ABSENT:
                delattr(owner, attr)
                return ""
            else:
                setattr(owner, attr, before)
                return ""
        except Exception as exc:  # noqa: BLE001 - an owner gone or one that refuses: nothing more to do
            note = f"{path} could not be put back ({type(exc).__name__}: {exc})"
        log.warning("revert: %s", note)
        return note

    def settings(self) -> List[Key]:
        """The attributes set by :meth:`put` and not yet taken back."""
        return list(self._settings)

    # -- post-import hooks ------------------------------------------------
    def arm(self, module_name: str, callback: Callable[[types.ModuleType], None]) -> None:
        """Run ``callback(module)`` when ``module_name`` is imported (once)."""
        if module_name in self._hooks:
            return

        def hook(module: types.ModuleType) -> None:
            if self._hooks.get(module_name) is not hook:
                return  # disarmed
            del self._hooks[module_name]
            try:
                callback(module)
            except ImportRefused:
                raise
            except Exception:  # noqa: BLE001 - never break the user's import
                log.exception("tmpatch: post-import hook for %s failed; originals left in place", module_name)

        self._hooks[module_name] = hook
        wrapt.register_post_import_hook(hook, module_name)

    def disarm(self, module_name: Optional[str] = None) -> None:
        """Disarm one hook, or all; also drop them from wrapt's registry."""
        names = list(self._hooks) if module_name is None else [module_name]
        # wrapt's stubs leave out wrapt.importer (there at run time)
        registry = getattr(wrapt.importer, "_post_import_hooks", None)  # type: ignore[attr-defined]  # see above
        registry_lock = getattr(wrapt.importer, "_post_import_hooks_lock", None)  # type: ignore[attr-defined]  # see above
        for name in names:
            hook = self._hooks.pop(name, None)
            if hook is None or not isinstance(registry, dict) or registry_lock is None:
                continue
            with registry_lock:
                hooks = registry.get(name)
                if isinstance(hooks, list) and hook in hooks:
                    hooks.remove(hook)
                    if not hooks:
                        del registry[name]

    def armed(self) -> List[str]:
        return sorted(self._hooks)
