"""nan_check: the aggregators' NaN check without a device read during ``update()``.

Defect: ``BaseAggregator._cast_and_nan_check_input`` runs
``if nans.any() or nans_weight.any():`` on every ``update()`` of SumMetric,
MeanMetric, MaxMetric, MinMetric, CatMetric and the Running wrappers
(RunningMean, RunningSum): a device-to-host read per step, on every release.
Its ``ignore``/``warn`` paths filter with a boolean mask (a data-dependent
shape, a second sync) and its imputation writes into the caller's tensors.
Python scalars (``update(3.5)``) are copied from the host. Not fixed upstream;
1.6.2 added the opt-out ``nan_strategy="disable"``.

Releases: 1.0.0-1.9.0, six implementations of the check (1.0.0 | 1.0.1-1.2.0 |
1.2.1-1.3.1 | 1.3.2-1.5.2 | 1.6.0-1.6.1 | 1.6.2-1.9.0). Besides the check the
patch wraps ``BaseAggregator.__init__`` (attaches a device-side record,
:mod:`tmpatch.deferred`) and the ``compute`` of BaseAggregator, MeanMetric,
CatMetric and ``Running`` (report the record). Subclasses of BaseAggregator
other than the five aggregators (an ``update`` or ``compute`` of their own)
keep the release's code.

Behaviour (policy ``tmpatch.apply(nan_check=...)`` / ``TMPATCH_NAN_CHECK``:
``deferred``, the default; ``eager``; ``off``):

* float: NaN elements imputed with ``torch.where``; an imputed element gets
  weight 1, the other elements keep the user's weight.
* ``ignore``/``warn``/``error``: NaN elements are neutralised (Sum 0, Mean
  weight 0, Max -inf, Min +inf): the state ends as after their removal, with
  no sync. CatMetric still removes them (its output shape depends on the data:
  one inherent sync). ``warn``/``error`` are given at the user's next
  ``compute()`` (``deferred``), not inside ``forward()``, consistently on every
  rank in DDP; during ``update()`` (``eager``, with the sync, as upstream); or
  not at all (``off``). A metric built before ``apply()`` reports eagerly.
* ``disable`` (1.6.2+): no check; the user's weight is honoured.

Deliberate corrections (all releases unless noted): the caller's value and
weight tensors are never written into; an imputed element gets weight 1 and
the others keep theirs (upstream: up to 1.6.1 the weight of the *whole batch*
becomes the imputed value, a NaN mean with ``nan_strategy=0.0`` and the
default weight; 1.6.2+ the whole batch's weight collapses to 1); imputation is
done in the metric's dtype, not the input's; ``disable`` keeps a user-supplied
weight (upstream issue #3434); warn/error come at ``compute()`` under the
default policy; Python scalars are made on the metric's device.
"""
from __future__ import annotations

import functools
import logging
import math
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, Dict, Optional, Tuple

from tmpatch import deferred, settings
from tmpatch.spec import INHERENT, Label, PATCHED, Patch, Target, Variant, since, span

log = logging.getLogger("tmpatch")

#: the record of NaN elements seen since the last report (a metric state)
RECORD = deferred.Record("nan")

_AGGREGATION = "torchmetrics.aggregation"
_REPORTED = ("warn", "error")
_NEUTRAL = {"sum": 0.0, "mean": 0.0, "max": -math.inf, "min": math.inf}
_PENDING = "_tmpatch_nan_pending"  # 1.0.0 MeanMetric: the value, between its two calls

#: per release (filled when the check is built): error text, warning text, warn function
_texts: Dict[str, Tuple[str, str, Callable[..., Any]]] = {}


@dataclass(frozen=True)
class _Release:
    """What differs between the upstream implementations of the check."""

    one_argument: bool  # 1.0.0: ``(self, x)``; MeanMetric.update calls it twice
    spelling: str  # "Encounted" up to 1.2.0
    metric_dtype: bool  # 1.3.2+: ``self.dtype``; before: float32
    disable: bool  # 1.6.2+: ``nan_strategy="disable"``

    @property
    def error(self) -> str:
        return f"{self.spelling} `nan` values in tensor"

    @property
    def warning(self) -> str:
        return f"{self.spelling} `nan` values in tensor. Will be removed."


