"""The declarative vocabulary a patch module is written in.

A patch module describes *what* it repairs (targets, the upstream code it
recognises, the replacement for each implementation); the engine decides
*how* to put it in place. Nothing here imports torch, torchmetrics or wrapt.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable, Optional, Tuple

#: ``build(module) -> replacement``: called once, when the target's module is
#: loaded, with that module. The replacement is called as
#: ``replacement(original, *args, **kwargs)`` (``self`` first for methods),
#: where ``original`` is the release's own function, for fall-backs.
Builder = Callable[[ModuleType], Callable[..., Any]]


@dataclass(frozen=True)
class Variant:
    """One upstream implementation of a target, recognised by its fingerprint.

    ``build`` is ``None`` when this implementation already carries the
    upstream fix: the patch is then *not-needed* on that release.
    """

    releases: str
    fingerprint: str
    build: Optional[Builder] = None

    @property
    def fixed(self) -> bool:
        return self.build is None


@dataclass(frozen=True)
class Target:
    """A function or method to replace: ``module`` and a dotted ``qualname``."""

    module: str
    qualname: str
    variants: Tuple[Variant, ...]

    @property
    def path(self) -> str:
        return f"{self.module}.{self.qualname}"

    def variant_for(self, fingerprint: str) -> Optional[Variant]:
        for variant in self.variants:
            if variant.fingerprint == fingerprint:
                return variant
        return None


@dataclass(frozen=True)
class Patch:
    """A named repair: one or more targets, all replaced or none.

    ``known`` is the range of host releases the patch was written against
    (a packaging specifier); outside it the patch reports *unsupported*.
    Inside it, and on later releases, the code's fingerprint decides.
    """

    name: str
    summary: str
    known: str
    targets: Tuple[Target, ...]
    upstream: str = ""
    options: Tuple[str, ...] = field(default=())

    @property
    def target_text(self) -> str:
        """The targets as one string: ``module.name`` or ``module.{a,b}``."""
        modules = {t.module for t in self.targets}
        if len(self.targets) > 1 and len(modules) == 1:
            return f"{self.targets[0].module}.{{{','.join(t.qualname for t in self.targets)}}}"
        return ", ".join(t.path for t in self.targets)
