"""The public API: ``apply()``, ``revert()``, ``status()``.

This layer joins the catalogue (:mod:`tmpatch.patches`, which knows
torchmetrics) to the engine (:mod:`tmpatch.engine`, which knows wrapt): it
gates each patch on the release and on the fingerprint of the code it finds,
and keeps the row ``status()`` shows for it.
"""
from __future__ import annotations

import logging
import sys
import types
import warnings
from typing import Dict, Iterable, List, Sequence, Set, Tuple, Union

from tmpatch import patches as catalogue
from tmpatch import selection, settings
from tmpatch.engine import Engine, PatchError
from tmpatch.fingerprint import FingerprintError, fingerprint
from tmpatch import spec
from tmpatch.spec import Patch, Target, Variant
from tmpatch.report import PatchStatus, Report, State

log = logging.getLogger("tmpatch")

Names = Union[None, str, Iterable[str]]


class TmpatchError(RuntimeError):
    """``apply(strict=True)`` could not apply every requested patch."""


class TmpatchWarning(UserWarning):
    """Something tmpatch could not do; the program runs on unpatched."""


_engine = Engine()
_rows: Dict[str, Tuple[str, str]] = {}  # name -> (state, reason)
_pending: Set[str] = set()
_warned_missing = False


def _scope(target: Target) -> str:
    return target.module.split(".")[0]


def _key(target: Target) -> Tuple[str, str]:
    return (target.module, target.qualname)


def _is_applied(name: str) -> bool:
    return _rows.get(name, (State.OFF, ""))[0] == State.APPLIED


# -- gating and installing -----------------------------------------------------
def _recognise(patch: Patch) -> Tuple[str, str, List[Tuple[Target, Variant]]]:
    """Decide what to do with ``patch`` on the loaded release: a state, its reason,
    and the variants found (empty unless the state is APPLIED or NOT_NEEDED)."""
    release = catalogue.release()
    if release is not None and not spec.contains(patch.known, release):
        return State.UNSUPPORTED, f"written for torchmetrics {spec.describe(patch.known)}; this is {release}", []
    found: List[Tuple[Target, Variant]] = []
    for target in patch.targets:
        try:
            obj = _engine.original(_key(target))
        except PatchError as exc:
            return State.MISMATCH, str(exc), []
        if type(obj) is not types.FunctionType:  # a proxy passes isinstance; not this
            return (
                State.MISMATCH,
                f"{target.path} is a {type(obj).__name__}, not the release's own function "
                "(wrapped by another tool?)",
                [],
            )
        try:
            code = fingerprint(obj)
        except FingerprintError as exc:
            return State.MISMATCH, str(exc), []
        variant = target.variant_for(code)
        if variant is None:
            return State.MISMATCH, f"code of {target.qualname} not recognised (fingerprint {code}); left alone", []
        found.append((target, variant))
    if all(variant.fixed for _, variant in found):
        return State.NOT_NEEDED, f"upstream fix present (code of {_common(found)})", found
    return State.APPLIED, f"code of {_common(found)} recognised", found


def _common(found: List[Tuple[Target, Variant]]) -> str:
    """The releases whose code every target shares with this one: the overlap of the
    variants' ranges (``1.4.0-1.5.2``), or, should they not overlap, the ranges listed."""
    ranges = {variant.releases for _, variant in found}
    bounds = [spec.bounds(r) for r in ranges]
    firsts = [b[0] for b in bounds if b[0] is not None]
    lasts = [b[1] for b in bounds if b[1] is not None]
    low = max(firsts) if firsts else None
    high = min(lasts) if lasts else None
    if low is None or (high is not None and low > high):
        return ", ".join(sorted(spec.describe(r) for r in ranges))
    if high is None:
        return f"{low}+"
    return str(low) if low == high else f"{low}-{high}"


def _install(patch: Patch, sweep: bool) -> None:
    state, reason, found = _recognise(patch)
    if state == State.APPLIED:
        done: List[Target] = []
        try:
            for target, variant in found:
                if variant.fixed:
                    continue
                assert variant.build is not None
                replacement = variant.build(sys.modules[target.module])
                _engine.install(
                    _key(target), replacement, method="." in target.qualname, scope=_scope(target), sweep=sweep
                )
                done.append(target)
        except Exception as exc:  # noqa: BLE001 - a patch must never break the program
            for target in done:
                _engine.remove(_key(target), scope=_scope(target))
            state, reason = State.FAILED, f"{type(exc).__name__}: {exc}; original left in place"
    if state == State.APPLIED:
        log.info("tmpatch: %s applied (%s)", patch.name, reason)
    elif state in State.PROBLEMS:
        log.warning("tmpatch: %s %s: %s", patch.name, state, reason)
    else:
        log.debug("tmpatch: %s %s: %s", patch.name, state, reason)
    _rows[patch.name] = (state, reason)


def _loaded(module_name: str, just_loaded: types.ModuleType) -> bool:
    """Whether a module has finished executing (the one a hook fires for has)."""
    module = sys.modules.get(module_name)
    if module is None:
        return False
    return module is just_loaded or not getattr(getattr(module, "__spec__", None), "_initializing", False)