@functools.lru_cache(maxsize=None)
def _classifier(module: ModuleType) -> Callable[[type], Optional[str]]:
    """``kind(cls)``: "sum", "mean", "max", "min", "cat", or None for a class whose
    ``update`` or ``compute`` is not one of the five aggregators' own."""
    base = module.BaseAggregator
    table = {
        (module.SumMetric, base): "sum",
        (module.MaxMetric, base): "max",
        (module.MinMetric, base): "min",
        (module.MeanMetric, module.MeanMetric): "mean",
        (module.CatMetric, module.CatMetric): "cat",
    }
    cache: Dict[type, Optional[str]] = {}

    def owner(cls: type, name: str) -> Optional[type]:
        return next((k for k in cls.__mro__ if name in vars(k)), None)

    def kind(cls: type) -> Optional[str]:
        try:
            return cache[cls]
        except KeyError:
            found = cache[cls] = table.get((owner(cls, "update"), owner(cls, "compute")))  # type: ignore[arg-type]
            return found

    kind.cache = cache  # type: ignore[attr-defined]  # read directly on the hot path
    return kind


def _report_now(strategy: str, texts: Tuple[str, str, Callable[..., Any]]) -> None:
    if strategy == "error":
        raise RuntimeError(texts[0])
    texts[2](texts[1], UserWarning)


def _settle(metric: Any, owner: Any, names: Tuple[str, ...] = ()) -> None:
    """At ``compute()``: report what the record of ``metric`` holds (kept on
    ``owner`` under ``names`` for the Running wrapper), then clear it."""
    strategy = getattr(metric, "nan_strategy", None)
    if strategy not in _REPORTED or not RECORD.has(metric):
        return
    if RECORD.take(owner, names):
        texts = _texts[_AGGREGATION]
        if strategy == "error":
            deferred.fail(owner, RuntimeError(texts[0]))
        texts[2](texts[1], UserWarning)


# -- the check -----------------------------------------------------------------
def _constants() -> Callable[[Any, float], Any]:
    """``const(dtype, value)``: a cached 0-d CPU tensor. ``torch.where`` takes it as
    a scalar argument on any device (as it does a Python number, less the
    allocation): no copy is made; of the data's dtype: no type promotion."""
    import torch

    cache: Dict[Tuple[Any, float], Any] = {}

    def const(dtype: Any, value: float) -> Any:
        key = (dtype, value)
        found = cache.get(key)
        if found is None:
            found = torch.full((), value, dtype=dtype)
            # a NaN key never compares equal; a tensor made under a tensor mode (the
            # audit's fake tensors, a tracer) must not outlive it: neither is cached
            if value == value and type(found) is torch.Tensor:
                cache[key] = found
        return found

    const.cache = cache  # type: ignore[attr-defined]
    return const


