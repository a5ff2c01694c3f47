"""The public API: ``apply()``, ``revert()``, ``status()``.

This layer joins the catalogue (:mod:`tmpatch.patches`, which knows
torchmetrics) to the engine (:mod:`tmpatch.engine.core`, which knows wrapt): it
gates each patch on the release and on the fingerprint of the code it finds,
and keeps the row ``status()`` shows for it.
"""
from __future__ import annotations

import logging
import sys
import types
import warnings
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Set, Tuple, Union

from tmpatch import patches as catalogue
from tmpatch.control import gating, likeness, selection
from tmpatch.control.report import PatchStatus, Report, State
from tmpatch.engine import cache
from tmpatch.engine.core import Engine, ImportRefused, collector_paused
from tmpatch.runtime import compiled, wrappers
from tmpatch.runtime.policies import current as current_policies
from tmpatch.spec import LEAVE, Patch, Recognised, Requirement, Setting, Target, Variant

log = logging.getLogger("tmpatch")

Names = Union[None, str, Iterable[str]]


class TmpatchError(ImportRefused):
    """``apply(strict=True)`` could not apply every requested patch (a RuntimeError; raised by
    ``apply()``, or by the import that installs a patch ``apply()`` had armed)."""


class TmpatchWarning(UserWarning):
    """Something tmpatch could not do; the program runs on unpatched."""


_engine = Engine()
wrappers.answer_with(_engine.layer_of)  # what patched code may ask about the wrappers
_rows: Dict[str, Tuple[str, str]] = {}  # name -> (state, reason)
#: applied patch -> its variant and built piece (``gating.build``), for one target
Held = Dict[str, Tuple[Variant, Optional[Callable[..., Any]]]]
_held: Dict[Tuple[str, str], Held] = {}  # target key -> the patches that hold it
_pending: Set[str] = set()
#: pending patch -> the words a strict error about it begins with: an apply() was strict about it
_strict: Dict[str, str] = {}
_warned_missing = False
#: the release the gating looked at, and the fingerprint it found at each target (tmpatch.control.likeness)
_codes: Tuple[List[Optional[str]], Dict[str, Optional[str]]] = ([None], {})


def _scope(target: Target) -> str:
    return target.module.split(".")[0]


def _key(target: Union[Target, Requirement, Setting]) -> Tuple[str, str]:
    return (target.module, target.qualname)


def _is_applied(name: str) -> bool:
    """Whether ``name``'s code is in place (applied, or partial: to the targets recognised)."""
    return _rows.get(name, (State.OFF, ""))[0] in State.IN_PLACE


# -- installing ----------------------------------------------------------------
def _here(patch: Patch) -> List[Target]:
    return gating.here(patch, catalogue.release())


def _modules(patch: Patch) -> List[str]:
    return gating.modules(patch, catalogue.release())


def _original(target: Union[Target, Requirement]) -> Any:
    """The release's own function at a target or requirement (underneath tmpatch's layer)."""
    return _engine.original(_key(target))


def _recognise(patch: Patch) -> Tuple[str, str, List[Tuple[Target, Variant]]]:
    release = catalogue.release()
    seen, codes = _codes
    if seen[0] != release:  # another release since (an upgrade, a test's): what was found is not its
        seen[0] = release
        codes.clear()
    return gating.recognise(patch, release, _original, codes)


def _joined(key: Tuple[str, str], module: Any, holders: Held) -> Callable[..., Any]:
    """The replacement of ``holders`` for the target ``key``: made from the original that
    tmpatch's layer wraps while it is in place (whatever a mock has put on top of it now)."""
    layer = _engine.layer(key)
    original = layer.original if layer is not None and layer.active else _engine.original(key)
    return gating.joined(original, module, list(holders.values()))


def _holders(key: Tuple[str, str]) -> Held:
    """The applied patches that hold the target ``key`` (several only for edits), in catalogue order."""
    held = _held.get(key, {})
    return {name: held[name] for name in catalogue.NAMES if name in held}