def _on_import(module: types.ModuleType) -> None:
    """Post-import hook: install every pending patch whose modules are all loaded.

    A module still half-way through its own import (it imported the one the
    hook fires for) does not count: its own hook comes when it is done.
    """
    with _engine.lock, _engine.batch():
        for name in [n for n in catalogue.NAMES if n in _pending]:
            patch = catalogue.load(name)
            if all(_loaded(target.module, module) for target in patch.targets):
                _pending.discard(name)
                try:
                    _install(patch, sweep=True)
                except Exception as exc:  # noqa: BLE001
                    _rows[name] = (State.FAILED, f"{type(exc).__name__}: {exc}")
                    log.exception("tmpatch: %s failed", name)


def _arm(patch: Patch) -> None:
    _pending.add(patch.name)
    for target in patch.targets:
        if target.module not in sys.modules:
            _engine.arm(target.module, _on_import)


def _disarm_unused() -> None:
    needed = {t.module for name in _pending for t in catalogue.load(name).targets}
    for module_name in _engine.armed():
        if module_name not in needed:
            _engine.disarm(module_name)


# -- public API ---------------------------------------------------------------
def apply(patches: Names = None, *, exclude: Names = None, strict: bool = False, **policies: str) -> Report:
    """Apply tmpatch's patches (all, or the ``patches`` named, less ``exclude``).

    Idempotent and thread-safe: applying twice leaves one layer. Before
    torchmetrics is imported nothing is imported: the patches arm post-import
    hooks and take effect on import. A patch whose target is not recognised is
    left alone and its row says why; with ``strict=True`` that raises
    :class:`TmpatchError` (the other patches stay applied). ``policies``:
    one keyword per run-time policy of :data:`tmpatch.settings.POLICIES`
    (``nan_check="eager"``, ``bincount="eager"`` ...). Every argument is
    checked before anything changes (``TypeError``/``ValueError`` naming the
    valid ones). Returns the report.
    """
    global _warned_missing
    selected, excluded, chosen_policies = selection.check_apply(patches, exclude, strict, policies)
    settings.policy.update(chosen_policies)
    with _engine.lock:
        if not catalogue.installed():
            message = "tmpatch: torchmetrics is not installed; the patches are armed in case it is imported later"
            if strict:
                raise TmpatchError(message)
            if not _warned_missing:
                _warned_missing = True
                warnings.warn(message, TmpatchWarning, stacklevel=2)
        for name in excluded:
            if not _is_applied(name) and name not in _pending:
                _rows[name] = (State.EXCLUDED, "left out by the caller")
        with _engine.batch():
            for name in selected:
                if _is_applied(name) or name in _pending:
                    continue
                patch = catalogue.load(name)
                if all(target.module in sys.modules for target in patch.targets):
                    _install(patch, sweep=True)
                else:
                    _arm(patch)
                    reason = "armed: applies when torchmetrics is imported"
                    if not catalogue.installed():
                        reason = "torchmetrics is not installed; armed in case it is imported later"
                    _rows[name] = (State.PENDING, reason)
        report = status()
    if strict:
        problems = [row for row in report if row.name in selected and row.state in State.PROBLEMS]
        if problems:
            raise TmpatchError(
                "tmpatch: could not apply " + "; ".join(f"{r.name} ({r.state}: {r.reason})" for r in problems)
            )
    return report


def revert(patches: Names = None) -> Report:
    """Undo ``apply()`` (for all patches, or those named).

    Every reference tmpatch rebound points at the original object again and
    hooks are disarmed. A layer another tool wrapped on top of tmpatch's is
    never unwrapped: tmpatch's own layer then stays as a pass-through and the
    row's reason says so. ``apply()`` works again afterwards.
    """
    chosen = selection.names(patches, "tmpatch.revert(patches=...)")
    with _engine.lock, _engine.batch():
        for name in catalogue.NAMES:
            if chosen is not None and name not in chosen:
                continue
            if name in _pending:
                _pending.discard(name)
                _rows[name] = (State.REVERTED, "reverted before torchmetrics was imported")
            elif _is_applied(name):
                patch = catalogue.load(name)
                residue = [_engine.remove(_key(t), scope=_scope(t)) for t in patch.targets]
                note = "; ".join(r for r in residue if r)
                _rows[name] = (State.REVERTED, note or "originals restored")
            elif name in _rows and _rows[name][0] != State.REVERTED:
                del _rows[name]  # not-needed, mismatch, excluded ...: nothing of tmpatch is left
        _disarm_unused()
        return status()


def status() -> Report:
    """The report: one row per patch (name, target, state, reason, release)."""
    with _engine.lock:
        release = catalogue.release() or "not installed"
        rows = []
        for name in catalogue.NAMES:
            patch = catalogue.load(name)
            state, reason = _rows.get(name, (State.OFF, "not applied in this process"))
            rows.append(PatchStatus(name, patch.target_text, state, reason, release))
        return Report(rows)


def is_patched(obj: object) -> bool:
    """Whether ``obj`` is one of tmpatch's active wrappers."""
    key = getattr(obj, "_self_tmpatch_key", None)
    layer = _engine.layer(key) if isinstance(key, tuple) else None
    return bool(layer is not None and layer.wrapper is obj and layer.active)


def get_original(obj: object) -> object:
    """The release's own function under a tmpatch wrapper (``obj`` otherwise)."""
    key = getattr(obj, "_self_tmpatch_key", None)
    layer = _engine.layer(key) if isinstance(key, tuple) else None
    if layer is not None and layer.wrapper is obj:
        return layer.original
    return obj


def patch_names() -> Sequence[str]:
    """Every patch name tmpatch knows."""
    return catalogue.NAMES