def _build_check(release: _Release) -> Callable[[ModuleType], Callable[..., Any]]:
    def build(module: ModuleType) -> Callable[..., Any]:
        import torch

        Tensor, where, maximum, float32 = torch.Tensor, torch.where, torch.maximum, torch.float32
        full, as_tensor, ones_like = torch.full, torch.as_tensor, torch.ones_like
        kind_of = _classifier(module)
        texts = _texts[_AGGREGATION] = (release.error, release.warning, module.rank_zero_warn)
        policy = settings.policy
        const = _constants()
        constants = const.cache  # type: ignore[attr-defined]
        record = RECORD.name
        strings = ("ignore", "warn", "error", "disable") if release.disable else ("ignore", "warn", "error")
        log.debug("tmpatch: nan_check built for %s (%s)", module.__name__, release)

        def tensor(value: Any, dtype: Any, device: Any) -> Any:
            if isinstance(value, (int, float)):
                return full((), value, dtype=dtype, device=device)  # made on the device, no host copy
            return as_tensor(value, dtype=dtype, device=device)

        def handled(metric: Any) -> Optional[str]:
            """The aggregator's kind, if this code handles ``metric`` and its strategy."""
            kind = kind_of(metric.__class__)
            strategy = metric.nan_strategy
            if kind is None or not (strategy in strings if strategy.__class__ is str else isinstance(strategy, float)):
                return None
            return kind

        def note(metric: Any, strategy: str, nan: Any, amount: Any = None) -> None:
            """warn/error seen: count on the device (deferred) or report now (eager)."""
            mode = policy["nan_check"]
            if mode == "off":
                return
            if mode == "deferred" and record in metric._defaults:
                RECORD.add(metric, nan.count_nonzero() if amount is None else amount)
            elif amount is not None or nan.any():  # eager, or built before apply(): a sync, as upstream
                _report_now(strategy, texts)

        fills: Dict[str, Dict[Any, Any]] = {kind: {} for kind in _NEUTRAL}  # kind -> dtype -> neutral const

        def check(metric: Any, kind: str, strategy: Any, x: Any, weight: Any) -> Tuple[Any, Any]:
            """The body: ``x`` and ``weight`` (or None) are tensors of the output dtype.

            The second result is the weight; Sum/Max/Min/Cat discard it, and get ``x``."""
            if weight is None:
                nan = x != x  # isnan, in one kernel
            else:
                both = maximum(x, weight)  # NaN exactly where either is (maximum propagates NaN)
                nan = both != both
            if strategy.__class__ is not str:  # a float: impute; an imputed element gets weight 1
                x = where(nan, const(x.dtype, strategy), x)
                return x, (x if weight is None else where(nan, const(x.dtype, 1.0), weight))
            if kind == "cat":
                if nan.any():  # the inherent sync: CatMetric's output shape depends on the data
                    if strategy != "ignore":
                        note(metric, strategy, nan, 1)
                    keep = ~nan
                    x = x[keep]
                    weight = None if weight is None else weight[keep]
                return x, (x if weight is None else weight)
            if strategy != "ignore":
                if policy["nan_check"] == "deferred" and record in metric._defaults:
                    states = metric.__dict__  # RECORD.add, inlined: this is the hot path
                    states[record] = states[record] + nan.count_nonzero()
                else:
                    note(metric, strategy, nan)
            dtype = x.dtype
            fill = fills[kind].get(dtype)
            if fill is None:
                fill = const(dtype, _NEUTRAL[kind])
                if (dtype, _NEUTRAL[kind]) in constants:  # const() kept it: so may this
                    fills[kind][dtype] = fill
            x = where(nan, fill, x)
            if weight is None:
                return x, x
            if kind != "mean":
                return x, weight
            return x, where(nan, fill, weight)  # the neutral value of "mean" is 0.0, a weight of 0

        if release.one_argument:
            # 1.0.0: ``(self, x)``; MeanMetric.update calls it for the value, then for the weight
            def _cast_and_nan_check_input_1_0_0(original: Callable, self: Any, x: Any) -> Any:
                kind = handled(self)
                if kind is None:
                    return original(self, x)
                strategy = self.nan_strategy
                if not isinstance(x, Tensor):
                    x = tensor(x, float32, self.device)
                x = x.float()
                if kind != "mean":
                    return check(self, kind, strategy, x, None)[0]
                pending = self.__dict__.pop(_PENDING, None)
                if pending is None or pending[0] != self._update_count:  # the value
                    value = check(self, kind, strategy, x, None)[0]  # a fresh tensor (torch.where)
                    self.__dict__[_PENDING] = (self._update_count, value, x != x)
                    return value
                _, value, value_nan = pending  # the weight
                if value.numel() == 0:
                    return x  # update() returns before using it
                weight = torch.broadcast_to(x, value.shape)
                weight_nan = weight != weight
                imputing = strategy.__class__ is not str
                if not imputing and strategy != "ignore":
                    note(self, strategy, weight_nan)
                value.masked_fill_(weight_nan, strategy if imputing else 0.0)  # our tensor, not the caller's
                return where(value_nan | weight_nan, const(float32, 1.0 if imputing else 0.0), weight)

            return _cast_and_nan_check_input_1_0_0

        kinds = kind_of.cache  # type: ignore[attr-defined]
        metric_dtype = release.metric_dtype

        def _cast_and_nan_check_input(original: Callable, self: Any, x: Any, weight: Any = None) -> Any:
            cls = self.__class__
            kind = kinds[cls] if cls in kinds else kind_of(cls)  # handled(), inlined
            strategy = self.nan_strategy
            if kind is None or not (strategy in strings if strategy.__class__ is str else isinstance(strategy, float)):
                return original(self, x, weight)
            dtype = self.dtype if metric_dtype else float32
            if not isinstance(x, Tensor):
                x = tensor(x, dtype, self.device)
            elif x.dtype != dtype:
                x = x.to(dtype)
            if weight is not None:
                if not isinstance(weight, Tensor):
                    weight = tensor(weight, dtype, self.device)
                elif weight.dtype != dtype:
                    weight = weight.to(dtype)
            if strategy == "disable":  # 1.6.2+: no check; a user-supplied weight is kept (#3434)
                return x, (ones_like(x) if weight is None else weight)
            return check(self, kind, strategy, x, weight)

        return _cast_and_nan_check_input

    return build


