"""Giving a report: each record's reporter called once with what was counted, where it is
given named for the reporter's text (:func:`point`), warnings first, one error raised.

Shared by every place a report comes: a settle point (``settling.py``), the update that finds
the evidence on the host and the metric's collection or the process's exit (``landing.py``).
"""
from __future__ import annotations

import contextvars
import linecache
import warnings
from types import ModuleType
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from tmpatch.runtime.deferred.books import _books, _records, log

#: where the report being given is given (reporters name it: :func:`point`)
_point: "contextvars.ContextVar[str]" = contextvars.ContextVar("tmpatch_settle_point", default="compute()")

#: per record key: (count, the first update it concerns where known, whether some of it came from
#: updates not known); what a report is made of
Tally = Dict[str, Tuple[int, Optional[int], bool]]


def point() -> str:
    """Where the report being given is given, for a reporter's text: ``compute()`` (the default),
    ``state_dict()``, ``reset()``, ``sync()``, ``merge_state()``, ``pickling``, ``update() #12``,
    ``forward() #12``, the metric's garbage collection or the process's exit; followed by the
    update the first counted occurrence came from where it is known."""
    return _point.get()


def warn_as_release(warn: Callable[..., Any], message: str, category: type, note: str) -> None:
    """Give a deferred warning as the release gives it: the release's words alone, through the
    release's own warn function (``rank_zero_warn``, or the ``warnings.warn`` of its module), so
    that its category, the file and module it is attributed to, its rank rule and Python's
    once-per-place registry are the release's, and a user's warning filters match it as they match
    the release's. What tmpatch adds (which metric, how many updates, where it is given) goes to
    the ``tmpatch`` logger at INFO."""
    log.info("%s [%s]", message, note)
    warn(message, category)


def warn_in(module: ModuleType, words: str) -> Callable[..., None]:
    """A warn function for :func:`warn_as_release` that warns as a release's own ``warnings.warn``
    in ``module`` does (the release's statement holding ``words``, on its line: the file, line,
    module and once-per-place registry Python's filters see there). Its line is looked up at the
    first warning only."""
    found: List[int] = []

    def warn(message: str, category: type) -> None:
        filename = getattr(module, "__file__", None) or "<unknown>"
        if not found:
            lines = linecache.getlines(filename, vars(module))
            found.append(next((n for n, line in enumerate(lines, 1) if words in line), 1))
        registry = vars(module).setdefault("__warningregistry__", {})
        warnings.warn_explicit(message, category, filename, found[0], module.__name__, registry, vars(module))

    return warn


def error_as_release(kind: Callable[[str], BaseException], message: str, note: str) -> BaseException:
    """A deferred error as the release raises it, given later than the release would: the
    release's type and words first, tmpatch's note after them in parentheses."""
    return kind(f"{message} ({note})")


def metrics_in(metric: Any) -> Iterator[Any]:
    """``metric`` and the metrics inside it (wrappers' base metrics, compositions' operands)."""
    if not getattr(metric, "_modules", None):
        yield metric
        return
    seen = set()
    for module in metric.modules():
        if id(module) not in seen and id(module) in _books:
            seen.add(id(module))
            yield module


def _where(where: str, first: Optional[int], unknown: bool, step: Optional[int]) -> str:
    if first is None or unknown or first == step:
        return where
    return f"{where} (the first of them came from update #{first})"


def deliver(top: Any, found: List[Tuple[Any, Tally, bool]], where: str, step: Optional[int] = None) -> None:
    """Call each record's reporter once for ``found`` (``(metric, tally, all_ranks)``: ``metric``
    is ``top`` or a metric inside it, ``all_ranks`` that its counts are sums over the ranks of a
    coalesced sync), with :func:`point` saying ``where`` and, unless it is ``step`` (the update
    giving the report), the update the first occurrence came from. Warnings come first; then
    the first error is raised, the others' messages in it."""
    by_key: Dict[str, List[Tuple[Any, int]]] = {}
    ranks: Dict[str, bool] = {}
    firsts: Dict[str, Optional[int]] = {}
    unknown: Dict[str, bool] = {}
    for metric, tally, all_ranks in found:
        for key, (count, first, vague) in tally.items():
            if not count:
                continue
            by_key.setdefault(key, []).append((metric, int(count)))
            ranks[key] = ranks.get(key, True) and all_ranks
            if first is not None:
                firsts[key] = first if firsts.get(key) is None else min(first, firsts[key])  # type: ignore[type-var]  # not None here
            unknown[key] = unknown.get(key, False) or vague
    errors: List[BaseException] = []
    for key, pairs in by_key.items():
        record = _records.get(key)
        if record is None:
            continue
        token = _point.set(_where(where, firsts.get(key), unknown[key], step))
        try:
            record.reporter(top, pairs, ranks[key])
        except Exception as exc:  # noqa: BLE001 - an error report: raised after the warnings
            errors.append(exc)
        finally:
            _point.reset(token)
    if len(errors) > 1 and len(errors[0].args) == 1 and isinstance(errors[0].args[0], str):
        # one raise per report: the others ride in its message, not lost
        errors[0].args = ("\n".join([errors[0].args[0]] + [f"Also: {exc}" for exc in errors[1:]]),)
    if errors:
        raise errors[0]
