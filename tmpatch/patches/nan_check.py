"""nan_check: the aggregators' NaN check without a device read during ``update()``.

Defect: ``BaseAggregator._cast_and_nan_check_input`` runs
``if nans.any() or nans_weight.any():`` on every ``update()`` of SumMetric,
MeanMetric, MaxMetric, MinMetric, CatMetric and the Running wrappers
(RunningMean, RunningSum): a device-to-host read per step, on every release.
Its ``ignore``/``warn`` paths remove NaN with a boolean mask (a data-dependent
shape, a second sync) and its imputation writes into the caller's tensors.
Python scalars (``update(3.5)``) are copied from the host. Not fixed upstream
(1.6.2 added the opt-out ``nan_strategy="disable"``; #3434 is its weight bug).

Releases: 1.0.0-1.9.0, six implementations (1.0.0 | 1.0.1-1.2.0 | 1.2.1-1.3.1 |
1.3.2-1.5.2 | 1.6.0-1.6.1 | 1.6.2-1.9.0). Aggregators whose ``update`` is not one
of the five above keep the release's code.

Behaviour (policy ``TMPATCH_NAN_CHECK`` / ``apply(nan_check=...)``: ``deferred``,
the default; ``eager``; ``off``):

* a float strategy imputes NaN with ``torch.where`` in the input's dtype, then casts,
  as the release does; an imputed element gets weight 1, the others keep theirs;
* ``ignore``/``warn``/``error`` neutralise NaN elements (Sum 0, Mean weight 0, Max
  -inf, Min +inf): the state is the one the removal gives, with no sync. CatMetric
  still removes them (its output's size depends on the data: one inherent sync).
  ``warn``/``error`` are reported at the user's next ``compute()`` (``deferred``,
  through the ``deferred_reports`` patch), naming the metric and how many updates
  carried NaN; during ``update()`` with its sync, as upstream (``eager``, and for a
  metric built before ``apply()``); or not at all (``off``);
* ``disable`` (1.6.2+): no check, a user-supplied weight is honoured (#3434).

Deliberate corrections: the caller's tensors are never written into; imputed
elements get weight 1 (upstream: the whole batch's weight becomes the imputed value
up to 1.6.1 — a NaN mean with the default weight — and collapses to 1 from 1.6.2);
an imputed element passes no gradient (upstream: the caller's tensor is overwritten
under no_grad); ``warn`` is given on the rank that saw the NaN, not only on rank 0.
Removed and neutralised elements give the same states up to float summation order;
so does a MeanMetric weight that broadcasts to the value's shape (a scalar, or fewer
dimensions), even without NaN: neutralising per element materialises it, and its total is
summed over a full tensor where the release sums the broadcast view (last bits only).
"""
from __future__ import annotations

import contextlib
import functools
import math
import warnings
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Callable, Dict, List, Optional, Tuple

from tmpatch import deferred, settings
from tmpatch.compiled import compiling
from tmpatch.spec import INHERENT, PATCHED, Label, Patch, Target, Variant, since, span

_NEUTRAL = {"sum": 0.0, "mean": 0.0, "max": -math.inf, "min": math.inf}
_INT64 = (-(2**63), 2**63)


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


#: the release loaded (set when the check is built), for the report's wording
_loaded: Dict[str, Any] = {}


def _describe(top: Any, found: List[Tuple[Any, int]]) -> str:
    name = type(top).__name__
    inner = {type(metric).__name__ for metric, _ in found if metric is not top}
    return f"{name} ({', '.join(sorted(inner))} inside)" if inner else name


def _report(top: Any, found: List[Tuple[Any, int]], all_ranks: bool) -> None:
    """At the user's compute(): one warning, or one error, for what the updates saw."""
    release: Optional[_Release] = _loaded.get("release")
    if release is None:
        return
    by_strategy: Dict[str, int] = {}
    for metric, count in found:
        strategy = getattr(metric, "nan_strategy", None)
        if strategy in ("warn", "error"):
            by_strategy[strategy] = by_strategy.get(strategy, 0) + count
    where = " on some rank" if all_ranks else ""
    for strategy in ("warn", "error"):
        count = by_strategy.get(strategy)
        if not count:
            continue
        note = (f" (tmpatch nan_check: {_describe(top, found)} saw NaN{where} in {count} update(s) since the last "
                "compute(); reported at compute(); TMPATCH_NAN_CHECK=eager reports in update())")
        if strategy == "error":
            raise RuntimeError(release.error + note)
        if all_ranks:
            _loaded["rank_zero_warn"](release.warning + note, UserWarning)
        else:
            warnings.warn(release.warning + note, UserWarning, stacklevel=2)


RECORD = deferred.Record("nan", _report)


@functools.lru_cache(maxsize=None)
def _classifier(module: ModuleType) -> Dict[type, Optional[str]]:
    """A cache ``class -> kind`` ("sum", "mean", "max", "min", "cat", or None for a class
    whose ``update`` is not one of the five aggregators' own), filled by :func:`_kind`."""
    return {}


