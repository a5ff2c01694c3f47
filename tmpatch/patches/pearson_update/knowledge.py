"""What pearson_update knows of a metric's count state ``n_total`` without reading it: per
metric, its last few count tensors (weakly) with their version counters and what holds for
each (mean > 0, all zero), and its registered default while that is known zero."""
from __future__ import annotations

import sys
import weakref
from typing import Any, Dict, List, Optional, Tuple, Type

from tmpatch.runtime.compiled import ContextSlot
from tmpatch.spec import VALUE_MOVE

CLASS_MODULE = "torchmetrics.regression.pearson"

#: the functions ``torch.nn.Module`` gives ``_apply`` that move or cast each tensor, values unchanged
#: (``to_empty`` and ``share_memory`` not among them)
_MOVES = frozenset(f"Module.{name}.<locals>.<lambda>" for name in (
    "cuda", "cpu", "xpu", "ipu", "mtia", "type", "float", "double", "half",
    "bfloat16")) | {"Module.to.<locals>.convert"}


class Counts:
    """What one update knows of ``n_total`` before it (``positive``: mean > 0; ``zeros``: all
    zero), and after it (``after``, ``after_zeros``)."""

    __slots__ = ("positive", "zeros", "after", "after_zeros")

    def __init__(self, positive: Optional[bool], zeros: Optional[bool]) -> None:
        self.positive = positive
        self.zeros = zeros
        self.after: Optional[bool] = None
        self.after_zeros: Optional[bool] = None


class _Facts:
    """What the patch knows of one metric: of its last few count tensors (weakly), each one's
    version and what holds for it at that version (``positive``, ``zeros``); and the registered
    default's tensor and version while it is known zero."""

    __slots__ = ("metric", "counts", "default", "default_version")

    def __init__(self, metric: "weakref.ref[Any]") -> None:
        self.metric = metric
        self.counts: List[Tuple[Any, int, bool, Optional[bool]]] = []
        self.default: Any = None
        self.default_version: Optional[int] = None


#: count tensors remembered per metric: the state, and forward()'s saved copy of it besides the batch's
_KEPT = 3


#: the counts of the update running in this thread / task (set by the class update)
current = ContextSlot("tmpatch_pearson")  # a ContextVar; a plain slot while torch.compile traces

#: id(metric) -> its facts. Keyed by id: a Metric's ``==`` builds a CompositionalMetric, so metrics
#: cannot be dictionary keys
_known: Dict[int, _Facts] = {}


def _forget(key: int, metric: "weakref.ref[Any]") -> None:
    entry = _known.get(key)
    if entry is not None and entry.metric is metric:
        del _known[key]


def _version(t: Any) -> Optional[int]:
    try:
        return int(t._version)
    except (AttributeError, RuntimeError):  # e.g. an inference-mode tensor: no version counter
        return None


def _facts(metric: Any, create: bool = False) -> Optional[_Facts]:
    entry = _known.get(id(metric))
    if entry is not None and entry.metric() is metric:
        return entry
    if not create:
        return None
    ref = weakref.ref(metric)
    weakref.finalize(metric, _forget, id(metric), ref)
    entry = _known[id(metric)] = _Facts(ref)
    return entry


def _same(held: Any, version: Optional[int], t: Any) -> bool:
    """Whether ``t`` is the tensor ``held`` (a weak reference) refers to, at ``version``."""
    return held is not None and held() is t and version is not None and _version(t) == version


def counts_known(metric: Any) -> Counts:
    """What is known of the metric's current ``n_total`` (nothing, if it is none of the tensors
    learned, or changed since)."""
    entry = _facts(metric)
    counts = getattr(metric, "n_total", None)
    if entry is not None:
        for ref, version, positive, zeros in entry.counts:
            if ref() is counts:
                return Counts(positive, zeros) if _version(counts) == version else Counts(None, None)
    return Counts(None, None)


def learn(metric: Any, positive: Optional[bool], zeros: Optional[bool], counts: Any = None) -> None:
    """Record what holds for ``counts`` (None: the metric's current ``n_total``) at its version;
    ``positive`` None: nothing (what was recorded of it goes)."""
    if counts is None:
        counts = getattr(metric, "n_total", None)
    version = _version(counts) if positive is not None and counts is not None else None
    entry = _facts(metric, create=version is not None)
    if entry is None:
        return
    kept = [k for k in entry.counts if k[0]() is not None and k[0]() is not counts]
    if version is not None:
        assert positive is not None
        kept.insert(0, (weakref.ref(counts), version, positive, zeros))
    entry.counts = kept[:_KEPT]


def default_of(metric: Any) -> Any:
    defaults = getattr(metric, "_defaults", None)
    return defaults.get("n_total") if isinstance(defaults, dict) else None


def default_zero(metric: Any) -> bool:
    entry = _facts(metric)
    return entry is not None and _same(entry.default, entry.default_version, default_of(metric))


def learn_default_zero(metric: Any) -> None:
    default = default_of(metric)
    version = _version(default) if default is not None else None
    entry = _facts(metric, create=version is not None)
    if entry is not None:
        entry.default, entry.default_version = (weakref.ref(default), version) if version is not None else (None, None)


def is_pearson(metric: Any) -> bool:
    module = sys.modules.get(CLASS_MODULE)
    cls = getattr(module, "PearsonCorrCoef", None)
    return cls is not None and isinstance(metric, cls)


def moves_values(fn: Any) -> bool:
    if getattr(fn, VALUE_MOVE, False) is True:
        return True
    return getattr(fn, "__module__", None) == "torch.nn.modules.module" and getattr(fn, "__qualname__", None) in _MOVES


def cpu_zeros(t: Any, tensor_type: Type[Any]) -> bool:
    """Whether ``t`` is a plain CPU tensor (a few elements, contiguous) whose every element is +0,
    read from its bytes: no torch op, so no dispatch mode (a profiler, the audit's simulation) sees
    or changes the read, and nothing waits for a device."""
    if type(t) is not tensor_type or not t.is_cpu or not 0 < t.numel() <= 1024 or not t.is_contiguous():
        return False
    size = t.element_size()
    start = t.storage_offset() * size
    storage = t.untyped_storage()
    return not any(storage[i] for i in range(start, start + t.numel() * size))
