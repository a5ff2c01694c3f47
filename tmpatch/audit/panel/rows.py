"""The rows of the built-in audit panel (:mod:`tmpatch.audit.panel.run`).

Each :class:`Row` names a call (``update`` of one metric or of the five metrics of a
training step, or one torchmetrics helper) and builds it from scratch, with fixed seeds.
"""
from __future__ import annotations

import importlib
import warnings
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Tuple

import torch

from tmpatch.audit.oracle.breaks import Breaks, graph_breaks
from tmpatch.audit.modes import deterministic

# --- rows --------------------------------------------------------------------------------------

Call = Tuple[Any, tuple, dict]  # (metric or function, args, kwargs)


@dataclass(frozen=True)
class Row:
    """One panel row: ``build()`` returns the calls to audit, built fresh each time."""

    name: str
    build: Callable[[], List[Call]]
    requires: Tuple[str, ...]  #: ``module:attr`` names; a missing one makes the row n/a
    helper: bool = False  #: a function call, no ``compute``
    device: str = "cuda:0"
    deterministic: bool = False
    doc: str = ""


def _resolve(name: str) -> Any:
    module, _, attr = name.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def _gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def _values(n: int = 8) -> torch.Tensor:
    return torch.randn(n, generator=_gen())


def _multiclass(classes: int, batch: int) -> Tuple[torch.Tensor, torch.Tensor]:
    g = _gen()
    return torch.randn(batch, classes, generator=g), torch.randint(0, classes, (batch,), generator=g)


def _regression() -> Tuple[torch.Tensor, torch.Tensor]:
    g = _gen()
    return torch.randn(8, generator=g), torch.randn(8, generator=g)


TM = "torchmetrics"
CLS = "torchmetrics.classification"
STEP_CLASSES = 1000
STEP_BATCH = 128


def training_step_calls() -> List[Call]:
    """The published case's metric work for one step: MeanMetric of the loss and multiclass
    Accuracy, Precision, Recall, F1 over 1000 classes (validate_args=False), one update each."""
    preds, target = _multiclass(STEP_CLASSES, STEP_BATCH)
    loss = torch.tensor(2.5)
    calls: List[Call] = [(_resolve(f"{TM}:MeanMetric")(), (loss,), {})]
    for name in ("MulticlassAccuracy", "MulticlassPrecision", "MulticlassRecall", "MulticlassF1Score"):
        metric = _resolve(f"{CLS}:{name}")(num_classes=STEP_CLASSES, validate_args=False)
        calls.append((metric, (preds, target), {}))
    return calls


def _mc_row(cls: str, validate: bool = False, suffix: str = "") -> Row:
    # batch 5: simulated ``torch.unique`` keeps every element, and validation wants <= num_classes of them.
    # Validation rows pass class labels: upstream validates nothing for float preds (an operator-precedence
    # slip makes its loop run over an empty tuple), so logits would hide the validation syncs.
    def inputs() -> Tuple[torch.Tensor, torch.Tensor]:
        preds, target = _multiclass(5, 5)
        return (preds.argmax(dim=1), target) if validate else (preds, target)

    return Row(cls + suffix, lambda: [(_resolve(f"{CLS}:{cls}")(num_classes=5, validate_args=validate),
                                       inputs(), {})], (f"{CLS}:{cls}",),
               doc=f"num_classes=5, validate_args={validate}" + (", integer preds" if validate else ""))


