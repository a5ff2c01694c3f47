"""Constructor arguments and generated inputs for the library sweep (:mod:`tmpatch.audit.sweep.run`).

:func:`kwargs_for` gives simple valid constructor arguments for a Metric class (a table
per class name, then a generic fill-in of the parameters the constructor accepts);
:func:`input_candidates` gives, in order, the ``(args, kwargs)`` an ``update()`` of that
class may take (small shapes, sane ranges, fixed seeds); the sweep keeps the first
candidate the release's own ``forward()`` accepts on the CPU. :func:`skip_reason` names
the classes not audited (string inputs, pretrained weights, a factory of other classes).
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, List, Optional, Tuple, Type

import torch

Inputs = Tuple[tuple, dict]


def _gen() -> torch.Generator:
    return torch.Generator().manual_seed(0)


def _randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=_gen())


def _rand(*shape: int) -> torch.Tensor:
    return torch.rand(*shape, generator=_gen())


def _ints(high: int, *shape: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(seed))


# --- skips -------------------------------------------------------------------------------------

#: classes whose inputs are strings (text metrics but Perplexity)
STRING_INPUT_MODULE = "torchmetrics.text"
#: pretrained networks (downloaded weights) or optional packages that are known to be needed
WEIGHTS = ("FrechetInception", "KernelInception", "InceptionScore", "LearnedPerceptual", "PerceptualPath",
           "CLIP", "ARNIQA", "DeepImageStructure", "MemorizationInformed", "BERTScore", "InfoLM",
           "DeepNoiseSuppression", "SpeechReverberation", "PerceptualEvaluationSpeech", "ShortTimeObjective",
           "MeanAveragePrecision", "FeatureShare")
#: factories: ``__new__`` builds the Binary/Multiclass/Multilabel class, audited under its own name
FACTORY_BASES = ("_ClassificationTaskWrapper",)


def skip_reason(cls: type) -> Optional[str]:
    """Why ``cls`` is not audited, or None."""
    name = cls.__name__
    if cls.__module__.startswith(STRING_INPUT_MODULE) and name != "Perplexity":
        return "string inputs"
    if any(word in name for word in WEIGHTS):
        return "needs pretrained weights or an optional package"
    if any(base.__name__ in FACTORY_BASES for base in cls.__mro__[1:]):
        return "task factory: builds the Binary/Multiclass/Multilabel class (audited under that name)"
    if name in ("MetricTracker", "MetricCollection", "CompositionalMetric"):
        return "container of other metrics (needs increment()/keys, not one update)"
    return None


# --- constructor arguments ---------------------------------------------------------------------

CLASSES = 3


def _special_kwargs() -> Dict[str, Callable[[], Dict[str, Any]]]:
    from torchmetrics import MeanSquaredError, SumMetric

    def accuracy() -> Any:
        from torchmetrics.classification import MulticlassAccuracy

        return MulticlassAccuracy(num_classes=CLASSES, average=None, validate_args=False)

    def pit_fn() -> Any:
        from torchmetrics.functional.audio import scale_invariant_signal_distortion_ratio

        return scale_invariant_signal_distortion_ratio

    return {
        "BootStrapper": lambda: {"base_metric": MeanSquaredError(), "num_bootstraps": 2},
        "ClasswiseWrapper": lambda: {"metric": accuracy()},
        "MinMaxMetric": lambda: {"base_metric": MeanSquaredError()},
        "MultioutputWrapper": lambda: {"base_metric": MeanSquaredError(), "num_outputs": 2},
        "MultitaskWrapper": lambda: {"task_metrics": {"a": MeanSquaredError(), "b": accuracy()}},
        "Running": lambda: {"base_metric": SumMetric(), "window": 3},
        "BinaryTargetTransformer": lambda: {"wrapped_metric": MeanSquaredError(), "threshold": 0.5},
        "LambdaInputTransformer": lambda: {"wrapped_metric": MeanSquaredError(), "transform_pred": torch.sigmoid},
        "MetricInputTransformer": lambda: {"wrapped_metric": MeanSquaredError()},
        "PermutationInvariantTraining": lambda: {"metric_func": pit_fn()},
        "PanopticQuality": lambda: {"things": {0, 1}, "stuffs": {2}},
        "ModifiedPanopticQuality": lambda: {"things": {0, 1}, "stuffs": {2}},
        "MultiScaleStructuralSimilarityIndexMeasure": lambda: {"kernel_size": 3, "betas": (0.5, 0.5),
                                                               "data_range": 1.0},
        "RootMeanSquaredErrorUsingSlidingWindow": lambda: {"window_size": 3},
        "FleissKappa": lambda: {"mode": "counts"},
        "ClusterAccuracy": lambda: {"num_classes": CLASSES},
        "MinkowskiDistance": lambda: {"p": 2},
        "KendallRankCorrCoef": lambda: {},
        "LipVertexError": lambda: {"mouth_map": [0, 1, 2]},
        "DiceScore": lambda: {"num_classes": CLASSES, "input_format": "index"},
    }


#: values for the constructor parameters without a default (and those of :data:`ALWAYS`)
GENERIC = {"num_classes": CLASSES, "num_labels": CLASSES, "task": "multiclass", "validate_args": False,
           "data_range": 1.0, "num_outputs": 1, "beta": 1.0, "min_precision": 0.5, "min_recall": 0.5,
           "min_specificity": 0.5, "min_sensitivity": 0.5, "threshold": 0.5, "num_groups": 2}


ALWAYS = ("validate_args", "num_classes", "num_labels")


def kwargs_for(cls: Type[Any]) -> Dict[str, Any]:
    """Constructor keyword arguments for ``cls``: its table entry, then the generic values of
    :data:`GENERIC` for the parameters its ``__init__`` names."""
    special = _special_kwargs().get(cls.__name__)
    kwargs = dict(special()) if special else {}
    try:
        params = inspect.signature(cls.__init__).parameters
    except (TypeError, ValueError):
        return kwargs
    for key, value in GENERIC.items():
        if key in params and key not in kwargs and (
                key in ALWAYS or params[key].default is inspect.Parameter.empty):
            kwargs[key] = value
    return kwargs


# --- inputs ------------------------------------------------------------------------------------

def _binary() -> List[Inputs]:
    return [((_rand(6), _ints(2, 6)), {})]


def _multiclass() -> List[Inputs]:
    return [((_randn(6, CLASSES), _ints(CLASSES, 6)), {}), ((_ints(CLASSES, 6, 4), _ints(CLASSES, 6, 4)), {}),
            ((_ints(CLASSES, 6), _ints(CLASSES, 6)), {})]


def _multilabel() -> List[Inputs]:
    return [((_rand(6, CLASSES), _ints(2, 6, CLASSES)), {})]


def _regression() -> List[Inputs]:
    return [((_randn(8), _randn(8, ).flip(0)), {}), ((_rand(8) + 0.1, _rand(8).flip(0) + 0.1), {}),
            ((_randn(4, 3), _randn(4, 3).flip(0)), {}), ((_rand(4, 3).softmax(1), _rand(4, 3).flip(0).softmax(1)), {}),
            ((_randn(8, 5), _randn(8)), {})]


def _images() -> List[Inputs]:
    return [((_rand(2, 3, 16, 16), _rand(2, 3, 16, 16).flip(0)), {}),
            ((_rand(2, 1, 16, 16), _rand(2, 1, 16, 16).flip(0)), {}),
            ((_rand(2, 3, 16, 16),), {}), ((_rand(2, 3, 32, 32), _rand(2, 3, 32, 32).flip(0)), {}),
            ((_rand(1, 1, 64, 64), _rand(1, 1, 64, 64).flip(0)), {})]


def _audio() -> List[Inputs]:
    return [((_randn(2, 64), _randn(2, 64).flip(0)), {}), ((_randn(2, 2, 64), _randn(2, 2, 64).flip(0)), {}),
            ((_randn(2, 5, 8, 2), _randn(2, 5, 8, 2).flip(0)), {})]


def _retrieval() -> List[Inputs]:
    return [((_rand(8), _ints(2, 8)), {"indexes": _ints(2, 8, seed=2)})]


def _labels() -> List[Inputs]:
    return [((_ints(CLASSES, 6), _ints(CLASSES, 6, seed=2)), {}), ((_randn(6, 2), _ints(CLASSES, 6)), {}),
            ((_ints(4, 6, 3),), {})]


def _segmentation() -> List[Inputs]:
    one_hot = torch.nn.functional.one_hot(_ints(CLASSES, 2, 8, 8), CLASSES).permute(0, 3, 1, 2)
    other = torch.nn.functional.one_hot(_ints(CLASSES, 2, 8, 8, seed=2), CLASSES).permute(0, 3, 1, 2)
    return [((_ints(CLASSES, 2, 8, 8), _ints(CLASSES, 2, 8, 8, seed=2)), {}), ((one_hot, other), {}),
            ((one_hot.bool(), other.bool()), {})]


def _panoptic() -> List[Inputs]:
    preds = torch.stack([_ints(3, 1, 8, 8), _ints(2, 1, 8, 8, seed=3)], dim=-1)
    target = torch.stack([_ints(3, 1, 8, 8, seed=2), _ints(2, 1, 8, 8, seed=4)], dim=-1)
    return [((preds, target), {})]


def _points() -> List[Inputs]:
    return [((_randn(2, 5, 3), _randn(2, 5, 3).flip(0)), {}), ((_randn(2, 4, 5, 3), _randn(2, 4, 5, 3).flip(0)), {})]


SPECIAL_INPUTS: Dict[str, Callable[[], List[Inputs]]] = {
    "BinaryFairness": lambda: [((_rand(6), _ints(2, 6)), {"groups": _ints(2, 6, seed=3)})],
    "BinaryGroupStatRates": lambda: [((_rand(6), _ints(2, 6)), {"groups": _ints(2, 6, seed=3)})],
    "PermutationInvariantTraining": lambda: [((_randn(2, 2, 32), _randn(2, 2, 32).flip(0)), {})],
    "Running": lambda: [((_randn(8),), {})],
    "Perplexity": lambda: [((_randn(2, 4, 5), _ints(5, 2, 4)), {})],
    "MultitaskWrapper": lambda: [(({"a": _randn(6), "b": _randn(6, CLASSES)},
                                   {"a": _randn(6).flip(0), "b": _ints(CLASSES, 6)}), {})],
    "MultioutputWrapper": lambda: [((_randn(6, 2), _randn(6, 2).flip(0)), {})],
    "ClasswiseWrapper": _multiclass,
    "FleissKappa": lambda: [((_ints(4, 6, 3),), {})],
    "PanopticQuality": _panoptic,
    "ModifiedPanopticQuality": _panoptic,
    "SpatialDistortionIndex": lambda: [((_rand(2, 3, 16, 16), {"ms": _rand(2, 3, 8, 8), "pan": _rand(2, 3, 16, 16),
                                                                 "pan_lr": _rand(2, 3, 8, 8)}),
                                        {})],
    "QualityWithNoReference": lambda: [((_rand(2, 3, 16, 16), {"ms": _rand(2, 3, 8, 8), "pan": _rand(2, 3, 16, 16),
                                                                 "pan_lr": _rand(2, 3, 8, 8)}),
                                        {})],
}

FAMILIES: Tuple[Tuple[str, Callable[[], List[Inputs]]], ...] = (
    ("torchmetrics.retrieval", _retrieval),
    ("torchmetrics.nominal", _labels),
    ("torchmetrics.clustering", _labels),
    ("torchmetrics.segmentation", _segmentation),
    ("torchmetrics.detection", _panoptic),
    ("torchmetrics.image", _images),
    ("torchmetrics.audio", _audio),
    ("torchmetrics.multimodal", _points),
    ("torchmetrics.shape", _points),
    ("torchmetrics.aggregation", lambda: [((_randn(8),), {})]),
)


def input_candidates(cls: type, metric: Any) -> List[Inputs]:
    """The ``(args, kwargs)`` an ``update()`` of ``metric`` (a ``cls``) may take, best first."""
    name = cls.__name__
    if name in SPECIAL_INPUTS:
        return SPECIAL_INPUTS[name]()
    if name.startswith("Binary"):
        return _binary() + _regression()
    if name.startswith("Multilabel"):
        return _multilabel()
    if name.startswith("Multiclass") or name == "Dice":
        return _multiclass()
    for prefix, make in FAMILIES:
        if cls.__module__.startswith(prefix):
            return make()
    if cls.__module__.startswith("torchmetrics.wrappers"):
        return _regression() + _multiclass()
    return _regression() + _labels()
