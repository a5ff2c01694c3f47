"""legacy_dice_checks: the legacy Dice metric's input checks counted on the device and reported later, once,
without a sync.

Defect: ``torchmetrics.classification.Dice`` (1.0.0-1.6.3; removed in 1.7.0) formats its
inputs with the legacy ``_input_format_classification``, whose checks read the device on
every ``update()``, two to three times with the usual arguments: ``target.min() < 0``
(``_basic_input_validation``), ``target.max() > 1`` for float ``preds`` of ``target``'s shape
(``_check_shape_and_type_consistency``), ``target.max() >= implied_classes``
(``_check_classification_inputs``), ``num_classes <= target.max()`` (``_check_num_classes_mc``),
and, for integer ``preds`` or ``multiclass=False``, ``preds.min() < 0`` and the ``max() > 1``
checks. Each raises a ``ValueError`` in ``update()``; no argument turns them off. Its
``compute()`` (so ``forward()``) copies five numbers to the device in ``_reduce_stat_scores``
(``tensor(zero_division, ...)`` and the like). Not fixed upstream.

Repair (edits of the check statements, :mod:`tmpatch.engine.rewrite`; the rest is the release's
code): in an update of a Dice with a deferred-report book (built while ``deferred_reports`` is
applied; the class ``update`` marks it), each check's device condition is counted on the
device instead of read, and the release's ``ValueError`` (its own message) is raised once at
the next ``compute()`` (or a later update, or the next settle point; its message first, tmpatch's
note after it). So that invalid labels cannot index out of range on the device meanwhile,
``to_onehot`` clamps its labels into ``[0, num_classes)`` in a marked update (valid labels are
unchanged). On the CPU, where the read costs nothing, the release's check statements run as
they are: their error from that update, before the batch is added. ``_reduce_stat_scores``
makes its numbers with ``torch.full`` (:func:`tmpatch.runtime.device_tensors.device_tensor`).

Deliberate difference (on a device only): a batch that fails a check is kept in the states
(its bad labels clamped); upstream, ``update()`` raised before adding it. The report says so; ``reset()``
discards it. Dice without ``num_classes`` and integer ``preds`` still reads the number of
classes from the data (the shape of what follows depends on it). Not covered (the release's
code runs): the functional ``dice``, other users of these checks, metrics built before
``apply()``.

Policy ``checks`` (``TMPATCH_CHECKS``): ``eager`` leaves the update unmarked, so the release's
code runs, its error raised in ``update()`` with its syncs.

Releases: 0.11.0-1.6.3 (one or two implementations of each function, three of
``_check_shape_and_type_consistency``; 0.11 tests a negative target in an ``if``/``elif``);
the Dice class is gone from 1.7.0. 0.10's Dice runs the legacy ``StatScores.update``, which
every legacy classification metric shares: 0.10 is left alone (unsupported, with the reason).
"""
from __future__ import annotations

from types import ModuleType
from typing import Any, Callable, Dict, List, Optional, Tuple

from tmpatch.runtime import deferred, host
from tmpatch.runtime.compiled import compiling
from tmpatch.runtime.deferred.marking import Marker
from tmpatch.runtime.device_tensors import built, swap
from tmpatch.spec import (
    INHERENT,
    PATCHED,
    Decline,
    Edit,
    Label,
    Patch,
    Rewrite,
    Target,
    Together,
    Variant,
    gated,
    since,
    span,
)

#: check key -> the release's message (the same text in 1.0.0-1.6.3)
MESSAGES = {
    "target_negative": "The `target` has to be a non-negative tensor.",
    "preds_negative": "If `preds` are integers, they have to be non-negative.",
    "target_binary": "If you set `multiclass=False`, then `target` should not exceed 1.",
    "preds_binary": "If you set `multiclass=False` and `preds` are integers, then `preds` should not exceed 1.",
    "float_target": "If `preds` and `target` are of shape (N, ...) and `preds` are floats, `target` should be binary.",
    "implied_classes": "The highest label in `target` should be smaller than the size of the `C` dimension of `preds`.",
    "num_classes": "The highest label in `target` should be smaller than `num_classes`.",
}


def _reporter(key: str) -> Callable[[Any, List[Tuple[Any, int]], bool], None]:
    def report(top: Any, found: List[Tuple[Any, int]], all_ranks: bool) -> None:
        count = sum(n for _, n in found)
        where = " on some rank" if all_ranks else ""
        raise deferred.error_as_release(ValueError, MESSAGES[key], (
            f"tmpatch legacy_dice_checks: {count} update(s) of {type(top).__name__}{where} since the "
            f"last report failed this check; reported at {deferred.point()} instead of in update(). Unlike without "
            "tmpatch, those batches were added to the metric's states, labels outside the classes clamped: "
            "reset() discards them. TMPATCH_CHECKS=eager raises it in update(), as without tmpatch"))

    return report