def _put(target: Target, patch: Patch, variant: Variant, told: Recognised, sweep: bool) -> None:
    """Install ``patch``'s replacement for ``target``, joined with those of the patches that
    hold it already (edits applied together, wrappers around them). ``told``: what the
    gating recognised (:func:`gating.recognised`), for builders that are told it."""
    key = _key(target)
    module = sys.modules[target.module]
    if sweep:
        _engine.prepare(_scope(target))  # before the replacement, which holds the original, is built
    part = (variant, gating.build(variant, module, told))
    joined = {**_holders(key), patch.name: part}
    replacement = _joined(key, module, {name: joined[name] for name in catalogue.NAMES if name in joined})
    layer = _engine.layer(key)
    if layer is not None and layer.active:
        _engine.swap(key, replacement)
    else:
        _engine.install(key, replacement, method="." in target.qualname, scope=_scope(target), sweep=sweep)
    _held.setdefault(key, {})[patch.name] = part


def _take(target: Target, patch: Patch, dropped: Dict[str, str]) -> str:
    """Remove ``patch``'s part of ``target``: the layer goes with its last holder. Never
    raises: the other holders' replacement is joined from their pieces as built when they
    were applied (no builder runs, nothing installed now is read); should that still fail,
    the layer goes too and each of them is put in ``dropped``, with why (:func:`_drop`).
    Returns what had to be left in place, if anything."""
    key = _key(target)
    held = _held.get(key, {})
    if held.pop(patch.name, None) is None:
        return ""  # recognised only (a fixed variant), or never installed: nothing of this patch there
    rest = _holders(key)
    if rest:
        try:
            _engine.swap(key, _joined(key, sys.modules[target.module], rest))
            return ""
        except Exception as exc:  # noqa: BLE001 - a removal never fails half-way
            why = f"{target.path} could not be rebuilt without {patch.name} ({type(exc).__name__}: {exc})"
            log.warning("tmpatch: %s; taken out too: %s", why, ", ".join(rest))
            held.clear()
            for name in rest:
                dropped.setdefault(name, why)
    return _engine.remove(key, scope=_scope(target))


def _withdraw(patch: Patch, dropped: Dict[str, str]) -> str:
    """Take every part of ``patch`` out (:func:`_take`, ``after_revert``); never raises.
    Returns the row's reason."""
    notes = []
    for target in _here(patch):
        before = set(dropped)
        residue = _take(target, patch, dropped)
        if residue:
            notes.append(residue)
        lost = [name for name in dropped if name not in before]
        if lost:
            notes.append(f"{', '.join(lost)} could not keep {target.path} without it: reverted too")
    if patch.after_revert is not None:
        try:
            patch.after_revert()
        except Exception as exc:  # noqa: BLE001
            log.exception("tmpatch: %s: after_revert failed", patch.name)
            notes.append(f"after_revert failed ({type(exc).__name__}: {exc})")
    for setting in patch.settings:  # after after_revert: its bookkeeping may still need them
        residue = _engine.take(_key(setting))
        if residue:
            notes.append(residue)
    return "; ".join(notes) or "originals restored"


def _drop(dropped: Dict[str, str]) -> None:
    """A patch is in place whole or not at all: the patches that lost a target they shared
    with one taken out (:func:`_take`) are taken out too, their rows failed and saying why."""
    while dropped:
        name = next(n for n in catalogue.NAMES if n in dropped)
        why = dropped.pop(name)
        if _is_applied(name):
            note = _withdraw(catalogue.load(name), dropped)
            _rows[name] = (State.FAILED, f"{why}; {name} taken out whole: {note}")


