"""The declarative vocabulary a patch module is written in.

A patch module describes *what* it repairs (targets, the upstream code it
recognises, the replacement for each implementation, the audit labels of the
syncs it removes); the engine decides *how* to put it in place. Nothing here
imports torch, torchmetrics or wrapt. Release ranges are :class:`Releases` (:func:`span`,
:func:`since`), read as packaging's specifiers would read ``>=first,<=last``, shown as
``1.0.0-1.2.0`` (:func:`describe`).
"""
from __future__ import annotations

import re
from dataclasses import FrozenInstanceError, dataclass, field
from types import ModuleType
from typing import Any, Callable, Dict, Mapping, Optional, Tuple, Union

from packaging.version import InvalidVersion, Version

#: ``build(module) -> replacement``: called once, when the target's module is
#: loaded, with that module. The replacement is called as
#: ``replacement(original, *args, **kwargs)`` (``self`` first for methods),
#: where ``original`` is the release's own function, for fall-backs.
Builder = Callable[[ModuleType], Callable[..., Any]]

#: what a :func:`told` builder is given besides the module: the fingerprint the gating found
#: for each of the patch's targets and requirements (:class:`Requirement`), by ``path``
#: (None: a requirement that may be absent, and is)
Recognised = Mapping[str, Optional[str]]

#: the attribute that marks a builder told what the gating recognised (:func:`told`)
TOLD = "_tmpatch_told"


def told(build: Callable[[ModuleType, Recognised], Callable[..., Any]]) -> Builder:
    """Mark a builder that is called as ``build(module, recognised)`` (:data:`Recognised`):
    for a replacement that depends on which code the gating recognised beyond its own
    target (another target's implementation, or code the patch relies on). A patch never
    fingerprints code itself: it maps the fingerprints it declared to what they mean."""
    setattr(build, TOLD, True)
    return build  # type: ignore[return-value]  # called with the recognised too


#: the attribute the engine reads a replacement's gate from (``tmpatch.engine.layers.GATE``)
GATE = "_tmpatch_gate"

#: set to True on a function given to ``Module._apply`` that moves or casts each tensor
#: and leaves its values as they were (the audit's move onto simulated CUDA): patches may
#: carry what they know of a state's values across it, as across ``.to()``
VALUE_MOVE = "_tmpatch_value_move"


#: the attribute of a replacement that holds its inline form (:func:`inline`; read by ``tmpatch.engine.layers``)
INLINE = "_tmpatch_inline"


#: the keyword-only parameter of an inline form that the engine binds to the layer's :class:`Route`
ROUTE = "_tmpatch_route"


class Route:
    """What an inline form is given as its keyword-only ``_tmpatch_route``: ``original``, the
    target's own function, and ``on``, False while the patch is not applied (a reference
    left behind then calls ``original`` alone). Made and switched by the engine."""

    __slots__ = ("original", "on")

    def __init__(self, original: Callable[..., Any], on: bool = False) -> None:
        self.original = original
        self.on = on


