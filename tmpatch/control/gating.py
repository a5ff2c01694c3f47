"""Gating: which of a patch's targets a release has, whether their code is code the
patch was written for, and the one replacement that several patches holding one
target make together.

Pure functions of the catalogue's declarations (:mod:`tmpatch.spec`) and of the
functions found; :mod:`tmpatch.control.api` keeps the state and calls the engine.
"""
from __future__ import annotations

import sys
import types
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from tmpatch import spec
from tmpatch.control.report import State
from tmpatch.engine import rewrite
from tmpatch.engine.fingerprint import FingerprintError, fingerprint
from tmpatch.engine.references import PatchError
from tmpatch.spec import Patch, Requirement, Rewrite, Target, Variant

Found = List[Tuple[Target, Variant]]
#: ``original(target)``: the release's own function at a target or a requirement, underneath tmpatch
Original = Callable[[Union[Target, Requirement]], Any]


def here(patch: Patch, release: Optional[str]) -> List[Target]:
    """The patch's targets that ``release`` has (``Target.present``; all when unknown)."""
    return [t for t in patch.targets if t.present is None or release is None or spec.contains(t.present, release)]


def modules(patch: Patch, release: Optional[str]) -> List[str]:
    """The modules that must be loaded before ``patch`` is applied on ``release``: those of
    its targets there (:func:`here`) and of its settings, each once."""
    names = [t.module for t in here(patch, release)] + [s.module for s in patch.settings]
    return list(dict.fromkeys(names))


def settled(patch: Patch, release: Optional[str]) -> Optional[Tuple[str, str]]:
    """The state and reason of ``patch`` on a ``release`` that leaves no code to look at: one
    outside ``known``, or one the patch declines (``Patch.declines``); None otherwise."""
    if release is None:
        return None
    if not spec.contains(patch.known, release):
        return State.UNSUPPORTED, f"written for torchmetrics {spec.describe(patch.known)}; this is {release}"
    for decline in patch.declines:
        if spec.contains(decline.releases, release):
            return (State.UNSUPPORTED if decline.needed else State.NOT_NEEDED), decline.reason
    return None


def declined(patch: Patch, release: Optional[str]) -> bool:
    """Whether ``release`` is one ``patch`` declines (``Patch.declines``): left alone on purpose,
    so not worth a warning at every start (its row says why)."""
    return release is not None and any(spec.contains(d.releases, release) for d in patch.declines)


def _variant(target: Target, original: Original,
             codes: Optional[Dict[str, Optional[str]]] = None) -> Tuple[Optional[Variant], str]:
    """The variant of ``target`` whose code the release has, or None and why it is not recognised
    (``codes[target.path]``: the fingerprint found, None where the release has no such function;
    nothing where another tool's object hides it)."""
    try:
        obj = original(target)
    except PatchError as exc:  # its words without the path, which the row puts first
        if codes is not None:
            codes[target.path] = None
        why = str(exc)
        return None, why[len(target.path):].lstrip(": ") if why.startswith(target.path) else why
    if type(obj) is not types.FunctionType:  # a proxy passes isinstance; not this
        return None, f"a {type(obj).__name__}, not the release's own function (wrapped by another tool?)"
    try:
        code = fingerprint(obj)
    except FingerprintError as exc:
        return None, str(exc)
    if codes is not None:
        codes[target.path] = code
    variant = target.variant_for(code)
    if variant is None:
        return None, f"code not recognised, fingerprint {code}"
    return variant, ""


def named(patch: Patch, name: str) -> List[Target]:
    """The targets of ``patch`` that ``name`` (a qualname or a path, :class:`tmpatch.spec.Together`) names."""
    return [t for t in patch.targets if name in (t.qualname, t.path)]