def _install(patch: Patch, sweep: bool) -> None:
    state, reason, found = _recognise(patch)
    if state in State.IN_PLACE:
        done: List[Target] = []
        placed: List[Tuple[str, str]] = []
        try:
            told = gating.recognised(patch, found, _original)
            for target, variant in found:
                if variant.fixed:
                    continue
                _put(target, patch, variant, told, sweep)
                done.append(target)
            for setting in patch.settings:
                value = setting.value(sys.modules[setting.module])
                if value is not LEAVE:
                    _engine.put(_key(setting), value)
                    placed.append(_key(setting))
        except Exception as exc:  # noqa: BLE001 - a patch must never break the program
            dropped: Dict[str, str] = {}
            for key in reversed(placed):
                _engine.take(key)
            for target in done:
                _take(target, patch, dropped)
            _drop(dropped)
            state, reason = State.FAILED, f"{type(exc).__name__}: {exc}; original left in place"
    if state in State.IN_PLACE:
        compiled.prepare(_engine.arm)  # what the patches' compiled paths need of torch (once; cheap after)
    if state in State.IN_PLACE and patch.after_apply is not None:
        patch.after_apply()
    if state == State.APPLIED:
        log.info("tmpatch: %s applied (%s)", patch.name, reason)
    elif state in State.PROBLEMS and not gating.declined(patch, catalogue.release()):
        log.warning("tmpatch: %s %s: %s", patch.name, state, reason)
    elif state in State.PROBLEMS:  # a release the patch leaves alone on purpose: status() says why
        log.info("tmpatch: %s %s: %s", patch.name, state, reason)
    else:
        log.debug("tmpatch: %s %s: %s", patch.name, state, reason)
    _rows[patch.name] = (state, reason)


def _loaded(module_name: str, just_loaded: types.ModuleType) -> bool:
    """Whether a module has finished executing (the one a hook fires for has)."""
    module = sys.modules.get(module_name)
    if module is None:
        return False
    return module is just_loaded or not getattr(getattr(module, "__spec__", None), "_initializing", False)


def _host_importing(just_loaded: types.ModuleType) -> bool:
    """Whether torchmetrics itself is still half-way through its import (the hook fires for one of
    the modules it imports): the hooks of that import share one look through ``sys.modules``."""
    return catalogue.HOST in sys.modules and not _loaded(catalogue.HOST, just_loaded)


def _on_import(module: types.ModuleType) -> None:
    """Post-import hook: install every pending patch whose modules are all loaded.

    A module still half-way through its own import (it imported the one the
    hook fires for) does not count: its own hook comes when it is done.
    """
    importing = _host_importing(module)
    installed: List[str] = []
    with collector_paused(), _engine.lock, _engine.batch(resume=importing):
        for name in [n for n in catalogue.NAMES if n in _pending]:
            patch = catalogue.load(name)
            if all(_loaded(module_name, module) for module_name in _modules(patch)):
                _pending.discard(name)
                installed.append(name)
                try:
                    _install(patch, sweep=True)
                except Exception as exc:  # noqa: BLE001
                    _rows[name] = (State.FAILED, f"{type(exc).__name__}: {exc}")
                    log.exception("tmpatch: %s failed", name)
        if not importing:
            cache.flush()  # torchmetrics' own hook ends its import: what it computed is written once
        _raise_if_strict(installed)


def _raise_if_strict(installed: List[str]) -> None:
    """A patch an apply() was strict about, armed then and installed now, not whole: the import
    that installed it raises :class:`TmpatchError` (what ``apply()`` would have raised had the
    modules been imported then)."""
    asked = {name: _strict.pop(name) for name in installed if name in _strict}
    problems = status().problems(list(asked)) if asked else []
    if problems:
        raise TmpatchError(f"{asked[problems[0].name]}: could not apply " + Report.describe(problems))


def _arm(patch: Patch) -> None:
    _pending.add(patch.name)
    for module_name in _modules(patch):
        if module_name not in sys.modules:
            _engine.arm(module_name, _on_import)
    if catalogue.HOST not in sys.modules:
        _engine.arm(catalogue.HOST, _on_import)  # the end of its import (see _host_importing)