RECORDS = {key: deferred.Record(f"legacy_dice_checks:{key}", _reporter(key)) for key in MESSAGES}

class _Update:
    """A marked update: its metric, and whether a deferred check may have failed (labels to clamp)."""

    __slots__ = ("metric", "suspect")

    def __init__(self, metric: Any) -> None:
        self.metric = metric
        self.suspect = False


#: the marked update of the metric running in this thread / task (class ``update`` below)
MARK = Marker("tmpatch_legacy_dice", RECORDS["target_negative"], _Update)
build_update = MARK.build_update


def build_to_onehot(module: ModuleType) -> Callable[..., Any]:
    """``to_onehot``: in a marked update where a check may have failed, labels clamped into
    ``[0, num_classes)`` first."""

    @gated(MARK.slot)
    def to_onehot(original: Callable, label_tensor: Any, num_classes: Optional[int] = None) -> Any:
        update = MARK.get()
        if update is not None and update.suspect and type(num_classes) is int and num_classes > 0:
            label_tensor = label_tensor.clamp(0, num_classes - 1)
        return original(label_tensor, num_classes)

    return to_onehot


def _names(module: ModuleType) -> Dict[str, Any]:
    def check(condition: Any, key: str) -> Any:
        """The release's ``condition``; in a marked update on a device, counted for later instead (False)."""
        update = MARK.get()
        if update is None:
            return condition
        if host.on_host(condition) and not compiling():
            return condition  # a read costs nothing on the CPU: the release's check raises in this update
        RECORDS[key].add(update.metric, condition)
        update.suspect = True  # not known on the host: clamp
        return False

    return {"_tmpatch_check": check, "_tmpatch_tensor": built()[0]}


def _deferred(statement: str, *conditions: Tuple[str, str]) -> Edit:
    """``statement`` (an ``if ...: raise``) with each device ``condition`` passed through the check."""
    new = statement
    for condition, key in conditions:
        new = new.replace(condition, f"_tmpatch_check({condition}, {key!r})")
    return Edit(statement, new)


_M = MESSAGES
#: the checks of ``_basic_input_validation`` after the one of a negative target
_BASIC_REST = (
    _deferred(f"if not preds_float and preds.min() < 0:\n    raise ValueError({_M['preds_negative']!r})",
              ("preds.min() < 0", "preds_negative")),
    _deferred(f"if multiclass is False and target.max() > 1:\n    raise ValueError({_M['target_binary']!r})",
              ("target.max() > 1", "target_binary")),
    _deferred(f"if multiclass is False and not preds_float and preds.max() > 1:\n"
              f"    raise ValueError({_M['preds_binary']!r})", ("preds.max() > 1", "preds_binary")),
)
BASIC = Rewrite((
    _deferred("if (ignore_index is None and target.min() < 0) or (ignore_index and ignore_index >= 0 and "
              f"target.min() < 0):\n    raise ValueError({_M['target_negative']!r})",
              ("target.min() < 0", "target_negative")),
) + _BASIC_REST, _names)
#: 0.11: the negative-target check as an ``if``/``elif`` (``ignore_index is not None``): one condition is read
BASIC_0 = Rewrite((
    _deferred(f"if ignore_index is None and target.min() < 0:\n    raise ValueError({_M['target_negative']!r})\n"
              f"elif ignore_index is not None and ignore_index >= 0 and target.min() < 0:\n"
              f"    raise ValueError({_M['target_negative']!r})", ("target.min() < 0", "target_negative")),
) + _BASIC_REST, _names)
SHAPES = Rewrite((_deferred(f"if preds_float and target.numel() > 0 and target.max() > 1:\n"
                            f"    raise ValueError({_M['float_target']!r})", ("target.max() > 1", "float_target")),),
                 _names)
IMPLIED = Rewrite((_deferred(f"if target.max() >= implied_classes:\n    raise ValueError({_M['implied_classes']!r})",
                             ("target.max() >= implied_classes", "implied_classes")),), _names)
NUM_CLASSES = Rewrite((_deferred(f"if target.numel() > 0 and num_classes <= target.max():\n"
                                 f"    raise ValueError({_M['num_classes']!r})",
                                 ("num_classes <= target.max()", "num_classes")),), _names)
