"""pearson_update: PearsonCorrCoef and ConcordanceCorrCoef decide their update's branch without reading the device.

Defect: before 1.7.4, ``_pearson_corrcoef_update`` starts with ``cond = num_prior.mean() > 0
or num_obs == 1`` (``n_prior.mean() > 0`` before 1.1.1) and runs ``if cond:`` twice: a
Python ``or`` / ``if`` on a device value, one read on every ``update()`` of
PearsonCorrCoef and ConcordanceCorrCoef. Fixed upstream in 1.7.4 (a new update without
the branch).

Repair: the branch stays the release's; what changes is how its condition is known. The
patch keeps, for each metric, what it knows of its count state ``n_total`` (and of that
state's registered default): which tensor it is, its version counter (bumped by every
in-place change), whether ``n_total.mean() > 0`` and whether every count is zero. When the
metric's ``n_total`` is the same tensor at the same version, the condition is known on the
host. It is learned without a read:

* at construction (``PearsonCorrCoef.__init__``): the release registers zeros;
* across ``Module._apply`` with a function that moves or casts values unchanged (``.to()``,
  ``.cuda()``, ``.cpu()``, ``.float()``, ...; ``spec.VALUE_MOVE``): zeros stay zeros. Counts
  on the CPU before the move (a copy or a load made there) are read from their bytes, free;
* at ``reset()``: the counts become a copy of the default, zeros while the default is
  the one known;
* in ``forward()``: the states it saves before the batch's own update (copies, from 1.4.0:
  ``Metric._copy_state_dict``) and puts back after it are the counts known (the last three
  count tensors of a metric are remembered);
* after each update: the counts are the old ones plus the batch size, so counts with a
  positive mean keep one, and all-zero counts hold the batch size everywhere.

Otherwise (a load, a merge, a sync or a copy on the device, a move by another function) the
first update reads the condition once, with whether the counts are all zero, in one transfer. Results
are the release's bit for bit (the condition is the release's, by proof or by reading it).
The functional API reads as the release does.

Releases: 1.0.0-1.7.3 patched (five implementations of ``_pearson_corrcoef_update``, one of
the class ``update`` and of its ``__init__``, two of ``Metric._apply``, ``Metric.reset`` and
``Metric._copy_state_dict``); 1.7.4+ not needed.
"""
from __future__ import annotations

import sys
import weakref
from types import ModuleType
from typing import Any, Callable, Dict, List, Optional, Tuple

from tmpatch.compiled import ContextSlot
from tmpatch.spec import PATCHED, Edit, Label, Patch, Rewrite, Target, UPSTREAM, VALUE_MOVE, Variant, since, span

_CLASS_MODULE = "torchmetrics.regression.pearson"

#: the functions ``torch.nn.Module`` gives ``_apply`` that move or cast each tensor, values unchanged
#: (``to_empty`` and ``share_memory`` not among them)
_MOVES = frozenset(f"Module.{name}.<locals>.<lambda>" for name in (
    "cuda", "cpu", "xpu", "ipu", "mtia", "type", "float", "double", "half", "bfloat16")) | {"Module.to.<locals>.convert"}


class _Counts:
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
_current = ContextSlot("tmpatch_pearson")  # a ContextVar; a plain slot while torch.compile traces

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


def _counts_known(metric: Any) -> _Counts:
    """What is known of the metric's current ``n_total`` (nothing, if it is none of the tensors
    learned, or changed since)."""
    entry = _facts(metric)
    counts = getattr(metric, "n_total", None)
    if entry is not None:
        for ref, version, positive, zeros in entry.counts:
            if ref() is counts:
                return _Counts(positive, zeros) if _version(counts) == version else _Counts(None, None)
    return _Counts(None, None)


_CURRENT = object()


def _learn(metric: Any, positive: Optional[bool], zeros: Optional[bool], counts: Any = _CURRENT) -> None:
    """Record what holds for ``counts`` (default: the metric's current ``n_total``) at its version;
    ``positive`` None: nothing (what was recorded of it goes)."""
    if counts is _CURRENT:
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


def _default(metric: Any) -> Any:
    defaults = getattr(metric, "_defaults", None)
    return defaults.get("n_total") if isinstance(defaults, dict) else None


def _default_zero(metric: Any) -> bool:
    entry = _facts(metric)
    return entry is not None and _same(entry.default, entry.default_version, _default(metric))


def _learn_default_zero(metric: Any) -> None:
    default = _default(metric)
    version = _version(default) if default is not None else None
    entry = _facts(metric, create=version is not None)
    if entry is not None:
        entry.default, entry.default_version = (weakref.ref(default), version) if version is not None else (None, None)