def bonded(patch: Patch, alone: Sequence[str]) -> Dict[str, Tuple[str, str]]:
    """The targets left alone with those of ``alone`` (paths) by the patch's
    :class:`tmpatch.spec.Together` declarations, to the end of the chain: ``{path: (the path of a
    target it goes with, the declaration's reason)}``."""
    out: Dict[str, Tuple[str, str]] = {}
    gone = list(alone)
    changed = True
    while changed:
        changed = False
        for together in patch.together:
            members = [t.path for name in together.targets for t in named(patch, name)] or \
                [t.path for t in patch.targets]
            needed = [t.path for name in together.on for t in named(patch, name)] or members
            cause = next((path for path in needed if path in gone), None)
            if cause is None:
                continue
            for path in members:
                if path not in gone:
                    out[path] = (cause, together.reason)
                    gone.append(path)
                    changed = True
    return out


def left_alone(problems: Dict[str, str], bonds: Dict[str, Tuple[str, str]]) -> str:
    """The words of a row for the targets left alone: why each one is, those left with it."""
    parts = [f"{path} ({why})" for path, why in problems.items()]
    by_reason: Dict[Tuple[str, str], List[str]] = {}
    for path, (cause, reason) in bonds.items():
        by_reason.setdefault((cause, reason), []).append(path)
    for (cause, reason), paths in by_reason.items():
        parts.append(f"{', '.join(paths)} left alone with {cause} ({reason})")
    return "; ".join(parts)


def recognise(patch: Patch, release: Optional[str], original: Original,
              codes: Optional[Dict[str, Optional[str]]] = None) -> Tuple[str, str, Found]:
    """What to do with ``patch`` on ``release``: a state, its reason, and the variants
    found (empty unless the state is APPLIED, PARTIAL or NOT_NEEDED). ``original(target)``
    gives the release's function at a target or a requirement (raising :class:`PatchError`
    when it cannot be found).

    Each target is recognised on its own: where some are not (and those declared to go with
    them, ``Patch.together``) the others are repaired, and the state is PARTIAL, its reason
    naming every target left alone and why (MISMATCH where nothing is left to repair).
    ``codes``, if given, gets the fingerprint found at each target looked at (None: no
    function of the release there), for :mod:`tmpatch.control.likeness`."""
    done = settled(patch, release)
    if done is not None:
        return done[0], done[1], []
    looked = [(target, *_variant(target, original, codes)) for target in here(patch, release)]
    needs = patch.relies_on if any(variant is not None for _, variant, _ in looked) else ()
    looked, problem = relying(patch, looked, [(r, _requirement(r, original)[1]) for r in needs])
    return judge(patch, release, looked, problem)


#: what was found at one target: the target, the variant its code is (None: not recognised), and why not
Looked = Tuple[Target, Optional[Variant], str]


def relying(patch: Patch, looked: Sequence[Looked],
            needs: Sequence[Tuple[Requirement, str]]) -> Tuple[List[Looked], str]:
    """What the requirements not met (``needs``: each with why not, '' where met) leave of ``looked``:
    one that names targets (``Requirement.targets``) leaves those alone, with its why; one that names
    none leaves the whole patch alone: the problem :func:`judge` is given ('' if none)."""
    out = list(looked)
    for requirement, why in needs:
        if not why:
            continue
        if not requirement.targets:
            return out, f"{why}; every target relies on it: left alone"
        paths = {target.path for name in requirement.targets for target in named(patch, name)}
        out = [(target, None, why) if target.path in paths and variant is not None and not variant.fixed
               else (target, variant, reason) for target, variant, reason in out]
    return out, ""


def judge(patch: Patch, release: Optional[str], looked: Sequence[Looked], problem: str = "") -> Tuple[str, str, Found]:
    """:func:`recognise`'s answer from what was found at each of the patch's targets on ``release``
    (``looked``) and the first of its requirements not met (``problem``, '' if none): also for
    code read from a release's files rather than imported (``tools/new_release.py``)."""
    if problem:
        return State.MISMATCH, problem, []
    found: Found = [(target, variant) for target, variant, _ in looked if variant is not None]
    problems = {target.path: why for target, variant, why in looked if variant is None}  # not recognised
    if not found and not problems:
        return State.NOT_NEEDED, f"nothing to repair: {release} has none of its targets ({patch.upstream})", found
    if problems:
        bonds = bonded(patch, list(problems))
        found = [(target, variant) for target, variant in found if target.path not in bonds]
        words = left_alone(problems, bonds)
        if not any(not variant.fixed for _, variant in found):
            return State.MISMATCH, f"{words}; left alone", []
        count = len(problems) + len(bonds)
        return (State.PARTIAL, f"code of {common(found)} recognised but for {count} of {count + len(found)} "
                f"targets, left alone: {words}", found)
    if all(variant.fixed for _, variant in found):
        return State.NOT_NEEDED, f"upstream fix present (code of {common(found)})", found
    return State.APPLIED, f"code of {common(found)} recognised", found


