"""Checking what a caller asks for, in one place for every entry point.

Patch names come as Python values (``apply()``, ``revert()``, the pytest
marker) or as comma-separated text (environment, CLI and pytest options); both
are checked here, with one message format that names the argument, the
unknown names (with the closest valid one) and the valid names. ``apply()``'s
arguments are all checked before anything changes (:func:`check_apply`).
"""
from __future__ import annotations

import logging
from types import ModuleType
from typing import Any, Dict, List, Optional, Sequence, Tuple, cast

from tmpatch.control import env, settings

log = logging.getLogger("tmpatch")


def _catalogue() -> ModuleType:
    """:mod:`tmpatch.patches`, imported on the first name checked: ``tmpatch run`` and
    ``tmpatch --help`` import this module, and the catalogue's import (the vocabulary,
    packaging) would add about 20 ms to their start."""
    from tmpatch import patches

    return patches


def valid_names() -> Tuple[str, ...]:
    """Every patch name (the catalogue's order)."""
    return tuple(_catalogue().NAMES)


def split(text: str) -> Tuple[str, ...]:
    """``"a, b c"`` -> ``("a", "b", "c")``."""
    return tuple(part for part in text.replace(",", " ").split() if part)


def _shown(value: object) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"


def names(value: Any, argument: str, valid: Optional[Sequence[str]] = None) -> Optional[Tuple[str, ...]]:
    """``value`` as a tuple of known patch names (``None`` stays ``None``: all).

    ``value``: a name, comma-separated names (``"a,b"``) or an iterable of
    names. ``TypeError`` for anything else (bytes, numbers, non-str items),
    ``ValueError`` for unknown names or a string naming none; each message
    starts with ``argument`` and names the valid form or names.
    """
    if value is None:
        return None
    valid = tuple(valid) if valid is not None else valid_names()
    if isinstance(value, str):
        items = split(value)
        if not items:
            raise ValueError(f"{argument}: {value!r} names no patch; give patch names, [] for none, "
                             f"or None for all; valid names: {', '.join(valid)}")
    elif isinstance(value, (bytes, bytearray, memoryview)):
        raise TypeError(f"{argument} must be a patch name (str), a list of names or None; got {_shown(value)}"
                        " (bytes: decode it first)")
    else:
        try:
            items = tuple(value)
        except TypeError:
            raise TypeError(f"{argument} must be a patch name (str), a list of names or None; "
                            f"got {_shown(value)}") from None
        wrong = [item for item in items if not isinstance(item, str)]
        if wrong:
            raise TypeError(f"{argument} must hold patch names (str); got {_shown(wrong[0])}")
    unknown = [name for name in dict.fromkeys(items) if name not in valid]
    if unknown:
        raise ValueError(f"{argument}: {settings.unknown_names(unknown, valid)}; valid names: {', '.join(valid)}")
    return tuple(dict.fromkeys(items))


def select(patches: Any, exclude: Any, where: str = "tmpatch.apply",
           valid: Optional[Sequence[str]] = None) -> Tuple[List[str], List[str]]:
    """``(selected, left out)``, both in the catalogue's order: ``patches``
    (all when ``None``) less ``exclude``, with the patches they require
    (``Patch.requires``, and what those require) unless those are excluded. Both are checked first."""
    valid = tuple(valid) if valid is not None else valid_names()
    chosen = names(patches, f"{where}(patches=...)", valid)
    left_out = names(exclude, f"{where}(exclude=...)", valid) or ()
    picked = {name for name in valid if (chosen is None or name in chosen) and name not in left_out}
    needed: set = set()
    todo = list(picked)
    while todo:
        for need in _requires(todo.pop()):
            if need not in needed and need not in picked and need not in left_out:
                needed.add(need)
                todo.append(need)
    selected = [name for name in valid if name in picked or (name in needed and name not in left_out)]
    return selected, [name for name in valid if name not in selected]


def _requires(name: str) -> Tuple[str, ...]:
    try:
        return tuple(_catalogue().load(name).requires)
    except ValueError:  # a name the caller's own list declared valid, not in the catalogue
        return ()


def check_policies(policies: Dict[str, Any], where: str = "tmpatch.apply") -> Dict[str, str]:
    """The policy keywords that are set (``None``: leave as is), checked;
    ``TypeError`` for an unknown keyword or a non-string, ``ValueError`` for
    an unknown value."""
    checked: Dict[str, str] = {}
    for name, value in policies.items():
        setting = settings.POLICIES.get(name)
        if setting is None:
            close = settings.closest(name, settings.POLICIES, cutoff=0.6)
            hint = f" (did you mean {close}?)" if close else ""
            raise TypeError(f"{where}() got an unexpected keyword argument {name!r}{hint}; "
                            f"policies: {', '.join(settings.POLICIES)}")
        if value is not None:
            checked[name] = cast(str, setting.check(value))  # a policy's value: one of its choices
    return checked


def check_apply(patches: Any, exclude: Any, strict: Any,
                policies: Dict[str, Any]) -> Tuple[List[str], List[str], Dict[str, str]]:
    """Every argument of ``apply()``, checked before anything changes:
    ``(selected, left out, policies to set)``."""
    selected, excluded = select(patches, exclude)
    strict_names(strict, selected)
    checked = check_policies(policies)
    announce_environment()
    return selected, excluded, checked


def strict_names(strict: Any, selected: Sequence[str], where: str = "tmpatch.apply") -> Tuple[str, ...]:
    """The patches ``strict`` asks to be strict about: every one ``selected`` for True, none for
    False, or those named (a name, comma-separated names or an iterable of names), each of which
    must be selected. ``TypeError``/``ValueError`` saying what is expected."""
    if isinstance(strict, bool):
        return tuple(selected) if strict else ()
    argument = f"{where}(strict=...)"
    if strict is None or isinstance(strict, (int, float, bytes, bytearray, memoryview)):
        raise TypeError(f"{argument} must be True, False or patch names; got {_shown(strict)}")
    try:
        chosen = names(strict, argument) or ()
    except TypeError:
        raise TypeError(f"{argument} must be True, False or patch names; got {_shown(strict)}") from None
    outside = [name for name in chosen if name not in selected]
    if outside:
        raise ValueError(f"{argument} names {', '.join(outside)}, not among the patches applied "
                         f"({', '.join(selected) or 'none'})")
    return chosen


_environment_read = False


def announce_environment() -> None:
    """Once per process: report the policy variables (``TMPATCH_NAN_CHECK`` ...)
    the environment got wrong, as warnings of the ``tmpatch`` logger (those
    the start-up bootstrap already reported are not repeated)."""
    global _environment_read
    if _environment_read:
        return
    _environment_read = True

    variables = {setting.variable for setting in settings.POLICIES.values()}
    problems = [problem for problem in env.read().problems if problem.variable in variables]
    settings.announce(problems, lambda message: log.warning("tmpatch: %s", message))

