"""Every setting of tmpatch in one table, and the run-time policies patches read.

:data:`SETTINGS` lists each setting once: its name, its environment variable,
whether it is a keyword of :func:`tmpatch.apply`, the values it takes, its
default and a help line. The environment parser (:mod:`tmpatch.control.env`), the
argument checks of ``apply()`` (:mod:`tmpatch.control.selection`), ``tmpatch --help``,
``tmpatch run``'s options and the pytest marker all read this table.

Each *policy* setting (``nan_check``, ``bincount``, ``checks``, ``update_count``) has its value
now in :data:`tmpatch.runtime.policies.current`, filled here from the environment.
Patches look it up on every call (``policies.current["nan_check"]``), so
``tmpatch.apply(nan_check=...)`` takes effect at once, also on patches already
applied. Initial values come from the environment (``TMPATCH_NAN_CHECK`` ...);
a bad value leaves the default, and is reported once, by the start-up
bootstrap or by the first ``apply()``
(:func:`tmpatch.control.selection.announce_environment`).

Adding a policy is one row: ``Setting("name", "help line", choices=(default,
...), policy=True)``; it then has a ``TMPATCH_NAME`` variable (checked and
listed in ``tmpatch --help``), an ``apply(name=...)`` keyword, a ``tmpatch run
--name`` option, a ``@pytest.mark.tmpatch(name=...)`` keyword and an entry in
:data:`tmpatch.runtime.policies.current`, which the patch reads.

This module is imported at interpreter start-up (through :mod:`tmpatch.control.env`):
it imports nothing but :mod:`os`.
"""
from __future__ import annotations

import os

from tmpatch.runtime import policies

#: the prefix of every variable; ``TMPATCH`` alone is the switch
PREFIX = "TMPATCH"

TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")

#: kinds of setting (how a value is written)
SWITCH = "switch"  #: ``TMPATCH`` itself: on/off
NAMES = "names"  #: patch names, comma-separated in the environment
FLAG = "flag"  #: a boolean
CHOICE = "choice"  #: one word of ``choices``
FLAG_OR_NAMES = "flag or names"  #: a boolean, or patch names (comma-separated in the environment)


class Setting:
    """One row of :data:`SETTINGS`.

    ``name``: the keyword (of ``apply()`` when ``keyword`` is true); ``variable``:
    the environment variable (``TMPATCH_<NAME>`` unless given); ``kind``: see
    the constants above; ``choices``: the words of a CHOICE (the first is the
    default); ``policy``: a run-time value patches read from :data:`tmpatch.runtime.policies.current`.
    """

    __slots__ = ("name", "doc", "kind", "choices", "default", "keyword", "policy", "variable")

    def __init__(self, name: str, doc: str, *, kind: str = CHOICE, choices: tuple = (), keyword: bool = True,
                 policy: bool = False, variable: str = "", default: object = None) -> None:
        self.name = name
        self.doc = doc
        self.kind = kind
        self.choices = tuple(choices)
        self.keyword = keyword
        self.policy = policy
        self.variable = variable or f"{PREFIX}_{name.upper()}"
        self.default = self.choices[0] if default is None and kind == CHOICE and policy else default

    @property
    def form(self) -> str:
        """The accepted values, as messages and ``--help`` name them."""
        if self.kind == NAMES:
            return "comma-separated patch names (e.g. safe_divide,nan_check)"
        if self.kind in (FLAG, SWITCH):
            return f"{'/'.join(TRUE_WORDS)} or {'/'.join(FALSE_WORDS)}"
        if self.kind == FLAG_OR_NAMES:
            return f"{'/'.join(TRUE_WORDS)}, {'/'.join(FALSE_WORDS)} or comma-separated patch names"
        return "one of " + ", ".join(self.choices)

    @property
    def placeholder(self) -> str:
        """``VALUE`` in ``TMPATCH_X=VALUE`` (help texts)."""
        if self.kind == NAMES:
            return "NAMES"
        if self.kind in (FLAG, SWITCH):
            return "1"
        if self.kind == FLAG_OR_NAMES:
            return "1|NAMES"
        return "|".join(self.choices)

    def parse(self, text: str) -> object:
        """The value of an environment variable; ``ValueError`` saying what is
        wrong and naming the valid form (the caller adds the variable)."""
        word = text.strip()
        if self.kind == NAMES:
            names = tuple(part for part in word.replace(",", " ").split() if part)
            if not names:
                raise ValueError(f"names no patch; use {self.form}")
            return names
        word = word.lower()
        if not word:
            raise ValueError(f"is empty; use {self.form}")
        if self.kind in (FLAG, SWITCH, FLAG_OR_NAMES):
            if word in TRUE_WORDS:
                return True
            if word in FALSE_WORDS:
                return False
            if self.kind == FLAG_OR_NAMES:
                return tuple(part for part in text.replace(",", " ").split() if part)
        elif word in self.choices:
            return word
        raise ValueError(f"not understood; use {self.form}")

    def check(self, value: object) -> object:
        """An ``apply()`` keyword's value (not NAMES: :mod:`tmpatch.control.selection`
        checks those); ``TypeError``/``ValueError`` naming the valid ones."""
        if self.kind == FLAG:
            if not isinstance(value, bool):
                raise TypeError(f"tmpatch: {self.name} must be True or False; got {_shown(value)}")
            return value
        if not isinstance(value, str):
            raise TypeError(f"tmpatch: {self.name} must be a string, {self.form}; got {_shown(value)}")
        if value not in self.choices:
            raise ValueError(f"tmpatch: {self.name} must be {self.form}; got {value!r}")
        return value

    def to_text(self, value: object) -> str:
        """The inverse of :meth:`parse`."""
        if self.kind == NAMES or (self.kind == FLAG_OR_NAMES and not isinstance(value, bool)):
            return ",".join(value)  # type: ignore[arg-type]  # names: a tuple of str
        if isinstance(value, bool):
            return "1" if value else "0"
        return str(value)

    def __repr__(self) -> str:
        return f"Setting({self.name!r}, variable={self.variable!r}, kind={self.kind!r})"