def _requirement(requirement: Requirement, original: Original) -> Tuple[Optional[str], str]:
    """The fingerprint of the code ``requirement`` names (None: absent), and why it is not code
    the patch was written for ('' if it is). The code is the release's own, underneath
    tmpatch's layer where another patch wraps it (``original``)."""
    try:
        obj: Any = original(requirement)
    except PatchError:  # its module is not imported, or it is not in its owner's own namespace
        obj = sys.modules.get(requirement.module)
        for part in requirement.qualname.split(".") if obj is not None else ():
            obj = getattr(obj, part, None)
    if obj is None:
        return None, unmet(requirement, None)
    try:
        code = fingerprint(obj)
    except FingerprintError as exc:
        return None, f"relies on {requirement.path}: {exc}"
    return code, unmet(requirement, code)


def unmet(requirement: Requirement, code: Optional[str]) -> str:
    """Why ``requirement`` is not met by the code found (its fingerprint; None: absent), '' if it is."""
    if code in requirement.fingerprints:
        return ""
    if code is None:
        return f"relies on {requirement.path}, which is absent"
    return f"relies on {requirement.path}, whose code is not recognised (fingerprint {code})"


def recognised(patch: Patch, found: Found, original: Original) -> Dict[str, Optional[str]]:
    """What :func:`tmpatch.spec.told` builders are told (:data:`tmpatch.spec.Recognised`): the
    fingerprint found for each target in ``found`` and each of the patch's requirements."""
    told: Dict[str, Optional[str]] = {target.path: variant.fingerprint for target, variant in found}
    for requirement in patch.relies_on:
        told[requirement.path] = _requirement(requirement, original)[0]
    return told


def common(found: Found) -> str:
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


def _around(wrapper: Callable[..., Any], inner: Optional[Callable[..., Any]]) -> Callable[..., Any]:
    """``wrapper`` (a replacement) run around ``inner`` (a replacement, or the original itself)."""
    if inner is None:
        return wrapper

    def joined(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        def within(*a: Any, **k: Any) -> Any:
            return inner(original, *a, **k)

        return wrapper(within, *args, **kwargs)

    return joined


def build(variant: Variant, module: Any, told: spec.Recognised) -> Optional[Callable[..., Any]]:
    """A wrapping variant's piece of a joined replacement, built once (None for an edit:
    edits are joined from the original each time, :func:`joined`). A builder marked
    :func:`tmpatch.spec.told` is given ``told`` (:func:`recognised`) too."""
    if isinstance(variant.build, Rewrite) or variant.build is None:
        return None
    if getattr(variant.build, spec.TOLD, False):
        return variant.build(module, told)  # type: ignore[call-arg]  # a told builder
    return variant.build(module)


def joined(original: Callable[..., Any], module: Any,
           parts: Sequence[Tuple[Variant, Optional[Callable[..., Any]]]]) -> Callable[..., Any]:
    """One replacement for every variant that holds one target (in catalogue order), each
    with its piece (:func:`build`; built when its patch was applied, so a change of holders
    calls no builder of the others): the edits applied together to ``original``, then the
    wrappers around it, the first outermost."""
    edits = [v.build for v, _ in parts if isinstance(v.build, Rewrite)]
    inner = rewrite.replacement(original, module, edits) if edits else None
    for variant, piece in reversed([part for part in parts if not isinstance(part[0].build, Rewrite)]):
        assert piece is not None, variant
        inner = _around(piece, inner)
    assert inner is not None
    return inner
