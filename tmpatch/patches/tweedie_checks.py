"""tweedie_checks: TweedieDevianceScore's range checks counted on the device and reported later, once, without a sync.

Defect: with ``power`` 1, 2, negative or above 1, ``_tweedie_deviance_score_update``
checks its inputs with ``if torch.any(preds <= 0) or torch.any(targets < 0): raise
ValueError(...)`` (the conditions vary with ``power``): one or two device reads on every
``update()`` of TweedieDevianceScore, with no argument to turn them off. Not fixed
upstream (1.9.0 included). (``power=0``, the default, has no check; its count copy is the
``scalar_tensors`` patch's.)

Repair: the class ``update`` marks the update of a metric with a deferred-report book
(built while ``deferred_reports`` is applied). In a marked update each check's condition
(an edit hands ``torch.any(a)`` and ``torch.any(b)`` to a helper, :mod:`tmpatch.engine.rewrite`; outside
a marked update it returns the release's ``a or b``) is counted on the device
(``torch.any(a) | torch.any(b)``) instead of read, and the release's ``ValueError`` (its message,
with the metric's ``power``, first; tmpatch's note after it) is raised once at the next
``compute()`` (or a later update, or the next settle point). On the CPU, where the read costs
nothing, the release's condition is returned as it is: its error from that update, before the
batch is added.

Deliberate difference (on a device only): a batch that fails the check is added to the states (upstream,
``update()`` raised before); its deviance is then NaN or infinite, as the formulas give
for such values, until ``reset()``. The functional API and metrics built before
``apply()`` keep the release's checks.

Policy ``checks`` (``TMPATCH_CHECKS``): ``eager`` leaves the update unmarked, so the release's
code runs, its error raised in ``update()`` with its syncs.

Releases: 0.10.0-1.9.0 (two implementations of the function, differing in an annotation;
one of the class ``update``).
"""
from __future__ import annotations

from types import ModuleType
from typing import Any, Callable, Dict, List, Tuple

from tmpatch.runtime import deferred, host
from tmpatch.runtime.compiled import compiling
from tmpatch.runtime.deferred.marking import Marker
from tmpatch.spec import PATCHED, Edit, Label, Patch, Rewrite, Target, Together, Variant, since, span

#: check key -> the release's message after ``For power={power}, ``
MESSAGES = {
    "poisson": "'preds' has to be strictly positive and 'targets' cannot be negative.",
    "positive": "both 'preds' and 'targets' have to be strictly positive.",
    "negative_power": "'preds' has to be strictly positive.",
    "compound": "'targets' has to be strictly positive and 'preds' cannot be negative.",
}


def _reporter(key: str) -> Callable[[Any, List[Tuple[Any, int]], bool], None]:
    def report(top: Any, found: List[Tuple[Any, int]], all_ranks: bool) -> None:
        count = sum(n for _, n in found)
        power = getattr(found[0][0], "power", "?")
        where = " on some rank" if all_ranks else ""
        raise deferred.error_as_release(ValueError, f"For power={power}, {MESSAGES[key]}", (
            f"tmpatch tweedie_checks: {count} update(s) of {type(top).__name__}"
            f"{where} since the last report failed this check; reported at {deferred.point()} instead of in update(). "
            "Unlike without tmpatch, those batches were added to the metric's states (their deviance is NaN or "
            "infinite): reset() discards them. TMPATCH_CHECKS=eager raises it in update(), as without tmpatch"))

    return report


RECORDS = {key: deferred.Record(f"tweedie_checks:{key}", _reporter(key)) for key in MESSAGES}

#: the marked update of the metric running in this thread / task (class ``update`` below)
MARK = Marker("tmpatch_tweedie", RECORDS["positive"])
build_update = MARK.build_update


def _names(module: ModuleType) -> Dict[str, Any]:
    def check(key: str, first: Any, second: Any = None) -> Any:
        """The release's ``first or second``; in a marked update on a device, counted for later instead (False)."""
        metric = MARK.get()
        if metric is None:
            return first if second is None else first or second
        if host.on_host(first) and not compiling():  # a read costs nothing on the CPU: the release's check raises
            return first if second is None else first or second
        RECORDS[key].add(metric, first if second is None else first | second)
        return False

    return {"_tmpatch_check": check}


def _raise(key: str) -> str:
    return f"    raise ValueError(f\"For power={{power}}, {MESSAGES[key]}\")"


_EITHER = "torch.any(preds <= 0) or torch.any(targets {} 0)"


def _checked(text: str, *keys: Tuple[str, str]) -> Edit:
    """``text`` (the release's statements) with each ``if a or b:`` made ``if _tmpatch_check(key, a, b):``."""
    new = text
    for condition, key in keys:
        new = new.replace(f"if {condition}:", f"if _tmpatch_check({key!r}, {condition.replace(' or ', ', ')}):")
    return Edit(text, new)


POISSON = _checked(f"if {_EITHER.format('<')}:\n{_raise('poisson')}", (_EITHER.format("<"), "poisson"))
GAMMA = _checked(f"if {_EITHER.format('<=')}:\n{_raise('positive')}\n"
                 "deviance_score = 2 * (torch.log(preds / targets) + (targets / preds) - 1)",
                 (_EITHER.format("<="), "positive"))
OTHERS = _checked(
    f"if power < 0:\n    if torch.any(preds <= 0):\n    {_raise('negative_power')}\n"
    f"elif 1 < power < 2:\n    if {_EITHER.format('<')}:\n    {_raise('compound')}\n"
    f"else:\n    if {_EITHER.format('<=')}:\n    {_raise('positive')}",
    ("torch.any(preds <= 0)", "negative_power"), (_EITHER.format("<"), "compound"), (_EITHER.format("<="), "positive"))
CHECKS = Rewrite((POISSON, GAMMA, OTHERS), _names)

PATCH = Patch(
    name="tweedie_checks",
    summary="TweedieDevianceScore (power 1, 2, < 0, > 1) reads torch.any(preds <= 0) (and targets) into an if on "
            "each update(); counted on the device and reported later, once, without a sync",
    known=since("0.10.0"),
    upstream="not fixed upstream (no argument turns the checks off)",
    changes="on a GPU an input outside the power's domain raises the release's ValueError once "
            "(from a later update(), or compute()), the batch in the states "
            "(upstream and on the CPU: raised in that update())",
    requires=("deferred_reports",),
    labels=(
        Label(PATCHED, "TweedieDevianceScore checks its inputs' range for the power (device reads); the tweedie_checks "
              "patch counts it on the device and reports it later, once",
              function="_tweedie_deviance_score_update", op="aten._local_scalar_dense"),
    ),
    together=(Together("the check is deferred only in the update that marks it"),),
    targets=(
        Target(module="torchmetrics.functional.regression.tweedie_deviance", qualname="_tweedie_deviance_score_update",
               variants=(Variant(span("0.10.0", "1.5.2"), "f5e302d79c8e37f4", CHECKS),
                         Variant(span("1.6.0", "1.9.0"), "78fa6f04f141e40d", CHECKS))),  # annotation only
        Target(module="torchmetrics.regression.tweedie_deviance", qualname="TweedieDevianceScore.update",
               variants=(Variant(span("0.10.0", "1.9.0"), "d0b7be3d64cc4405", build_update),)),
    ),
)
