"""The environment variables that switch tmpatch on in every Python process.

``TMPATCH=1`` turns tmpatch on (``1``/``true``/``yes``/``on``; ``0``/``false``/
``no``/``off`` or empty leave it off). Companion variables mirror the keywords
of :func:`tmpatch.apply` (table :data:`SETTINGS`)::

    TMPATCH_PATCHES=safe_divide,cumsum_device   only these patches
    TMPATCH_EXCLUDE=gather_autograd             all but these
    TMPATCH_STRICT=1                            a patch that cannot apply is an error
    TMPATCH_LOG_LEVEL=info                      tmpatch's log records to stderr

Values are only compared with fixed words and tmpatch's own patch names: none
is imported, evaluated or executed. A value that is not understood, or a
``TMPATCH_*`` variable that looks like a misspelt setting, is reported in
:attr:`Settings.problems` (one message per variable, naming the valid choices)
and ignored; the rest applies. Other ``TMPATCH_*`` variables (test tools')
pass silently.

This module runs at interpreter start-up (``tmpatch.pth``), so it imports
nothing but :mod:`os` (and :mod:`difflib` when a variable looks misspelt). Adding a variable is one line in :data:`SETTINGS`.
"""
from __future__ import annotations

import os

#: the switch
SWITCH = "TMPATCH"

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off", "")

LOG_LEVELS = ("debug", "info", "warning", "error", "critical")

#: ``TMPATCH_*`` variables read elsewhere, never reported as unknown:
#: ``TMPATCH_NAN_CHECK`` by :mod:`tmpatch.settings`, ``TMPATCH_TEST_RELEASE`` by
#: the test suite (tools/matrix.py)
OTHER_VARIABLES = ("TMPATCH_NAN_CHECK", "TMPATCH_BINCOUNT", "TMPATCH_TEST_RELEASE")


def is_on(value: str | None) -> bool:
    """Whether a value of ``TMPATCH`` switches tmpatch on (unknown words: off)."""
    return value is not None and value.strip().lower() in TRUE_WORDS


# -- parsers: value -> parsed value, or ValueError naming the valid ones ----------
def parse_flag(value: str) -> bool:
    word = value.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise ValueError(f"use one of {', '.join(TRUE_WORDS)} or {', '.join(w for w in FALSE_WORDS if w)}")


def parse_names(value: str) -> tuple[str, ...] | None:
    """Comma- or space-separated names (checked against the catalogue later,
    in :meth:`Settings.check_names`); empty means "not set"."""
    names = tuple(part for part in value.replace(",", " ").split() if part)
    return names or None


def choice(*words: str):
    """A parser accepting one of ``words`` (case-insensitive)."""

    def parse(value: str) -> str:
        word = value.strip().lower()
        if word not in words:
            raise ValueError(f"use one of {', '.join(words)}")
        return word

    return parse


class Setting:
    """A companion variable: its name, the keyword it sets, its parser, a help line."""

    __slots__ = ("variable", "option", "parse", "doc", "api")

    def __init__(self, variable: str, option: str, parse, doc: str, api: bool = True) -> None:
        self.variable = variable
        self.option = option
        self.parse = parse
        self.doc = doc
        self.api = api  # a keyword of tmpatch.apply(); otherwise read by the bootstrap itself


#: every companion variable (``api=False``: not a keyword of ``tmpatch.apply()``)
SETTINGS = (
    Setting("TMPATCH_PATCHES", "patches", parse_names, "apply only these patches (comma-separated)"),
    Setting("TMPATCH_EXCLUDE", "exclude", parse_names, "apply all patches but these (comma-separated)"),
    Setting("TMPATCH_STRICT", "strict", parse_flag, "importing torchmetrics fails if a patch cannot apply"),
    Setting("TMPATCH_LOG_LEVEL", "log_level", choice(*LOG_LEVELS), "tmpatch's log to stderr from this level "
            f"({'/'.join(LOG_LEVELS)})", api=False),
)

#: settings whose values are patch names
NAME_OPTIONS = ("patches", "exclude")


