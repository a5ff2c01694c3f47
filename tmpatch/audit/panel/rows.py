"""The rows of the built-in audit panel (:mod:`tmpatch.audit.panel.run`).

Each :class:`Row` names a call (``update`` of one metric or of the five metrics of a
training step, or one torchmetrics helper) and builds it from scratch, with fixed seeds.
"""
from __future__ import annotations

import importlib
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

from tmpatch.audit.modes import deterministic
from tmpatch.audit.oracle.breaks import Breaks, graph_breaks

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


# --- the rows of patches not in force ------------------------------------------------------------

def _ints(high: int, *shape: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(seed))


def _one_hot(classes: int = 3, seed: int = 1) -> torch.Tensor:
    return torch.nn.functional.one_hot(_ints(classes, 2, 8, 8, seed=seed), classes).permute(0, 3, 1, 2)


def _images(*shape: int) -> Tuple[torch.Tensor, torch.Tensor]:
    return torch.rand(*shape, generator=_gen()), torch.rand(*shape, generator=torch.Generator().manual_seed(1))


def _metric_row(name: str, where: str, make: Callable[[], dict], inputs: Callable[[], Tuple[tuple, dict]],
                doc: str = "") -> Row:
    """A row of ``where`` (``module:Class``) built with ``make()``'s keywords, updated with ``inputs()``."""
    def build() -> List[Call]:
        args, kwargs = inputs()
        return [(_resolve(where)(**make()), args, kwargs)]

    return Row(name, build, (where,), doc=doc)


def _panoptic() -> Tuple[tuple, dict]:
    preds = torch.stack([_ints(3, 1, 8, 8), _ints(2, 1, 8, 8, seed=3)], dim=-1)
    target = torch.stack([_ints(3, 1, 8, 8, seed=2), _ints(2, 1, 8, 8, seed=4)], dim=-1)
    return (preds, target), {}


def _si_sdr() -> Any:
    return _resolve("torchmetrics.functional.audio:scale_invariant_signal_distortion_ratio")


_IMAGE, _SEG, _AUDIO = "torchmetrics.image", "torchmetrics.segmentation", "torchmetrics.audio"

#: rows that show what a patch repairs where the default rows do not: the default panel adds a patch's
#: rows (:data:`WITNESSES`) where the patch is not in force, so that its totals show what is lost
PATCH_ROWS: Tuple[Row, ...] = (
    _metric_row("RetrievalMAP", f"{TM}:RetrievalMAP", dict,
                lambda: ((torch.rand(8, generator=_gen()), _ints(2, 8)), {"indexes": _ints(2, 8, seed=2)})),
    _metric_row("CramersV", "torchmetrics.nominal:CramersV", lambda: {"num_classes": 3},
                lambda: ((_ints(3, 6), _ints(3, 6, seed=2)), {}), doc="num_classes=3"),
    # as many groups as rows: simulated torch.unique keeps every element (as _mc_row's batch of 5)
    _metric_row("BinaryFairness", f"{CLS}:BinaryFairness", lambda: {"num_groups": 6, "validate_args": False},
                lambda: ((torch.rand(6, generator=_gen()), _ints(2, 6)), {"groups": _ints(6, 6, seed=3)}),
                doc="num_groups=6, validate_args=False"),
    _metric_row("BinaryHingeLoss", f"{CLS}:BinaryHingeLoss", lambda: {"validate_args": False},
                lambda: ((torch.rand(6, generator=_gen()), _ints(2, 6)), {}), doc="validate_args=False"),
    _metric_row("LogCoshError", f"{TM}:LogCoshError", dict, lambda: (_regression(), {})),
    _metric_row("PeakSignalNoiseRatio", f"{_IMAGE}:PeakSignalNoiseRatio", lambda: {"data_range": 1.0},
                lambda: (_images(2, 3, 8, 8), {}), doc="data_range=1.0"),
    _metric_row("StructuralSimilarityIndexMeasure", f"{_IMAGE}:StructuralSimilarityIndexMeasure", dict,
                lambda: (_images(1, 2, 12, 12), {}), doc="data_range=None"),
    _metric_row("VisualInformationFidelity", f"{_IMAGE}:VisualInformationFidelity", dict,
                lambda: (_images(1, 1, 41, 41), {})),
    _metric_row("GeneralizedDiceScore", f"{_SEG}:GeneralizedDiceScore", lambda: {"num_classes": 3},
                lambda: ((_one_hot(), _one_hot(seed=2)), {}), doc="num_classes=3, one-hot"),
    _metric_row("MeanIoU", f"{_SEG}:MeanIoU", lambda: {"num_classes": 3},
                lambda: ((_one_hot(), _one_hot(seed=2)), {}), doc="num_classes=3, one-hot"),
    _metric_row("HausdorffDistance", f"{_SEG}:HausdorffDistance", lambda: {"num_classes": 3},
                lambda: ((_one_hot(), _one_hot(seed=2)), {}), doc="num_classes=3, one-hot"),
    _metric_row("Perplexity (ignore_index)", "torchmetrics.text:Perplexity", lambda: {"ignore_index": 0},
                lambda: ((torch.randn(2, 4, 5, generator=_gen()), _ints(5, 2, 4)), {}), doc="ignore_index=0"),
    _metric_row("MultioutputWrapper", "torchmetrics.wrappers:MultioutputWrapper",
                lambda: {"base_metric": _resolve(f"{TM}:MeanSquaredError")(), "num_outputs": 2, "remove_nans": False},
                lambda: ((torch.randn(6, 2, generator=_gen()), torch.randn(6, 2)), {}),
                doc="MeanSquaredError, num_outputs=2, remove_nans=False"),
    _metric_row("PanopticQuality", "torchmetrics.detection:PanopticQuality",
                lambda: {"things": {0, 1}, "stuffs": {2}}, _panoptic, doc="things={0, 1}, stuffs={2}"),
    _metric_row("PearsonCorrCoef", f"{TM}:PearsonCorrCoef", dict, lambda: (_regression(), {})),
    _metric_row("Dice", f"{TM}:Dice", lambda: {"num_classes": 5}, lambda: (_multiclass(5, 6), {}),
                doc="num_classes=5 (the legacy Dice, to 1.6.3)"),
    _metric_row("TweedieDevianceScore (power=2)", f"{TM}:TweedieDevianceScore", lambda: {"power": 2.0},
                lambda: ((torch.rand(8, generator=_gen()) + 0.1, torch.rand(8) + 0.1), {}), doc="power=2.0"),
    _metric_row("PermutationInvariantTraining", f"{_AUDIO}:PermutationInvariantTraining",
                lambda: {"metric_func": _si_sdr(), "eval_func": "max"},
                lambda: ((torch.randn(2, 2, 32, generator=_gen()), torch.randn(2, 2, 32)), {}),
                doc="scale-invariant SDR, 2 speakers"),
    _metric_row("SignalDistortionRatio", f"{_AUDIO}:SignalDistortionRatio", lambda: {"filter_length": 8},
                lambda: ((torch.randn(2, 64, generator=_gen()), torch.randn(2, 64)), {}), doc="filter_length=8"),
)