def _shown(value: object) -> str:
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{type(value).__name__} {text}"


#: every setting, once; the order of ``--help``
SETTINGS = (
    Setting("enabled", "1/true/yes/on: tmpatch on in this process and its children (unset, empty, 0/false/no/off: off)",
            kind=SWITCH, keyword=False, variable=PREFIX, default=False),
    Setting("patches", "only these patches, comma-separated (unset: all)", kind=NAMES),
    Setting("exclude", "all patches but these, comma-separated", kind=NAMES),
    Setting("strict", "importing torchmetrics fails if a requested patch (or one of the patches named) cannot be "
            "applied whole; the error names the targets left alone",
            kind=FLAG_OR_NAMES, default=False),
    Setting("log_level", "send tmpatch's log records from this level to stderr", choices=LOG_LEVELS,
            keyword=False),
    Setting("nan_check", "when the nan_check patch reports NaN values: at the next compute() (deferred), "
            "in update() as upstream, with its sync (eager), or never (off)",
            choices=("deferred", "eager", "off"), policy=True),
    Setting("bincount", "values outside [0, num_classes) under the bincount patch: recorded on the device and "
            "reported at compute() (deferred), or the release's own _bincount (eager)",
            choices=("deferred", "eager"), policy=True),
    Setting("checks", "when the deferred input checks (retrieval_check, fairness_groups, panoptic_preprocess, "
            "edge_distances, legacy_dice_checks, tweedie_checks, sdr_solve) give the release's error: at the next "
            "compute() (deferred), or in update() as upstream, with the release's syncs (eager)",
            choices=("deferred", "eager"), policy=True),
    Setting("update_count", "how a compiled update() raises the metric's update count: on the metric's device in "
            "the graph, folded into the count at its next read (device), or run eagerly, one graph break per update "
            "(outside)",
            choices=("device", "outside"), policy=True),
)

BY_NAME = {setting.name: setting for setting in SETTINGS}
#: the settings that are run-time policies, by name
POLICIES = {setting.name: setting for setting in SETTINGS if setting.policy}


def closest(name: str, choices, cutoff: float):
    """The one of ``choices`` that ``name`` most resembles (at least ``cutoff``), or None:
    the hint of every misspelt name, variable, keyword or option."""
    import difflib  # here: only a misspelling needs it, and this module loads at start-up

    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=cutoff)
    return close[0] if close else None


def unknown_names(unknown: "list[str] | tuple[str, ...]", valid: "list[str] | tuple[str, ...]") -> str:
    """``unknown patch name(s) 'safe_divid' (did you mean 'safe_divide'?), 'x'``."""
    shown = []
    for name in unknown:
        close = closest(name, valid, cutoff=0.75)
        shown.append(f"{name!r} (did you mean {close!r}?)" if close else repr(name))
    return f"unknown patch name(s) {', '.join(shown)}"


def variables() -> tuple:
    """Every variable tmpatch reads, in table order."""
    return tuple(setting.variable for setting in SETTINGS)


def _from_env(name: str, environ=None) -> str:
    """The value of policy ``name`` in the environment; its default when the
    variable is unset or not understood (quietly: :mod:`tmpatch.control.env` reports)."""
    setting = POLICIES[name]
    raw = (os.environ if environ is None else environ).get(setting.variable)
    if raw is None:
        return setting.default  # type: ignore[return-value]  # a policy's default is its first choice (str)
    try:
        return setting.parse(raw)  # type: ignore[return-value]  # a policy parses to one of its choices (str)
    except ValueError:
        return setting.default  # type: ignore[return-value]  # a policy's default is its first choice (str)


policies.current.update({name: _from_env(name) for name in POLICIES})


def set_policy(name: str, value: str) -> None:
    """Set ``tmpatch.runtime.policies.current[name]``; ``KeyError``/``TypeError``/``ValueError`` name the valid ones."""
    if name not in POLICIES:
        raise KeyError(f"tmpatch: no policy {name!r}; policies: {', '.join(POLICIES)}")
    policies.current[name] = POLICIES[name].check(value)  # type: ignore[assignment]  # a choice (str)


#: messages already shown in this process (the bootstrap, the CLI and apply()
#: may each come across the same bad variable: it is reported once)
_announced: set = set()


def announce(messages, write) -> None:
    """Call ``write(message)`` for each message not announced before in this process."""
    for message in messages:
        if message not in _announced:
            _announced.add(message)
            write(message)