def inline(form: Callable[..., Any]) -> Callable[..., Any]:
    """A replacement installed as ``form`` itself, with no wrapper's frame around it (for
    targets on every ``update()``'s path). ``form`` takes the target's arguments and a
    keyword-only ``_tmpatch_route`` (``.original``: the release's function; ``.on``: False
    once the patch is reverted, when ``form`` must call ``.original`` alone). Returns the
    usual ``replacement(original, *args, **kwargs)``, marked with ``form``."""

    def replacement(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return form(*args, _tmpatch_route=Route(original, True), **kwargs)

    setattr(replacement, INLINE, form)
    return replacement


def gated(slot: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Mark a replacement as having nothing to do while ``slot.get()`` answers None (a
    :class:`tmpatch.runtime.compiled.ContextSlot` that a marked update sets): there the release's
    function is called directly, without the replacement's own call."""

    def mark(replacement: Callable[..., Any]) -> Callable[..., Any]:
        setattr(replacement, GATE, slot)
        return replacement

    return mark


class Releases:
    """The host releases ``first`` to ``last`` inclusive (``last`` None: every later one), as
    packaging's specifiers read ``>=first,<=last`` (``==first`` for one release): prereleases
    in, a local label (``+cu118``) ignored. The catalogue makes hundreds when it is imported:
    the texts are read as versions when first compared."""

    __slots__ = ("first", "last", "_bounds")

    def __init__(self, first: str, last: Optional[str] = None) -> None:
        self.first = first
        self.last = last
        self._bounds: Optional[Tuple[Version, Optional[Version]]] = None

    def bounds(self) -> Tuple[Version, Optional[Version]]:
        """``(first, last)`` as versions (``last`` None: open)."""
        if self._bounds is None:
            self._bounds = (_version(self.first), None if self.last is None else _version(self.last))
        return self._bounds

    def contains(self, release: Union[str, Version], prereleases: bool = True) -> bool:
        """Whether ``release`` (a text or a version) is in the range, as packaging's
        ``SpecifierSet.contains`` answers (``prereleases=False``: none of them)."""
        version = release if isinstance(release, Version) else _version(release)
        if version.is_prerelease and not prereleases:
            return False
        public = _version(version.public) if version.local else version
        first, last = self.bounds()
        return first <= public and (last is None or public <= last)

    def __contains__(self, release: Union[str, Version]) -> bool:
        return self.contains(release)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Releases) and (self.first, self.last) == (other.first, other.last)

    def __hash__(self) -> int:
        return hash((Releases, self.first, self.last))

    def __str__(self) -> str:
        if self.last == self.first:
            return f"=={self.first}"
        return f">={self.first}" if self.last is None else f">={self.first},<={self.last}"

    def __repr__(self) -> str:
        return f"Releases({self.first!r}, {self.last!r})"


def span(first: str, last: Optional[str] = None) -> Releases:
    """The releases ``first`` to ``last`` inclusive (``first`` alone without ``last``)."""
    return Releases(first, first if last is None else last)


def since(first: str) -> Releases:
    """``first`` and every later release."""
    return Releases(first)


_versions: Dict[str, Version] = {}  # a release's text -> its Version (parsed once)
_contained: Dict[Tuple[Releases, str], bool] = {}  # (range, release) -> in it


def _version(text: str) -> Version:
    version = _versions.get(text)
    if version is None:
        version = _versions[text] = Version(text)
    return version


def bounds(releases: Releases) -> Tuple[Optional[Version], Optional[Version]]:
    """``(first, last)`` of a range made by :func:`span` or :func:`since` (None: unbounded)."""
    return releases.bounds()


def describe(releases: Releases) -> str:
    """``1.0.0-1.2.0``, ``1.6.0`` or ``1.0.0+``: a range as ``status()`` shows it."""
    first, last = bounds(releases)
    if last is None:
        return f"{first}+"
    return str(first) if first == last else f"{first}-{last}"


def contains(releases: Releases, release: str) -> bool:
    """Whether ``release`` is in the range (False for a version packaging cannot read);
    remembered per range and release (gating asks it for every patch on every import)."""
    known = _contained.get((releases, release))
    if known is not None:
        return known
    try:
        inside = releases.contains(release)
    except InvalidVersion:
        inside = False
    _contained[(releases, release)] = inside
    return inside


class _Value:
    """A value of the vocabulary, as a frozen dataclass is one (its fields set once, then compared,
    hashed, shown and pickled by them), without being made as one: making a dataclass compiles
    six functions, and the catalogue's classes are made in every process that applies tmpatch.
    Each subclass annotates its ``__slots__`` for type checkers (annotations alone: no class attributes)."""

    __slots__: Tuple[str, ...] = ()

    def _set(self, *values: Any) -> None:
        """Set the fields, in the order of ``__slots__`` (``__init__`` does, once)."""
        for name, value in zip(self.__slots__, values):
            object.__setattr__(self, name, value)

    def _fields(self) -> Tuple[Any, ...]:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self._fields())

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"{self.__class__.__qualname__}({shown})"

    def __reduce__(self) -> Tuple[Any, Tuple[Any, ...]]:
        return self.__class__, self._fields()

    def __setattr__(self, name: str, value: Any) -> None:
        raise FrozenInstanceError(f"cannot assign to field {name!r}")

    def __delattr__(self, name: str) -> None:
        raise FrozenInstanceError(f"cannot delete field {name!r}")


class Edit(_Value):
    """In the release's function, the statements ``find`` (source text) are replaced by
    ``replace`` (source text, may be empty): see :mod:`tmpatch.engine.rewrite`."""

    __slots__ = ("find", "replace")
    find: str
    replace: str

    def __init__(self, find: str, replace: str = "") -> None:
        self._set(find, replace)


class Rewrite(_Value):
    """A replacement made by editing the release's own function instead of wrapping it.

    ``names(module)`` gives the objects the replacement statements use (called once,
    when the target's module is loaded); their names must start with ``_tmpatch_``.
    Several patches may edit one target: their edits are applied together."""

    __slots__ = ("edits", "names")
    edits: Tuple[Edit, ...]
    names: Optional[Callable[[ModuleType], Dict[str, Any]]]

    def __init__(self, edits: Tuple[Edit, ...],
                 names: Optional[Callable[[ModuleType], Dict[str, Any]]] = None) -> None:
        self._set(edits, names)