def _pearson(metric: Any) -> bool:
    module = sys.modules.get(_CLASS_MODULE)
    cls = getattr(module, "PearsonCorrCoef", None)
    return cls is not None and isinstance(metric, cls)


def build_init(module: ModuleType) -> Callable[..., Any]:
    """``PearsonCorrCoef.__init__``: the release registers ``n_total`` as zeros (its default too)."""

    def __init__(original: Callable, self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        counts = getattr(self, "n_total", None)
        if getattr(counts, "ndim", None) == 1 and counts.shape[0] > 0:  # zeros(num_outputs), as registered
            _learn(self, False, True)
            _learn_default_zero(self)

    return __init__


def _moves_values(fn: Any) -> bool:
    if getattr(fn, VALUE_MOVE, False) is True:
        return True
    return getattr(fn, "__module__", None) == "torch.nn.modules.module" and getattr(fn, "__qualname__", None) in _MOVES


def _cpu_zeros(t: Any, tensor_type: type) -> bool:
    """Whether ``t`` is a plain CPU tensor (a few elements, contiguous) whose every element is +0,
    read from its bytes: no torch op, so no dispatch mode (a profiler, the audit's simulation) sees
    or changes the read, and nothing waits for a device."""
    if type(t) is not tensor_type or t.device.type != "cpu" or not 0 < t.numel() <= 1024 or not t.is_contiguous():
        return False
    size = t.element_size()
    start = t.storage_offset() * size
    storage = t.untyped_storage()
    return not any(storage[i] for i in range(start, start + t.numel() * size))


def build_apply(module: ModuleType) -> Callable[..., Any]:
    """``Metric._apply``: zero counts and a zero default stay known across a move or cast (counts
    on the CPU, a copy or a load there, are read first: free)."""
    import torch

    tensor_type = torch.Tensor

    def _apply(original: Callable, self: Any, *args: Any, **kwargs: Any) -> Any:
        if not _pearson(self):
            return original(self, *args, **kwargs)
        zeros = _counts_known(self).zeros
        if zeros is None:
            zeros = _cpu_zeros(getattr(self, "n_total", None), tensor_type)
        default_zero = _default_zero(self) or _cpu_zeros(_default(self), tensor_type)
        result = original(self, *args, **kwargs)
        if _moves_values(args[0] if args else kwargs.get("fn")):
            if zeros:
                _learn(self, False, True)
            if default_zero:
                _learn_default_zero(self)
        return result

    return _apply


def build_copy_state(module: ModuleType) -> Callable[..., Any]:
    """``Metric._copy_state_dict`` (``forward()`` saves the states in it, and puts them back after
    the batch's update): the copy of known counts is known."""

    def _copy_state_dict(original: Callable, self: Any, *args: Any, **kwargs: Any) -> Any:
        cache = original(self, *args, **kwargs)
        if _pearson(self) and isinstance(cache, dict):
            known = _counts_known(self)
            if known.positive is not None and cache.get("n_total") is not None:
                _learn(self, known.positive, known.zeros, counts=cache["n_total"])
        return cache

    return _copy_state_dict


def build_reset(module: ModuleType) -> Callable[..., Any]:
    """``Metric.reset``: the counts are a copy of the default, zeros while the default is the one known."""

    def reset(original: Callable, self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        if _pearson(self) and _default_zero(self):
            _learn(self, False, True)
        return result

    return reset


def build_update(module: ModuleType) -> Callable[..., Any]:
    """``PearsonCorrCoef.update``: the condition known from what was learned, learned for the next."""

    def update(original: Callable, self: Any, *args: Any, **kwargs: Any) -> Any:
        state = _counts_known(self)
        token = _current.set(state)
        try:
            result = original(self, *args, **kwargs)
        finally:
            _current.reset(token)
        _learn(self, state.after, state.after_zeros)
        return result

    return update


def _names(module: ModuleType) -> Dict[str, Any]:
    import torch

    int64 = torch.int64

    def prior_positive(num_prior: Any, preds: Any) -> Any:
        """The release's ``num_prior.mean() > 0``: a host bool when the class update knows it (or
        has it read, with whether the counts are all zero, in one transfer), else the release's tensor."""
        state = _current.get()
        if state is None:
            return num_prior.mean() > 0
        zeros = state.zeros
        if state.positive is None:  # one read: 2 * (mean > 0) + (all zero)
            code = int(((num_prior.mean() > 0).to(int64) * 2 + (num_prior == 0).all().to(int64)).item())
            state.positive, zeros = code >= 2, bool(code & 1)
        num_obs = preds.shape[0] if preds.dim() else 1
        if state.positive:
            state.after, state.after_zeros = True, False  # every count grows by num_obs >= 0: the mean stays positive
        elif zeros and num_prior.numel():
            state.after, state.after_zeros = num_obs > 0, num_obs == 0  # every count is num_obs
        return state.positive

    return {"_tmpatch_prior_positive": prior_positive}


def _edit(prior: str, obs: Optional[str]) -> Rewrite:
    tail = f" or {obs} == 1" if obs else ""
    return Rewrite((Edit(f"cond = {prior}.mean() > 0{tail}", f"cond = _tmpatch_prior_positive({prior}, preds){tail}"),),
                   _names)


_FUNCTIONAL = "torchmetrics.functional.regression.pearson"
_METRIC = "torchmetrics.metric"

PATCH = Patch(
    name="pearson_update",
    summary="PearsonCorrCoef and ConcordanceCorrCoef read num_prior.mean() > 0 on each update() (before 1.7.4); "
            "the condition is known on the host (from construction, reset, moves and the previous update)",
    known=since("1.0.0"),
    upstream="fixed upstream in 1.7.4 (an update without the branch)",
    labels=(
        Label(UPSTREAM, "Pearson/Concordance read num_prior.mean() > 0 to choose the update's formulas (fixed upstream "
              "in 1.7.4); the pearson_update patch knows it on the host after the first update of a state",
              function="_pearson_corrcoef_update", op="aten._local_scalar_dense", patch="pearson_update"),
        Label(PATCHED, "pearson_update: the one read of a count state the patch does not know (first update after "
              "a load, a merge, a sync, a copy or a move by a function other than .to()/.cuda()/...)",
              function="prior_positive"),
    ),
    targets=(
        Target(module=_FUNCTIONAL, qualname="_pearson_corrcoef_update", variants=(
            Variant(span("1.0.0", "1.1.0"), "41180abb19e18973", _edit("n_prior", None)),
            Variant(span("1.1.1", "1.1.2"), "8f2b1c4c75615d9f", _edit("n_prior", "n_obs")),
            Variant(span("1.2.0", "1.3.1"), "c5aedc06ba88923d", _edit("num_prior", "num_obs")),
            Variant(span("1.3.2", "1.5.2"), "0b2a947df1194fe3", _edit("num_prior", "num_obs")),  # dtype of the means
            Variant(span("1.6.0", "1.7.3"), "919ed8b6ba7b5084", _edit("num_prior", "num_obs")),  # annotations
            Variant(span("1.7.4", "1.9.0"), "545b85c1bdb96f65"),  # no branch
        )),
        Target(module=_CLASS_MODULE, qualname="PearsonCorrCoef.update", variants=(
            Variant(span("1.0.0", "1.7.3"), "8d020a8637c87962", build_update),
            Variant(span("1.7.4", "1.9.0"), "6ba256c072d72b0e"),
        )),
        Target(module=_CLASS_MODULE, qualname="PearsonCorrCoef.__init__", variants=(
            Variant(span("1.0.0", "1.7.3"), "47872fd86cbb4e32", build_init),
            Variant(span("1.7.4", "1.9.0"), "581c7b29ceb7a50e"),
        )),
        # the base class's, shared with every metric: needed where the release's update has the branch
        Target(module=_METRIC, qualname="Metric._apply", variants=(
            Variant(span("1.0.0", "1.2.1"), "230dda1bf62c7927", build_apply),
            Variant(span("1.3.0.post0", "1.7.3"), "232b818f8abf487b", build_apply),
        ), present=span("1.0.0", "1.7.3"), shared=True),
        Target(module=_METRIC, qualname="Metric._copy_state_dict", variants=(  # 1.4.0+: forward() saves copies
            Variant(span("1.4.0", "1.5.2"), "73e63836d7516ab5", build_copy_state),
            Variant(span("1.6.0", "1.7.3"), "6961ae938cd19538", build_copy_state),  # annotations
        ), present=span("1.4.0", "1.7.3"), shared=True),
        Target(module=_METRIC, qualname="Metric.reset", variants=(
            Variant(span("1.0.0", "1.3.2"), "718dd05530d14777", build_reset),
            Variant(span("1.4.0", "1.7.3"), "26a400138ffbd9ed", build_reset),
        ), present=span("1.0.0", "1.7.3"), shared=True),
    ),
)