class Settings:
    """What the environment asks for.

    ``enabled``: ``TMPATCH`` is on. ``options``: keywords for
    :func:`tmpatch.apply`. ``log_level``: ``None`` or a level name.
    ``problems``: one message per variable that was not understood.
    """

    def __init__(self, enabled: bool, options: dict, log_level: str | None, problems: list) -> None:
        self.enabled = enabled
        self.options = options
        self.log_level = log_level
        self.problems = problems

    def check_names(self, valid) -> list:
        """Drop unknown patch names from the options; return (and record) one
        message per variable that named any."""
        found = []
        for option in NAME_OPTIONS:
            names = self.options.get(option)
            if not names:
                continue
            unknown = [name for name in names if name not in valid]
            if unknown:
                kept = tuple(name for name in names if name in valid)
                self.options[option] = kept
                variable = _variable_of(option)
                rest = f"using {', '.join(kept)}" if kept else "none left"
                found.append(
                    f"{variable}: unknown patch name(s) {', '.join(map(repr, unknown))} ignored ({rest}); "
                    f"valid names: {', '.join(valid)}"
                )
        self.problems.extend(found)
        return found

    def __repr__(self) -> str:
        return (f"Settings(enabled={self.enabled!r}, options={self.options!r}, "
                f"log_level={self.log_level!r}, problems={self.problems!r})")


def _variable_of(option: str) -> str:
    for setting in SETTINGS:
        if setting.option == option:
            return setting.variable
    return option


def known_variables() -> tuple[str, ...]:
    return (SWITCH,) + tuple(setting.variable for setting in SETTINGS)


def _misspelt(environ) -> list:
    """``TMPATCH_*`` variables that look like a misspelt setting, each with the
    one it resembles (other tools' ``TMPATCH_*`` variables pass silently)."""
    known = known_variables()
    unknown = sorted(name for name in environ
                     if name.startswith(SWITCH + "_") and name not in known and name not in OTHER_VARIABLES)
    if not unknown:
        return []
    import difflib  # only when there is something to look at

    prefix = len(SWITCH) + 1
    suffixes = [setting.variable[prefix:] for setting in SETTINGS]
    found = []
    for name in unknown:
        close = difflib.get_close_matches(name[prefix:], suffixes, n=1, cutoff=0.75)
        if close:
            found.append(f"{name} (did you mean {SWITCH}_{close[0]}?)")
    return found


def read(environ=None, valid_names=None) -> Settings:
    """Parse ``environ`` (default ``os.environ``).

    Patch names are checked only when ``valid_names`` is given (the catalogue
    is not imported here); see :meth:`Settings.check_names`.
    """
    environ = os.environ if environ is None else environ
    problems = []
    raw = environ.get(SWITCH)
    enabled = is_on(raw)
    if raw is not None and not enabled and raw.strip().lower() not in FALSE_WORDS:
        problems.append(
            f"{SWITCH}={raw!r} not understood, tmpatch stays off; use one of {', '.join(TRUE_WORDS)} "
            f"to switch it on, or {', '.join(w for w in FALSE_WORDS if w)}"
        )
    options: dict = {}
    log_level = None
    for setting in SETTINGS:
        value = environ.get(setting.variable)
        if value is None:
            continue
        try:
            parsed = setting.parse(value)
        except ValueError as exc:
            problems.append(f"{setting.variable}={value!r} not understood, ignored; {exc}")
            continue
        if parsed is None:
            continue
        if setting.api:
            options[setting.option] = parsed
        elif setting.option == "log_level":
            log_level = parsed
    misspelt = _misspelt(environ)
    if misspelt:
        problems.append(f"unknown variable(s) {', '.join(misspelt)} ignored; tmpatch reads {', '.join(known_variables())}")
    settings = Settings(enabled, options, log_level, problems)
    if valid_names is not None:
        settings.check_names(tuple(valid_names))
    return settings


def to_environ(options: dict) -> dict:
    """The variables that ask for ``options`` (keywords of ``apply()`` and
    ``log_level``): the inverse of :func:`read`, for ``tmpatch run``."""
    out = {}
    for setting in SETTINGS:
        value = options.get(setting.option)
        if value is None:
            continue
        if isinstance(value, bool):
            out[setting.variable] = "1" if value else "0"
        elif isinstance(value, (list, tuple)):
            out[setting.variable] = ",".join(value)
        else:
            out[setting.variable] = str(value)
    return out