class Variant(_Value):
    """One upstream implementation of a target, recognised by its fingerprint.

    ``build`` is a :data:`Builder` (a wrapper; :func:`told` what else the gating
    recognised, if marked so), a :class:`Rewrite` (edits of the release's
    function), or ``None`` when this implementation already carries the
    upstream fix: the patch is then *not-needed* on that release.
    """

    __slots__ = ("releases", "fingerprint", "build")
    releases: Releases
    fingerprint: str
    build: Union[Builder, Rewrite, None]

    def __init__(self, releases: Releases, fingerprint: str, build: Union[Builder, Rewrite, None] = None) -> None:
        self._set(releases, fingerprint, build)

    @property
    def fixed(self) -> bool:
        return self.build is None


class Target(_Value):
    """A function or method to replace: ``module`` and a dotted ``qualname``.
    ``present``: the releases that have it (None: every release the patch knows);
    on other releases the target is skipped, and must be absent unless ``shared`` (a
    helper other code uses too, such as ``to_onehot``, that the patch needs only there)."""

    __slots__ = ("module", "qualname", "variants", "present", "shared")
    module: str
    qualname: str
    variants: Tuple[Variant, ...]
    present: Optional[Releases]
    shared: bool

    def __init__(self, module: str, qualname: str, variants: Tuple[Variant, ...],
                 present: Optional[Releases] = None, shared: bool = False) -> None:
        self._set(module, qualname, variants, present, shared)

    @property
    def path(self) -> str:
        return f"{self.module}.{self.qualname}"

    def variant_for(self, fingerprint: str) -> Optional[Variant]:
        for variant in self.variants:
            if variant.fingerprint == fingerprint:
                return variant
        return None


class Decline(_Value):
    """Releases inside a patch's ``known`` range that it leaves alone on purpose, and why
    (``reason``: the words of its ``status()`` row). ``needed``: the defect is there (the row
    is *unsupported*, a problem); False: these releases do not have it (*not-needed*)."""

    __slots__ = ("releases", "reason", "needed")
    releases: Releases
    reason: str
    needed: bool

    def __init__(self, releases: Releases, reason: str, needed: bool = True) -> None:
        self._set(releases, reason, needed)


class Together(_Value):
    """Targets of a patch that are repaired only together. Without one, each target a release
    has is repaired on its own: one whose code is not recognised is left alone and the others
    are repaired (the row says *partial*). ``targets`` (qualnames or paths; empty: every target
    of the patch) are left alone wherever one of ``on`` is; with ``on`` empty, wherever one of
    ``targets`` is (a group). ``reason``: why, in the words of the row that names them."""

    __slots__ = ("reason", "targets", "on")
    reason: str
    targets: Tuple[str, ...]
    on: Tuple[str, ...]

    def __init__(self, reason: str, targets: Tuple[str, ...] = (), on: Tuple[str, ...] = ()) -> None:
        self._set(reason, targets, on)


class Requirement(_Value):
    """Code outside the patch's targets that a repair relies on (torch's own, say, or another
    function of the release): the function ``module.qualname`` must have one of
    ``fingerprints``, else the targets that rely on it are left alone as not recognised:
    ``targets`` (qualnames or paths; the others are repaired, and the row says *partial*), or,
    with ``targets`` empty, every target (the row says so). ``None`` among the fingerprints:
    the function may be absent. Its code is looked at underneath tmpatch's own layer, should
    another patch wrap it; which fingerprint was found is what a :func:`told` builder is told."""

    __slots__ = ("module", "qualname", "fingerprints", "targets")
    module: str
    qualname: str
    fingerprints: Tuple[Optional[str], ...]
    targets: Tuple[str, ...]

    def __init__(self, module: str, qualname: str, fingerprints: Tuple[Optional[str], ...],
                 targets: Tuple[str, ...] = ()) -> None:
        self._set(module, qualname, fingerprints, targets)

    @property
    def path(self) -> str:
        return f"{self.module}.{self.qualname}"


class _Leave:
    """The type of :data:`LEAVE`."""

    def __repr__(self) -> str:
        return "LEAVE"


#: what a :class:`Setting`'s ``value`` returns to leave its attribute as it is on this release
LEAVE: Any = _Leave()