def _disarm_unused() -> None:
    needed = {module_name for name in _pending for module_name in _modules(catalogue.load(name))}
    if _pending:
        needed.add(catalogue.HOST)
    if _pending or any(state in State.IN_PLACE for state, _ in _rows.values()):
        needed.add(compiled.DYNAMO)  # the patches still applied need torch.compile's pieces bound on its import
    for module_name in _engine.armed():
        if module_name not in needed:
            _engine.disarm(module_name)


# -- public API ---------------------------------------------------------------
def apply(patches: Names = None, *, exclude: Names = None, strict: Union[bool, Names] = False,
          **policies: str) -> Report:
    """Apply tmpatch's patches (all, or the ``patches`` named, less ``exclude``).

    Idempotent and thread-safe: applying twice leaves one layer. Before
    torchmetrics is imported nothing is imported: the patches arm post-import
    hooks and take effect on import. A target whose code is not recognised is
    left alone (with those declared to go with it) and its patch's row says
    why; with ``strict=True`` a patch not applied whole raises
    :class:`TmpatchError` naming the targets left alone (the other patches stay
    applied); ``strict`` may also name the patches to be strict about. ``policies``:
    one keyword per run-time policy of :data:`tmpatch.control.settings.POLICIES`
    (``nan_check="eager"``, ``bincount="eager"`` ...). Every argument is
    checked before anything changes (``TypeError``/``ValueError`` naming the
    valid ones). Returns the report.
    """
    return _checked("tmpatch", patches, exclude, strict, policies)


def apply_from(who: str, patches: Names = None, *, exclude: Names = None, strict: Union[bool, Names] = False,
               **policies: str) -> Report:
    """:func:`apply`, whose strict errors begin with ``who`` (the bootstrap's name the variable
    that asked). A patch ``strict`` is about that is armed (its modules not imported yet) is
    checked when it is installed: the import that installs it raises."""
    return _checked(who, patches, exclude, strict, policies)


def _checked(who: str, patches: Names, exclude: Names, strict: Any, policies: Dict[str, str]) -> Report:
    """:func:`apply_from` (for :func:`apply` too: the warning's stack level is the same from both)."""
    with collector_paused():  # what apply() makes and drops never reaches an old generation
        report, strict_about = _apply(patches, exclude, strict, policies)
    with _engine.lock:
        for name in strict_about:
            if name in _pending:
                _strict[name] = who
    problems = report.problems(strict_about) if strict_about else []
    if problems:
        raise TmpatchError(f"{who}: could not apply " + report.describe(problems))
    return report


def _apply(patches: Names, exclude: Names, strict: Any, policies: Dict[str, str]) -> Tuple[Report, Tuple[str, ...]]:
    """:func:`apply` but for the strict check: the report and the patches ``strict`` is about."""
    global _warned_missing
    selected, excluded, chosen_policies = selection.check_apply(patches, exclude, strict, policies)
    strict_about = selection.strict_names(strict, selected)
    current_policies.update(chosen_policies)
    with _engine.lock:
        catalogue.forget_release()  # an upgrade since the last apply() is seen
        if not catalogue.installed():
            message = "tmpatch: torchmetrics is not installed; the patches are armed in case it is imported later"
            if strict_about:
                raise TmpatchError(message)
            if not _warned_missing:
                _warned_missing = True
                warnings.warn(message, TmpatchWarning, stacklevel=4)  # the caller of apply() (through _checked)
        for name in excluded:
            if not _is_applied(name) and name not in _pending:
                _rows[name] = (State.EXCLUDED, "left out by the caller")
        with _engine.batch():
            for name in selected:
                if _is_applied(name) or name in _pending:
                    continue
                patch = catalogue.load(name)
                if gating.settled(patch, catalogue.release()) is not None or \
                        all(module_name in sys.modules for module_name in _modules(patch)):
                    _install(patch, sweep=True)
                else:
                    _arm(patch)
                    reason = "armed: applies when torchmetrics is imported"
                    if catalogue.HOST in sys.modules:  # every module it waits for: it applies when all are
                        missing = [m for m in _modules(patch) if m not in sys.modules]
                        names = missing[0] if len(missing) == 1 else f"{', '.join(missing[:-1])} and {missing[-1]}"
                        reason = f"armed: applies when {names} {'is' if len(missing) == 1 else 'are'} imported"
                    if not catalogue.installed():
                        reason = "torchmetrics is not installed; armed in case it is imported later"
                    _rows[name] = (State.PENDING, reason)
        cache.flush()
        return status(), strict_about