_REDUCE = (
    "numerator = torch.where(\n    zero_div_mask, tensor(zero_division, dtype=numerator.dtype, "
    "device=numerator.device), numerator\n)",
    "denominator = torch.where(\n    zero_div_mask | ignore_mask, tensor(1.0, dtype=denominator.dtype, "
    "device=denominator.device), denominator\n)",
    "weights = torch.where(ignore_mask, tensor(0.0, dtype=weights.dtype, device=weights.device), weights)",
    "scores = torch.where(torch.isnan(scores), tensor(zero_division, dtype=scores.dtype, device=scores.device), "
    "scores)",
)
REDUCE = Rewrite(tuple(Edit(s, swap(s)) for s in _REDUCE + (
    'return torch.where(ignore_mask, tensor(float("nan"), device=scores.device), scores)',)), _names)
#: 0.11: the last one is an assignment
REDUCE_0 = Rewrite(tuple(Edit(s, swap(s)) for s in _REDUCE + (
    'scores = torch.where(ignore_mask, tensor(float("nan"), device=scores.device), scores)',)), _names)

_CHECKS = "torchmetrics.utilities.checks"
_LEGACY = span("0.11.0", "1.6.3")


def _one(module: str, qualname: str, fingerprint: str, build: Any, shared: bool = False) -> Target:
    return Target(module=module, qualname=qualname, present=_LEGACY, variants=(Variant(_LEGACY, fingerprint, build),),
                  shared=shared)


def _two(module: str, qualname: str, old: Tuple[str, Any], new: Tuple[str, Any]) -> Target:
    """A target with one implementation in 0.11 and another in 1.0.0-1.6.3."""
    return Target(module=module, qualname=qualname, present=_LEGACY, variants=(
        Variant(span("0.11.0", "0.11.4"), old[0], old[1]), Variant(span("1.0.0", "1.6.3"), new[0], new[1])))


PATCH = Patch(
    name="legacy_dice_checks",
    summary="the legacy Dice (until 1.6.3) reads target.min()/max() in its input checks on each update() and copies "
            "numbers in compute(); "
            "checks counted on the device and reported later, once, without a sync, numbers filled",
    known=since("0.10.0"),
    declines=(Decline(span("0.10.0", "0.10.3"),
                      "0.10's Dice has no update of its own: it runs the legacy StatScores.update, which every "
                      "legacy classification metric shares (their checks read the device as in 0.11); left alone"),),
    upstream="not fixed upstream (Dice was removed in 1.7.0)",
    changes="on a GPU a Dice input failing a check raises the release's ValueError once "
            "(from a later update(), or compute()), the batch kept with its labels clamped "
            "(upstream and on the CPU: raised in that update())",
    requires=("deferred_reports",),
    labels=(
        Label(PATCHED, "the legacy Dice's input checks read target/preds min and max; the legacy_dice_checks patch "
              "counts them on the device and reports it later, once",
              function=r"_basic_input_validation|_check_shape_and_type_consistency|_check_classification_inputs"
                       r"|_check_num_classes_mc", op="aten._local_scalar_dense"),
        Label(PATCHED, "the legacy Dice's compute copies numbers to the device; the legacy_dice_checks patch fills "
              "them",
              function="_reduce_stat_scores", op="aten._to_copy"),
        Label(INHERENT, "legacy Dice without num_classes and with integer preds: the number of classes is read from "
              "the data (the one-hot shape depends on it)", function="_input_format_classification",
              op="aten._local_scalar_dense", patch="legacy_dice_checks"),
    ),
    together=(Together("the checks are deferred only in the update that marks them, and to_onehot keeps the labels "
                       "of a deferred check in range", targets=("Dice.update", "_basic_input_validation",
                       "_check_shape_and_type_consistency", "_check_classification_inputs", "_check_num_classes_mc",
                       "to_onehot")),),
    targets=(
        _one("torchmetrics.classification.dice", "Dice.update", "b9bbf0b964772961", build_update),
        _two(_CHECKS, "_basic_input_validation", ("30bdd278637ba82b", BASIC_0), ("553e06529addbed1", BASIC)),
        Target(module=_CHECKS, qualname="_check_shape_and_type_consistency", present=_LEGACY, variants=(
            Variant(span("0.11.0", "0.11.4"), "97bb341a311b6b5c", SHAPES),
            Variant(span("1.0.0", "1.5.2"), "651f1bd24b330dfe", SHAPES),
            Variant(span("1.6.0", "1.6.3"), "3c276878c9d32d19", SHAPES),  # annotation only
        )),
        _one(_CHECKS, "_check_classification_inputs", "34f09efa470af6e7", IMPLIED),
        _one(_CHECKS, "_check_num_classes_mc", "44500f7a0dd9d24b", NUM_CLASSES),
        _one("torchmetrics.utilities.data", "to_onehot", "3f33b8e848bcc9d5", build_to_onehot, shared=True),
        _two("torchmetrics.functional.classification.stat_scores", "_reduce_stat_scores",
             ("ff6f53d846fcdcf3", REDUCE_0), ("b2ec2e4cfd6aa0e3", REDUCE)),
    ),
)