class Setting(_Value):
    """An attribute a patch sets while it is applied, a value rather than a function wrapped:
    ``module.qualname`` (in the module's or a class's own namespace) becomes ``value(module)``,
    called when the patch is applied, once the module is loaded (:data:`LEAVE`: left as it
    is). The engine sets it after the targets are in place and, on revert, after
    ``after_revert``, puts back exactly what was there (an absent attribute is deleted
    again), unless somebody else has set it since: theirs is left, and the row says so."""

    __slots__ = ("module", "qualname", "value")
    module: str
    qualname: str
    value: Callable[[ModuleType], Any]

    def __init__(self, module: str, qualname: str, value: Callable[[ModuleType], Any]) -> None:
        self._set(module, qualname, value)

    @property
    def path(self) -> str:
        return f"{self.module}.{self.qualname}"


#: label categories: why a sync point is there
INHERENT = "inherent"  #: no implementation of the call can avoid it
VALIDATION = "validation"  #: input validation the user asked for (validate_args=True)
PATCHED = "patch"  #: a tmpatch patch removes it; seen patched, that patch is not in effect
UPSTREAM = "upstream"  #: a defect of the release, fixed in a later one (a patch may remove it too)
DEFERRED = "deferred"  #: work a patch moved out of ``update`` into ``compute``


class Label(_Value):
    """Why a sync point is there, for the audit. A point matches when every given pattern
    does: ``function``, ``op`` and ``kind`` (its text) are full-match regexes, ``file`` a
    path suffix. ``patch``: the tmpatch patch that removes it (filled in by :class:`Patch`
    for the labels it carries)."""

    __slots__ = ("category", "reason", "function", "file", "op", "kind", "patch")
    category: str
    reason: str
    function: str
    file: str
    op: str
    kind: str
    patch: str

    def __init__(self, category: str, reason: str, function: str = ".*", file: str = "", op: str = ".*",
                 kind: str = ".*", patch: str = "") -> None:
        self._set(category, reason, function, file, op, kind, patch)

    def matches(self, point: Any) -> bool:
        """Whether ``point`` (a :class:`tmpatch.audit.SyncPoint`) is explained by this label."""
        path = point.location.rsplit(":", 1)[0].replace("\\", "/")
        return (re.fullmatch(self.function, point.function) is not None
                and re.fullmatch(self.op, point.op) is not None
                and re.fullmatch(self.kind, point.kind.value) is not None
                and path.endswith(self.file))


@dataclass(frozen=True)
class Patch:
    """A named repair of one or more targets, each replaced where its code is recognised.

    ``known`` is the range of host releases the patch was written against;
    outside it the patch reports *unsupported*. Inside it the code's
    fingerprint decides. ``summary``: the defect, one line; ``upstream``: the
    upstream issue or fix; ``changes``: what a user sees change besides fewer
    syncs (reports moved, deliberate corrections), one line or empty.
    ``declines``: releases inside ``known`` that it leaves alone, with the reason.
    ``labels``: how the audit explains the syncs this patch removes (and the
    ones it leaves). ``requires``: patches this one needs to do its whole job
    (applied with it unless excluded). ``together``: targets repaired only together
    (:class:`Together`); the others are repaired each on its own.
    """

    name: str
    summary: str
    known: Releases
    targets: Tuple[Target, ...]
    upstream: str = ""
    changes: str = ""
    labels: Tuple[Label, ...] = field(default=())
    requires: Tuple[str, ...] = field(default=())
    #: code outside the release the repair relies on, recognised by fingerprint like the targets
    relies_on: Tuple[Requirement, ...] = field(default=())
    #: releases inside ``known`` left alone on purpose (checked before any code is looked at)
    declines: Tuple[Decline, ...] = field(default=())
    #: attributes set while the patch is applied (:class:`Setting`)
    settings: Tuple[Setting, ...] = field(default=())
    #: targets repaired only together (:class:`Together`); the others each on its own
    together: Tuple[Together, ...] = field(default=())
    #: called after the patch is applied / reverted (host-side bookkeeping: nothing of the
    #: release changes here; ``after_revert`` runs before the settings are taken back)
    after_apply: Optional[Callable[[], None]] = None
    after_revert: Optional[Callable[[], None]] = None

    def __post_init__(self) -> None:
        named = tuple(
            label if label.patch or label.category in (INHERENT, VALIDATION) else
            Label(label.category, label.reason, label.function, label.file, label.op, label.kind, self.name)
            for label in self.labels
        )
        object.__setattr__(self, "labels", named)

    @property
    def target_text(self) -> str:
        """The targets as one string: ``module.name`` or ``module.{a,b}``."""
        modules = {t.module for t in self.targets}
        if len(self.targets) > 1 and len(modules) == 1:
            return f"{self.targets[0].module}.{{{','.join(t.qualname for t in self.targets)}}}"
        return ", ".join(t.path for t in self.targets)
