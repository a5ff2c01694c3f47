"""The ``TMPATCH*`` environment variables, read in every Python process at start-up.

``TMPATCH=1`` turns tmpatch on (``1``/``true``/``yes``/``on``; ``0``/``false``/
``no``/``off`` or unset leave it off). The companion variables are the rows of
:data:`tmpatch.control.settings.SETTINGS`; ``tmpatch --help`` lists them::

    TMPATCH_PATCHES=safe_divide,cumsum_device   only these patches
    TMPATCH_EXCLUDE=gather_autograd             all but these
    TMPATCH_STRICT=1                            a patch that cannot apply whole is an error
    TMPATCH_STRICT=image_constants              ... only for the patches named
    TMPATCH_LOG_LEVEL=info                      tmpatch's log records to stderr
    TMPATCH_NAN_CHECK=eager, TMPATCH_BINCOUNT=eager   run-time policies

Values are only compared with fixed words and tmpatch's own patch names: none
is imported, evaluated or executed. A value that is empty or not understood,
and a ``TMPATCH_*`` variable that looks like a misspelt one, are reported in
:attr:`Settings.problems` (one message each, naming the valid form or the
closest valid variable) and ignored; the rest applies. ``TMPATCH_PATCHES``
naming no known patch applies none (as ``apply(patches=[])``). Other
``TMPATCH_*`` variables (test tools') pass silently.

This module runs at interpreter start-up (``tmpatch.pth``), so it imports
nothing but :mod:`os` and :mod:`tmpatch.control.settings` (and :mod:`difflib` when a
variable looks misspelt).
"""
from __future__ import annotations

import os

from tmpatch.control import settings as registry
from tmpatch.control.settings import PREFIX, SETTINGS, TRUE_WORDS

#: the switch
SWITCH = PREFIX

#: ``TMPATCH_*`` variables of the test suite (tools/matrix.py), never reported
OTHER_VARIABLES = ("TMPATCH_TEST_RELEASE",)


class Problem(str):
    """A message about one variable; ``variable`` is the one it is about (for a
    misspelt name, the valid variable it resembles)."""

    variable = ""

    def __new__(cls, message: str, variable: str) -> "Problem":
        self = super().__new__(cls, message)
        self.variable = variable
        return self


def announce(problems, write) -> None:
    """``write`` each problem not reported before in this process (the bootstrap,
    the CLI and ``apply()`` may each come across the same variable)."""
    registry.announce(problems, write)


class Settings:
    """What the environment asks for.

    ``enabled``: ``TMPATCH`` is on. ``options``: keywords for
    :func:`tmpatch.apply` (``patches``, ``exclude``, ``strict``).
    ``log_level``: ``None`` or a level name. ``policies``: the policy values
    set in the environment (:mod:`tmpatch.control.settings` reads them itself).
    ``problems``: one message per variable that was not understood.
    """

    def __init__(self, enabled: bool, options: dict, log_level: str | None, problems: list,
                 policies: dict | None = None) -> None:
        self.enabled = enabled
        self.options = options
        self.log_level = log_level
        self.problems = problems
        self.policies = policies or {}

    def check_names(self, valid) -> list:
        """Drop unknown patch names from the options; return (and record) one
        message per variable that named any."""
        found = []
        for option in ("patches", "exclude", "strict"):
            names = self.options.get(option)
            if not names or isinstance(names, bool):
                continue
            unknown = [name for name in names if name not in valid]
            if unknown:
                kept = tuple(name for name in names if name not in unknown)
                self.options[option] = kept
                if option == "strict" and not kept:
                    del self.options[option]  # strict about no patch: off
                setting = registry.BY_NAME[option]
                if kept:
                    rest = f"using {','.join(kept)}"
                else:
                    rest = {"patches": "no patch is applied", "exclude": "nothing is excluded"}.get(
                        option, "strict about no patch")
                found.append(Problem(
                    f"{setting.variable}: {registry.unknown_names(unknown, valid)} ignored ({rest}); "
                    f"valid names: {', '.join(valid)}", setting.variable))
        self.problems.extend(found)
        return found

    def __repr__(self) -> str:
        return (f"Settings(enabled={self.enabled!r}, options={self.options!r}, log_level={self.log_level!r}, "
                f"policies={self.policies!r}, problems={list(self.problems)!r})")


def _word(value: object) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def _misspelt(environ) -> list:
    """One problem per ``TMPATCH_*`` variable that looks like a misspelt one,
    naming the variable it resembles (other tools' variables pass silently)."""
    known = registry.variables()
    unknown = sorted(name for name in environ
                     if name.upper().startswith(PREFIX) and name not in known and name not in OTHER_VARIABLES)
    if not unknown:
        return []
    def squeeze(name: str) -> str:
        return name.upper().replace("-", "").replace("_", "")

    squeezed = {squeeze(variable): variable for variable in known}
    found = []
    for name in unknown:
        guess = squeezed.get(squeeze(name))  # case, dashes, underscores: TMPATCH_NANCHECK
        if guess is None:
            guess = registry.closest(name.upper(), known, cutoff=0.8)
        if guess is not None:
            found.append(Problem(
                f"{name} is not a tmpatch variable, ignored; did you mean {guess}? "
                f"(tmpatch reads {', '.join(known)})", guess))
    return found


def read(environ=None, valid_names=None) -> Settings:
    """Parse ``environ`` (default ``os.environ``).

    Patch names are checked only when ``valid_names`` is given (the catalogue
    is not imported here); see :meth:`Settings.check_names`.
    """
    environ = os.environ if environ is None else environ
    problems: list = []
    options: dict = {}
    policies: dict = {}
    enabled = False
    log_level = None
    for setting in SETTINGS:
        raw = environ.get(setting.variable)
        if raw is None:
            continue
        if setting.kind == registry.SWITCH:
            if not raw.strip():  # TMPATCH= : off, as the .pth line reads it
                continue
            try:
                enabled = bool(setting.parse(raw))
            except ValueError:
                problems.append(Problem(f"{setting.variable}={raw!r} not understood, tmpatch stays off; use one of "
                                        f"{', '.join(TRUE_WORDS)} to switch it on, or "
                                        f"{', '.join(registry.FALSE_WORDS)}", setting.variable))
            continue
        try:
            value = setting.parse(raw)
        except ValueError as exc:
            if setting.name == "patches":  # a selection of none is still a selection: no patch applies
                options["patches"] = ()
                problems.append(Problem(f"{setting.variable}={raw!r} {exc}; no patch is applied",
                                        setting.variable))
            else:
                kept = "" if setting.default is None else f", {setting.name} stays {_word(setting.default)}"
                problems.append(Problem(f"{setting.variable}={raw!r} {exc}; ignored{kept}", setting.variable))
            continue
        if setting.policy:
            policies[setting.name] = value
        elif setting.keyword:
            options[setting.name] = value
        elif setting.name == "log_level":
            log_level = value
    problems.extend(_misspelt(environ))
    result = Settings(enabled, options, log_level, problems, policies)  # type: ignore[arg-type]  # log_level parses to a name
    if valid_names is not None:
        result.check_names(tuple(valid_names))
    return result


def to_environ(options: dict) -> dict:
    """The variables that ask for ``options`` (settings by name, see
    :data:`tmpatch.control.settings.SETTINGS`): the inverse of :func:`read`, for
    ``tmpatch run``. ``None`` values are left out."""
    out = {}
    for setting in SETTINGS:
        value = options.get(setting.name)
        if value is not None and setting.kind != registry.SWITCH:
            out[setting.variable] = setting.to_text(value)
    return out
