"""How far the installed release's code is the code of a release tmpatch knows.

The catalogue's variants say which code each target has in each release tmpatch was written
for (the fingerprints of the published wheels). The gating fingerprints each target it
looks at; :func:`describe` compares those with the wheel of the same release, or, for a
release newer than every one tmpatch knows (or a source tree that still calls itself the
last one), with the newest wheel: ``1.9.0 (code differs from the 1.9.0 wheel in 1 of 95
targets: torchmetrics.functional.image.ssim._ssim_update)``. Pure functions of the catalogue
and of what was found; :mod:`tmpatch.control.api` keeps what the gating found.
"""
from __future__ import annotations

import functools
from typing import Dict, List, Mapping, Optional, Tuple

from packaging.version import InvalidVersion, Version

from tmpatch import patches as catalogue, spec
from tmpatch.spec import Target

#: what the gating found at a target: its fingerprint, or None (absent, or not a function of the release)
Codes = Mapping[str, Optional[str]]


@functools.lru_cache(maxsize=1)
def newest() -> Optional[Version]:
    """The newest release the catalogue's variants name (the last wheel tmpatch was written for)."""
    lasts = [spec.bounds(variant.releases)[1] for name in catalogue.NAMES for target in catalogue.load(name).targets
             for variant in target.variants]
    known = [last for last in lasts if last is not None]
    return max(known) if known else None


@functools.lru_cache(maxsize=1)
def _targets() -> Dict[str, List[Target]]:
    """Every target of the catalogue by path (several patches may hold one, each knowing its releases)."""
    out: Dict[str, List[Target]] = {}
    for name in catalogue.NAMES:
        for target in catalogue.load(name).targets:
            out.setdefault(target.path, []).append(target)
    return out


def expected(target: Target, release: str) -> Tuple[bool, Optional[str]]:
    """``(known, fingerprint)``: whether the catalogue says what ``release`` has at ``target``, and
    the fingerprint of that code (None: the target is absent there)."""
    if target.present is not None and not spec.contains(target.present, release):
        return True, None
    holding = [variant for variant in target.variants if spec.contains(variant.releases, release)]
    if not holding:
        return False, None
    # ranges may nest (1.0.0-1.9.0, but 1.2.1-1.4.0.post0 another): the narrowest one is the release's
    narrowest = max(holding, key=lambda variant: _narrow(spec.bounds(variant.releases)))
    return True, narrowest.fingerprint


def _narrow(bounds: Tuple[Optional[Version], Optional[Version]]) -> Tuple[Version, float]:
    """A key by which a nested range sorts after the range around it: its first release later, or its last earlier."""
    first, last = bounds
    return (first or Version("0"), -_ordinal(last))


def _ordinal(version: Optional[Version]) -> float:
    """``version`` as a number that grows with it (None: unbounded, the largest)."""
    if version is None:
        return float("inf")
    parts = (list(version.release) + [0, 0, 0])[:3]
    return parts[0] * 1e6 + parts[1] * 1e3 + parts[2] + (0.5 if version.post is not None else 0.0)


def wheel(release: Optional[str]) -> Tuple[Optional[str], bool]:
    """The release whose wheel ``release``'s code is compared with, and whether tmpatch has seen
    ``release`` (None, False for a version packaging cannot read or none at all)."""
    last = newest()
    try:
        version = Version(release) if release is not None else None
    except InvalidVersion:
        version = None
    if version is None or last is None:
        return None, False
    if version > last:
        return str(last), False
    return release, True


def differing(release: str, codes: Codes) -> Tuple[Optional[str], bool, int, List[str]]:
    """``(compared with, seen, targets compared, the paths whose code differs)`` (see :func:`wheel`)."""
    against, seen = wheel(release)
    if against is None:
        return None, False, 0, []
    targets = _targets()
    compared, differ = 0, []
    for path, code in codes.items():
        answers = [expected(target, against) for target in targets.get(path, ())]
        wants = {want for known, want in answers if known}
        if not wants:
            continue  # no patch says what that release has there
        if len(wants) > 1:
            wants.discard(None)  # a patch that needs it only on other releases (``Target.present``)
        compared += 1
        if code not in wants:
            differ.append(path)
    return against, seen, compared, differ


def describe(release: Optional[str], codes: Codes) -> str:
    """``release`` with how far its code is a known release's, for ``status()`` and the audit's
    headers: ``1.9.0`` where it is that release's code (or nothing was looked at), ``1.9.0
    (code differs from the 1.9.0 wheel in 1 of 95 targets: ...)`` naming every target that
    differs, ``1.10.0 (a release tmpatch has not seen; code as in the 1.9.0 wheel in all 95
    targets looked at)``."""
    if release is None:
        return "not installed"
    return worded(release, *differing(release, codes))


def worded(release: str, against: Optional[str], seen: bool, compared: int, differ: List[str]) -> str:
    """:func:`describe`'s words from what :func:`differing` found (for a caller that keeps that too)."""
    if against is None:
        return f"{release} (a version tmpatch cannot read)"
    if not compared:
        return release
    where = f"the {against} wheel"
    if not differ:
        return release if seen else (f"{release} (a release tmpatch has not seen; code as in {where} in all "
                                     f"{compared} targets looked at)")
    count = f"{len(differ)} of {compared} target{'s' if compared != 1 else ''}"
    head = "" if seen else "a release tmpatch has not seen; "
    return f"{release} ({head}code differs from {where} in {count}: {', '.join(differ)})"