#: for each patch, the rows (of :data:`ROWS` or :data:`PATCH_ROWS`) whose syncs it removes
WITNESSES: Dict[str, Tuple[str, ...]] = {
    "deferred_reports": ("training step",),  # the reports the others defer: NaN values, classes out of range
    "safe_divide": ("_safe_divide",),
    "cumsum_device": ("_cumsum",),
    "mean_default_weight": ("MeanMetric (default weight)",),
    "nan_check": ("SumMetric",),
    "bincount": ("MulticlassAccuracy",),
    "retrieval_check": ("RetrievalMAP",),
    "nominal_bincount": ("CramersV",),
    "fairness_groups": ("BinaryFairness",),
    "classification_masks": ("BinaryHingeLoss",),
    "vif_masks": ("VisualInformationFidelity",),
    "dice_weights": ("GeneralizedDiceScore",),
    "perplexity_mask": ("Perplexity (ignore_index)",),
    "logits_check": ("BinaryAccuracy",),
    "scalar_tensors": ("LogCoshError", "BinaryHingeLoss"),
    "image_constants": ("PeakSignalNoiseRatio", "StructuralSimilarityIndexMeasure", "VisualInformationFidelity"),
    "wrapper_indices": ("MultioutputWrapper",),
    "panoptic_preprocess": ("PanopticQuality",),
    "panoptic_matching": ("PanopticQuality",),
    "edge_distances": ("HausdorffDistance",),
    "pearson_update": ("PearsonCorrCoef",),
    "segmentation_format": ("MeanIoU", "GeneralizedDiceScore"),
    "legacy_dice_checks": ("Dice",),
    "tweedie_checks": ("TweedieDevianceScore (power=2)",),
    "pit_permutations": ("PermutationInvariantTraining",),
    "sdr_solve": ("SignalDistortionRatio",),
}

#: the patches whose repair no panel row can count, and why
UNMEASURED: Dict[str, str] = {
    "gather_autograd": "it keeps the autograd graph of a state gathered across ranks, no sync the panel counts",
    "coalesced_sync": "it syncs states across ranks in fewer collectives; the panel runs one process",
    "compiled_update": "it shows in compiled code: tmpatch audit --graph-breaks, or --step with a compiled step",
    "update_bookkeeping": "it saves host time only (benchmarks/update_host_time.py)",
}

PATCH_ROW_NAMES: Tuple[str, ...] = tuple(row.name for row in PATCH_ROWS)


# --- running a row's calls ---------------------------------------------------------------------

def update_all(calls: List[Call]) -> None:
    """Run each call: a metric's ``update``, or the function itself (``nn.Module`` types its attributes as
    tensors or modules: a type checker cannot see ``update`` is callable)."""
    for target, args, kwargs in calls:
        (target.update if isinstance(target, torch.nn.Module) else target)(*args, **kwargs)  # type: ignore[operator]  # see below


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