# -- attaching and reporting -----------------------------------------------------
def _build_init(module: ModuleType) -> Callable[..., Any]:
    """``BaseAggregator.__init__``: attach the record to the five aggregators."""
    kind_of = _classifier(module)

    def __init__(original: Callable, self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        if kind_of(self.__class__) is not None:
            RECORD.attach(self)

    return __init__


def _build_compute(module: ModuleType) -> Callable[..., Any]:
    """``compute`` of BaseAggregator, MeanMetric, CatMetric: report, then compute."""

    def compute(original: Callable, self: Any, *args: Any, **kwargs: Any) -> Any:
        _settle(self, self)
        return original(self, *args, **kwargs)

    return compute


def _build_running_compute(module: ModuleType) -> Callable[..., Any]:
    """``Running.compute``: the record of the base metric is kept per window slot."""

    def compute(original: Callable, self: Any, *args: Any, **kwargs: Any) -> Any:
        base = getattr(self, "base_metric", None)
        window = getattr(self, "window", None)
        if base is not None and isinstance(window, int):
            _settle(base, self, RECORD.slots(window))
        return original(self, *args, **kwargs)

    return compute


_R100 = _Release(one_argument=True, spelling="Encounted", metric_dtype=False, disable=False)
_R101 = _Release(one_argument=False, spelling="Encounted", metric_dtype=False, disable=False)
_R121 = _Release(one_argument=False, spelling="Encountered", metric_dtype=False, disable=False)
_R132 = _Release(one_argument=False, spelling="Encountered", metric_dtype=True, disable=False)
_R162 = _Release(one_argument=False, spelling="Encountered", metric_dtype=True, disable=True)

PATCH = Patch(
    name="nan_check",
    summary="aggregators' NaN check without a device read in update(); warn/error at compute()",
    known=since("1.0.0"),
    upstream="not fixed upstream (1.6.2 added nan_strategy='disable'); corrects #3434",
    labels=(
        Label(INHERENT, "CatMetric drops NaN elements: its output size depends on the values",
              function="check", file="tmpatch/patches/nan_check.py"),
        Label(PATCHED, "NaN check `if nans.any()` in _cast_and_nan_check_input; fixed by the nan_check patch",
              function="_cast_and_nan_check_input", file="torchmetrics/aggregation.py"),
    ),
    targets=(
        Target(
            module=_AGGREGATION,
            qualname="BaseAggregator._cast_and_nan_check_input",
            variants=(
                Variant(span("1.0.0"), "d10df440b4c4be78", _build_check(_R100)),
                Variant(span("1.0.1", "1.2.0"), "e9b5bcdbb4309ef8", _build_check(_R101)),
                Variant(span("1.2.1", "1.3.1"), "0c46b319aa83b2ec", _build_check(_R121)),
                Variant(span("1.3.2", "1.5.2"), "57f5be5ee23c9bcd", _build_check(_R132)),
                Variant(span("1.6.0", "1.6.1"), "e6752bb759da4d33", _build_check(_R132)),
                Variant(span("1.6.2", "1.9.0"), "17015515ea47b4b2", _build_check(_R162)),
            ),
        ),
        Target(
            module=_AGGREGATION,
            qualname="BaseAggregator.__init__",
            variants=(
                Variant(span("1.0.0"), "221235588f1ff7aa", _build_init),
                Variant(span("1.0.1", "1.5.2"), "43fff28847911e95", _build_init),
                Variant(span("1.6.0", "1.6.1"), "1cf117e37564600a", _build_init),
                Variant(span("1.6.2", "1.9.0"), "11e17bf02b69c9a2", _build_init),
            ),
        ),
        Target(
            module=_AGGREGATION,
            qualname="BaseAggregator.compute",
            variants=(
                Variant(span("1.0.0"), "85b42ff72f29ecdf", _build_compute),
                Variant(span("1.0.1", "1.9.0"), "f2b0172af761f632", _build_compute),
            ),
        ),
        Target(
            module=_AGGREGATION,
            qualname="MeanMetric.compute",
            variants=(
                Variant(span("1.0.0"), "8888ae936e8fc22e", _build_compute),
                Variant(span("1.0.1", "1.9.0"), "0e7990db595bb0a9", _build_compute),
            ),
        ),
        Target(
            module=_AGGREGATION,
            qualname="CatMetric.compute",
            variants=(Variant(span("1.0.0", "1.9.0"), "923d5cb8d93483e9", _build_compute),),
        ),
        # ``Running`` is defined in torchmetrics.wrappers.running and imported by
        # torchmetrics.aggregation (every release): reached through the latter, all
        # targets live in one module, so the patch applies once that one is loaded
        Target(
            module=_AGGREGATION,
            qualname="Running.compute",
            variants=(
                Variant(span("1.0.0", "1.2.1"), "57f7da02f224332a", _build_running_compute),
                Variant(span("1.3.0", "1.9.0"), "061ad2176a0c789b", _build_running_compute),
            ),
        ),
    ),
)