def revert(patches: Names = None) -> Report:
    """Undo ``apply()`` (for all patches, or those named).

    Every reference tmpatch rebound points at the original object again and
    hooks are disarmed. A layer another tool wrapped on top of tmpatch's is
    never unwrapped: tmpatch's own layer then stays as a pass-through and the
    row's reason says so. Nothing another tool installed (a mock, a wrapper) makes it
    raise or stop half-way: a patch that shares a target with a reverted one and cannot
    keep it alone is taken out too, its row failed and naming the target.
    ``apply()`` works again afterwards.
    """
    chosen = selection.names(patches, "tmpatch.revert(patches=...)")
    with collector_paused(), _engine.lock, _engine.batch():
        dropped: Dict[str, str] = {}
        for name in catalogue.NAMES:
            if chosen is not None and name not in chosen:
                continue
            _strict.pop(name, None)
            if name in _pending:
                _pending.discard(name)
                _rows[name] = (State.REVERTED, "reverted before torchmetrics was imported")
            elif _is_applied(name):
                _rows[name] = (State.REVERTED, _withdraw(catalogue.load(name), dropped))
            elif name in _rows and _rows[name][0] != State.REVERTED:
                del _rows[name]  # not-needed, mismatch, excluded ...: nothing of tmpatch is left
        _drop(dropped)
        _disarm_unused()
        return status()


def status() -> Report:
    """The report: one row per patch (name, target, state, reason, release)."""
    with _engine.lock:
        found = catalogue.release()
        release = found or "not installed"
        rows = []
        for name in catalogue.NAMES:
            patch = catalogue.load(name)
            state, reason = _rows.get(name, (State.OFF, "not applied in this process"))
            if state == State.REVERTED:
                back = [place for t in patch.targets for place in _engine.lingering(_key(t))]
                if back:
                    reason = (f"{reason}; tmpatch's inactive wrapper is in {', '.join(back)} again (put back by "
                              "another tool after revert): it calls the original")
            rows.append(PatchStatus(name, patch.target_text, state, reason, release))
        codes = _codes[1] if _codes[0][0] == found else {}
        if not found:
            return Report(rows, likeness.describe(found, codes))
        against, seen, compared, differs = likeness.differing(found, codes)
        words = likeness.worded(found, against, seen, compared, differs)
        return Report(rows, words, against if compared else None, differs)


def is_patched(obj: object) -> bool:
    """Whether ``obj`` is one of tmpatch's active wrappers (False for anything else)."""
    layer = _engine.layer_of(obj)
    return layer is not None and layer.active


def get_original(obj: object) -> object:
    """The release's own function under a tmpatch wrapper (``obj`` otherwise)."""
    layer = _engine.layer_of(obj)
    return obj if layer is None else layer.original


def exclude_again(reasons: Dict[str, str]) -> None:
    """Mark these patches excluded again, with their reasons, where nothing of them is in
    effect now (:func:`tmpatch.control.session.restore`)."""
    with _engine.lock:
        for name, reason in reasons.items():
            if name not in _pending and not _is_applied(name):
                _rows[name] = (State.EXCLUDED, reason)


def armed() -> List[str]:
    """The modules whose post-import hooks tmpatch has armed now."""
    return _engine.armed()


def disarm(module_name: str) -> None:
    """Disarm tmpatch's post-import hook of ``module_name`` (see :mod:`tmpatch.control.session`)."""
    _engine.disarm(module_name)


def patch_names() -> Sequence[str]:
    """Every patch name tmpatch knows."""
    return catalogue.NAMES