def _classification_inputs(task: str, samplewise: bool = False, ignore: Optional[int] = None,
                            labels: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
    """Batch 6: multiclass logits (6, 5[, 3]) or labels (batch 5), binary (6,) / multilabel (6, 3) probabilities;
    every third target set to ``ignore`` when given."""
    g = _gen()
    if task == "multiclass":
        extra, batch = ((3,) if samplewise else ()), (5 if labels else 6)  # labels: see _mc_row
        preds = torch.randn(batch, 5, *extra, generator=g)
        target = torch.randint(0, 5, (batch, *extra), generator=g)
        if labels:
            preds = preds.argmax(dim=1)
    else:
        shape = (6,) if task == "binary" else (6, 3)
        preds, target = torch.rand(shape, generator=g), torch.randint(0, 2, shape, generator=g)
    if ignore is not None:
        target[::3] = ignore
    return preds, target


def _cls_row(cls: str, name: str = "", doc: str = "", inputs: Optional[Callable[[], tuple]] = None,
             **kwargs: Any) -> Row:
    """A row of ``torchmetrics.classification.<cls>(**kwargs)`` (validate_args=False unless given)."""
    task = "binary" if cls.startswith("Binary") else "multilabel" if cls.startswith("Multilabel") else "multiclass"
    kwargs.setdefault("validate_args", False)
    if task == "multiclass":
        kwargs.setdefault("num_classes", 5)
    elif task == "multilabel":
        kwargs.setdefault("num_labels", 3)
    if inputs is None:
        samplewise, ignore = kwargs.get("multidim_average") == "samplewise", kwargs.get("ignore_index")
        labels = bool(kwargs["validate_args"]) and task == "multiclass"  # see _mc_row

        def inputs() -> tuple:
            return _classification_inputs(task, samplewise, ignore, labels)

    shown = ", ".join(f"{k}={v}" for k, v in kwargs.items() if k not in ("num_classes", "num_labels"))
    return Row(name or cls, lambda: [(_resolve(f"{CLS}:{cls}")(**kwargs), inputs(), {})], (f"{CLS}:{cls}",),
               doc=doc or shown)


def _multiclass_grid() -> Tuple[Row, ...]:
    """MulticlassStatScores over average x top_k x multidim_average x ignore_index: every update branch."""
    rows = []
    for ignore in (None, 0):
        for average in ("micro", "macro", "none"):
            for top_k in (1, 2):
                for multidim in ("global", "samplewise"):
                    name = f"MulticlassStatScores ({average}, top_k={top_k}, {multidim}" + \
                        (f", ignore_index={ignore})" if ignore is not None else ")")
                    rows.append(_cls_row("MulticlassStatScores", name, average=average, top_k=top_k,
                                         multidim_average=multidim, ignore_index=ignore))
    return tuple(rows)


_CLS_NAMES = ("Accuracy", "Precision", "Recall", "F1Score", "StatScores")


def _helper(name: str, target: str, args: Callable[[], tuple], kwargs: Optional[dict] = None,
            **options: Any) -> Row:
    return Row(name, lambda: [(_resolve(target), args(), dict(kwargs or {}))], (target,), helper=True, **options)


ROWS: Tuple[Row, ...] = (
    Row("MeanMetric (default weight)", lambda: [(_resolve(f"{TM}:MeanMetric")(), (_values(),), {})],
        (f"{TM}:MeanMetric",), doc="update(value)"),
    Row("MeanMetric (tensor weight)",
        lambda: [(_resolve(f"{TM}:MeanMetric")(), (_values(), torch.rand(8, generator=_gen())), {})],
        (f"{TM}:MeanMetric",), doc="update(value, weight)"),
    Row("MeanMetric (float value)", lambda: [(_resolve(f"{TM}:MeanMetric")(), (3.5,), {})],
        (f"{TM}:MeanMetric",), doc="update(3.5)"),
    Row("SumMetric", lambda: [(_resolve(f"{TM}:SumMetric")(), (_values(),), {})], (f"{TM}:SumMetric",)),
    Row("MaxMetric", lambda: [(_resolve(f"{TM}:MaxMetric")(), (_values(),), {})], (f"{TM}:MaxMetric",)),
    Row("MinMetric", lambda: [(_resolve(f"{TM}:MinMetric")(), (_values(),), {})], (f"{TM}:MinMetric",)),
    Row("CatMetric", lambda: [(_resolve(f"{TM}:CatMetric")(), (_values(),), {})], (f"{TM}:CatMetric",)),
    Row("RunningMean", lambda: [(_resolve(f"{TM}:RunningMean")(window=3), (_values(),), {})],
        (f"{TM}:RunningMean",), doc="window=3"),
    _mc_row("MulticlassAccuracy"),
    _mc_row("MulticlassPrecision"),
    _mc_row("MulticlassRecall"),
    _mc_row("MulticlassF1Score"),
    *(_cls_row(f"Multiclass{n}", f"Multiclass{n} (ignore_index)", ignore_index=0)
      for n in ("Accuracy", "Precision", "Recall", "F1Score")),
    *_multiclass_grid(),
    *(_cls_row(f"{task}{n}") for task in ("Binary", "Multilabel") for n in _CLS_NAMES),
    *(_cls_row(f"{task}ConfusionMatrix") for task in ("Binary", "Multiclass", "Multilabel")),
    _cls_row("BinaryConfusionMatrix", "BinaryConfusionMatrix (ignore_index)", ignore_index=-1),
    _cls_row("MulticlassConfusionMatrix", "MulticlassConfusionMatrix (ignore_index)", ignore_index=0),
    *(_cls_row(f"{task}PrecisionRecallCurve", f"{task}PrecisionRecallCurve (thresholds=10)", thresholds=10)
      for task in ("Binary", "Multiclass", "Multilabel")),
    _cls_row("BinaryAUROC", "BinaryAUROC (thresholds=10)", thresholds=10),
    _cls_row("BinaryPrecisionRecallCurve", "BinaryPrecisionRecallCurve (thresholds=10, ignore_index)",
             thresholds=10, ignore_index=-1),
    _cls_row("MulticlassPrecisionRecallCurve", "MulticlassPrecisionRecallCurve (thresholds=10, ignore_index)",
             thresholds=10, ignore_index=0),
    _cls_row("BinaryCalibrationError"),
    _cls_row("MulticlassCalibrationError"),
    _cls_row("BinaryPrecisionRecallCurve", "BinaryPrecisionRecallCurve (thresholds=None)", thresholds=None),
    _cls_row("BinaryAUROC", "BinaryAUROC (thresholds=None, ignore_index)", thresholds=None, ignore_index=-1),
    _mc_row("MulticlassAccuracy", validate=True, suffix=" (validate_args)"),
    _cls_row("MulticlassAccuracy", "MulticlassAccuracy (validate_args, ignore_index)", validate_args=True,
             ignore_index=0),
    _cls_row("BinaryAccuracy", "BinaryAccuracy (validate_args)", validate_args=True),
    _cls_row("MultilabelAccuracy", "MultilabelAccuracy (validate_args)", validate_args=True),
    Row("MeanSquaredError", lambda: [(_resolve(f"{TM}:MeanSquaredError")(), _regression(), {})],
        (f"{TM}:MeanSquaredError",)),
    Row("MeanAbsoluteError", lambda: [(_resolve(f"{TM}:MeanAbsoluteError")(), _regression(), {})],
        (f"{TM}:MeanAbsoluteError",)),
    _helper("_safe_divide", "torchmetrics.utilities.compute:_safe_divide",
            lambda: (_values(4), torch.rand(4, generator=_gen())), device="cuda:1", doc="on cuda:1"),
    _helper("_cumsum", "torchmetrics.utilities.data:_cumsum", lambda: (_values(),), {"dim": 0},
            device="cuda:1", deterministic=True, doc="deterministic mode, on cuda:1"),
    Row("training step", training_step_calls,
        (f"{TM}:MeanMetric",) + tuple(f"{CLS}:{n}" for n in ("MulticlassAccuracy", "MulticlassPrecision",
                                                             "MulticlassRecall", "MulticlassF1Score")),
        doc=f"MeanMetric(loss) + multiclass Accuracy, Precision, Recall, F1 ({STEP_CLASSES} classes, "
            f"batch {STEP_BATCH}), one update each"),
)

ROW_NAMES: Tuple[str, ...] = tuple(row.name for row in ROWS)


# --- running a row's calls ---------------------------------------------------------------------

def update_all(calls: List[Call]) -> None:
    """Run each call: a metric's ``update``, or the function itself."""
    for target, args, kwargs in calls:
        (target.update if isinstance(target, torch.nn.Module) else target)(*args, **kwargs)


def breaks_of_row(row: Row) -> Breaks:
    """The graph breaks of the row's update (a helper: its call) compiled on the CPU."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            calls = row.build()
            with deterministic(row.deterministic):
                if row.helper:
                    target, args, kwargs = calls[0]
                    return graph_breaks(target, *args, **kwargs)
                return graph_breaks(update_all, calls)
    except Exception as exc:  # noqa: BLE001 - the row's build; never hides the other rows
        return Breaks(error=f"{type(exc).__name__}: {exc}")