def _kind(module: ModuleType, cache: Dict[type, Optional[str]], cls: type) -> Optional[str]:
    owner = None
    for k in cls.__mro__:  # a loop over ``__dict__``: torch.compile traces it (not ``vars()``)
        if "update" in k.__dict__:
            owner = k
            break
    table = {module.SumMetric: "sum", module.MaxMetric: "max", module.MinMetric: "min",
             module.MeanMetric: "mean", module.CatMetric: "cat"}
    found = cache[cls] = table.get(owner)  # type: ignore[arg-type]
    return found


def _build_check(release: _Release) -> Callable[[ModuleType], Callable[..., Any]]:
    def build(module: ModuleType) -> Callable[..., Any]:
        import torch

        Tensor, where, maximum, float32 = torch.Tensor, torch.where, torch.maximum, torch.float32
        full, as_tensor, ones_like, enable_grad = torch.full, torch.as_tensor, torch.ones_like, torch.enable_grad
        is_grad_enabled = torch.is_grad_enabled
        _loaded.update(release=release, rank_zero_warn=module.rank_zero_warn)
        kinds = _classifier(module)
        policy = settings.policy
        books = deferred._books
        strings = ("ignore", "warn", "error", "disable") if release.disable else ("ignore", "warn", "error")
        record = RECORD

        def tensor(value: Any, dtype: Any, device: Any) -> Any:
            """A Python number as the release makes it, on the device without a host copy
            (an int goes through a Python float first, as ``as_tensor`` takes it: a direct
            int64 cast rounds some large ints differently)."""
            if type(value) is float:
                return full((), value, dtype=dtype, device=device)
            if type(value) in (int, bool) and _INT64[0] <= value < _INT64[1]:
                return full((), float(value) if dtype.is_floating_point else value, dtype=dtype, device=device)
            return as_tensor(value, dtype=dtype, device=device)  # what the release does

        def report(metric: Any, strategy: str, nan: Any) -> None:
            """warn/error seen: count on the device (deferred) or report now (eager)."""
            mode = policy["nan_check"]
            if mode == "off":
                return
            if mode == "deferred":
                if compiling():  # torch.compile: the book through the metric (no lookup in the table)
                    if record.add(metric, nan.any()):
                        return
                elif id(metric) in books and record.add(metric, nan.any()):
                    return
            if nan.any():  # eager, or a metric built before apply(): a sync, as upstream
                if strategy == "error":
                    raise RuntimeError(release.error)
                module.rank_zero_warn(release.warning, UserWarning)

        def impute(x: Any, nan: Any, value: float) -> Any:
            return where(nan, value, x)  # a Python number: no type promotion, no copy to the device

        def check(metric: Any, kind: str, strategy: Any, x: Any, weight: Any, dtype: Any) -> Tuple[Any, Any]:
            """``x``, ``weight`` (or None): tensors as the caller gave them; results in ``dtype``."""
            if not (x.is_floating_point() or (weight is not None and weight.is_floating_point())):
                x = x.to(dtype)  # no NaN in integers: the release's cast alone
                return x, (x if weight is None else weight.to(dtype))
            if weight is None:
                nan = x != x  # isnan, in one kernel
            else:
                both = maximum(x, weight)  # NaN exactly where either is (maximum propagates NaN)
                nan = both != both
            if type(strategy) is not str:  # a float: impute in the input's dtype, then cast
                x = impute(x, nan, strategy).to(dtype)
                return x, (x if weight is None else impute(weight, nan, 1.0).to(dtype))
            if strategy != "ignore":
                report(metric, strategy, nan)
            if kind == "cat":
                if nan.any():  # the inherent sync: CatMetric's output size depends on the data
                    x = x[~nan]
                    weight = None if weight is None else weight[~nan]
                x = x.to(dtype)
                return x, (x if weight is None else weight.to(dtype))
            x = impute(x, nan, _NEUTRAL[kind]).to(dtype)
            if weight is None:
                return x, x
            weight = weight.to(dtype)
            return x, (impute(weight, nan, 0.0) if kind == "mean" else weight)

        def run(metric: Any, kind: str, strategy: Any, x: Any, weight: Any, dtype: Any) -> Tuple[Any, Any]:
            if (x.requires_grad or (weight is not None and weight.requires_grad)) and not is_grad_enabled():
                with enable_grad():  # the release's in-place write keeps the caller's requires_grad
                    return check(metric, kind, strategy, x, weight, dtype)
            return check(metric, kind, strategy, x, weight, dtype)

        def handled(metric: Any) -> Optional[str]:
            cls = metric.__class__
            if compiling():  # worked out while tracing: a lookup in the cache would be a guard on it
                kind = _kind(module, {}, cls)
            else:
                kind = kinds[cls] if cls in kinds else _kind(module, kinds, cls)
            strategy = metric.nan_strategy
            if kind is None or not (strategy in strings if type(strategy) is str else isinstance(strategy, float)):
                return None
            return kind

        if release.one_argument:
            #: id(metric) -> (update count, NaN mask of the value, the value returned: our own tensor)
            pending: Dict[int, Tuple[int, Any, Any]] = {}

            def _cast_and_nan_check_input_1_0_0(original: Callable, self: Any, x: Any) -> Any:
                kind = handled(self)
                if kind is None:
                    return original(self, x)
                if not isinstance(x, Tensor):
                    x = tensor(x, float32, self.device)
                if kind != "mean":
                    return run(self, kind, self.nan_strategy, x, None, float32)[0]
                if compiling():  # one traced update makes both calls: a slot pairs them (the count is a guard)
                    stash, _paired.stash = _paired.stash, None
                    if stash is None or stash[0] is not self:  # MeanMetric's value
                        value = run(self, kind, self.nan_strategy, x, None, float32)[0]
                        _paired.stash = (self, x != x, value)
                        return value
                else:
                    stash = pending.pop(id(self), None)
                    if stash is None or stash[0] != self._update_count:  # MeanMetric's value
                        if len(pending) > 64:
                            pending.clear()  # updates that raised between the two calls
                        value = run(self, kind, self.nan_strategy, x, None, float32)[0]
                        pending[id(self)] = (self._update_count, x != x, value)
                        return value
                _, value_nan, value = stash  # MeanMetric's weight: NaN where the value or the weight is
                if value_nan.numel() == 0:
                    return x.float()  # update() returns before using it
                weight = torch.broadcast_to(x, value_nan.shape)
                weight_nan = weight != weight
                nan = value_nan | weight_nan
                imputing = type(self.nan_strategy) is not str
                if not imputing and self.nan_strategy != "ignore":  # an update whose value had NaN is counted
                    report(self, self.nan_strategy, weight_nan & ~value_nan.any())
                if value is not x and value.shape == weight_nan.shape:  # a tensor of ours (torch.where's)
                    with enable_grad() if value.requires_grad else contextlib.nullcontext():
                        value.masked_fill_(weight_nan, self.nan_strategy if imputing else 0.0)
                return where(nan, 1.0 if imputing else 0.0, weight).float()

            return _cast_and_nan_check_input_1_0_0

        def _cast_and_nan_check_input(original: Callable, self: Any, x: Any, weight: Any = None) -> Any:
            kind = handled(self)
            if kind is None:
                return original(self, x, weight)
            dtype = self.dtype if release.metric_dtype else float32
            if not isinstance(x, Tensor):
                x = tensor(x, dtype, self.device)
            if weight is not None and not isinstance(weight, Tensor):
                weight = tensor(weight, dtype, self.device)
            strategy = self.nan_strategy
            if strategy == "disable":  # 1.6.2+: no check; a user-supplied weight is kept (#3434)
                return x.to(dtype), (ones_like(x) if weight is None else weight).to(dtype)
            return run(self, kind, strategy, x, weight, dtype)

        return _cast_and_nan_check_input

    return build


class _Paired:
    """1.0.0 in compiled code: the NaN mask of MeanMetric's value, for its weight's call."""

    __slots__ = ("stash",)

    def __init__(self) -> None:
        self.stash: Optional[Tuple[Any, Any, Any]] = None


_paired = _Paired()

_R100 = _Release(one_argument=True, spelling="Encounted", metric_dtype=False, disable=False)
_R101 = _Release(one_argument=False, spelling="Encounted", metric_dtype=False, disable=False)
_R121 = _Release(one_argument=False, spelling="Encountered", metric_dtype=False, disable=False)
_R132 = _Release(one_argument=False, spelling="Encountered", metric_dtype=True, disable=False)
_R162 = _Release(one_argument=False, spelling="Encountered", metric_dtype=True, disable=True)

PATCH = Patch(
    name="nan_check",
    summary="the aggregators' NaN check reads the device on every update() (and removes NaN with a boolean "
            "index); Python scalars are copied from the host",
    known=since("1.0.0"),
    upstream="not fixed upstream (1.6.2 added nan_strategy='disable'); corrects #3434",
    changes="warn/error come at the next compute(), naming the metric and the number of updates with NaN; "
            "the caller's tensors are never written into; an imputed element gets weight 1",
    requires=("deferred_reports",),
    labels=(
        Label(INHERENT, "CatMetric drops NaN elements: its output size depends on the values",
              function="check", file="tmpatch/patches/nan_check.py"),
        Label(PATCHED, "NaN check `if nans.any()` in _cast_and_nan_check_input; fixed by the nan_check patch",
              function="_cast_and_nan_check_input", file="torchmetrics/aggregation.py"),
    ),
    targets=(
        Target(
            module="torchmetrics.aggregation",
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
    ),
)
