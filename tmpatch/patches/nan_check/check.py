"""nan_check's replacement of ``BaseAggregator._cast_and_nan_check_input``, built per release."""
from __future__ import annotations

import contextlib
import functools
import math
from types import ModuleType
from typing import Any, Callable, Dict, Optional, Tuple

from tmpatch.patches import _constants
from tmpatch.patches.nan_check.report import RECORD, _loaded, _Release
from tmpatch.runtime import deferred, host, policies
from tmpatch.runtime.compiled import compiling
from tmpatch.runtime.deferred import ANY

_NEUTRAL = {"sum": 0.0, "mean": 0.0, "max": -math.inf, "min": math.inf}
_INT64 = (-(2**63), 2**63)


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
    found = cache[cls] = table.get(owner)
    return found


def _build_check(release: _Release) -> Callable[[ModuleType], Callable[..., Any]]:
    def build(module: ModuleType) -> Callable[..., Any]:
        import torch

        Tensor, where, maximum, float32 = torch.Tensor, torch.where, torch.maximum, torch.float32
        full, as_tensor, ones_like, enable_grad = torch.full, torch.as_tensor, torch.ones_like, torch.enable_grad
        is_grad_enabled = torch.is_grad_enabled
        warn = module.rank_zero_warn if release.rank_zero else deferred.warn_in(module, release.warning)
        _loaded.update(release=release, rank_zero_warn=warn)
        cache = _Cache(_classifier(module))  # an object: a dict in a traced closure is a guard on its length
        policy = policies.current
        # not ``deferred._books`` in this closure: torch.compile guards the length of a dict a traced
        # closure holds, and that one changes whenever any metric is built or collected (a recompile)
        has_book = deferred.book_of
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
            if mode == "deferred":  # the mask itself is kept (ours, never changed): no kernel here
                if compiling():  # torch.compile: the book through the metric (no lookup in the table)
                    if record.note(metric, nan, ANY):
                        return
                elif has_book(metric) is not None and record.note(metric, nan, ANY):
                    return
            if nan.any():  # eager, or a metric built before apply(): a sync, as upstream
                if strategy == "error":
                    raise RuntimeError(release.error)
                warn(release.warning, UserWarning)

        writes = _Writes(torch)

        def impute(x: Any, nan: Any, value: float) -> Any:
            # in x's dtype (no type promotion, no copy to the device); eager, in one kernel: the
            # fill value a constant made once per device, not a 0-d tensor filled at every call
            return where(nan, _constants.operand(value, x), x)

        def written(x: Any, nan: Any, weight: Any, value: float) -> Any:
            """The value the release's ``x[nans | nans_weight] = value`` writes, in ``x``'s dtype; where
            this torch refuses it (in ``x``, or in the weight where the release writes it there too),
            the release's error once the mask holds a NaN (a device read: only for such a value)."""
            if compiling():  # traced: no probe (its CPU tensors would join the graph)
                return value
            refused, fill = writes.of(x.dtype, value)
            refusing = x.dtype if refused else None
            if refusing is None and weight is not None and release.weight_takes_strategy \
                    and writes.of(weight.dtype, value)[0]:
                refusing = weight.dtype
            if refusing is not None and nan.any():
                writes.refuse(refusing, value)
            return fill

        def check(metric: Any, kind: str, strategy: Any, x: Any, weight: Any, dtype: Any,
                  shortcut: bool) -> Tuple[Any, Any]:
            """``x``, ``weight`` (or None): tensors as the caller gave them; results in ``dtype``.
            ``shortcut``: not traced by torch.compile, and the caller takes the results as they
            are (they may be ``x`` itself)."""
            if not (x.is_floating_point() or (weight is not None and weight.is_floating_point())):
                x = x.to(dtype)  # no NaN in integers: the release's cast alone
                return x, (x if weight is None else weight.to(dtype))
            if weight is None:
                nan = x != x  # isnan, in one kernel
            elif x.is_complex() or weight.is_complex():  # no maximum for complex numbers
                nan = (x != x) | (weight != weight)
            else:
                both = maximum(x, weight)  # NaN exactly where either is (maximum propagates NaN)
                nan = both != both
            if shortcut and host.on_host(x) and x.is_floating_point() and x.is_contiguous() \
                    and (weight is None or (weight.is_floating_point() and weight.shape == x.shape)) \
                    and not nan.any():
                # the CPU has no sync to save: with no NaN, the tensors every branch below gives
                # (where() of a float, contiguous input is that input; it materialises a weight
                # that is a broadcast view) and nothing to report
                x = x.to(dtype)
                if weight is None:
                    return x, x
                weight = weight.to(dtype)
                return x, (weight.contiguous() if kind == "mean" or type(strategy) is not str else weight)
            if type(strategy) is not str:  # a float: impute in the input's dtype, then cast
                x = impute(x, nan, written(x, nan, weight, strategy)).to(dtype)
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

        def run(metric: Any, kind: str, strategy: Any, x: Any, weight: Any, dtype: Any,
                shortcut: bool) -> Tuple[Any, Any]:
            if (x.requires_grad or (weight is not None and weight.requires_grad)) and not is_grad_enabled():
                with enable_grad():  # the release's in-place write keeps the caller's requires_grad
                    out, out_weight = check(metric, kind, strategy, x, weight, dtype, False)
                # ... in the tensor it returns where its cast is none (the caller's own); a cast under
                # update()'s no_grad returns a tensor without grad
                if x.dtype != dtype and out.requires_grad:
                    same, out = out_weight is out, out.detach()
                    out_weight = out if same else out_weight
                if weight is not None and weight.dtype != dtype and out_weight is not out \
                        and out_weight.requires_grad:
                    out_weight = out_weight.detach()
                return out, out_weight
            return check(metric, kind, strategy, x, weight, dtype, shortcut)

        def releases(metric: Any, x: Any, weight: Any) -> bool:
            """Whether the release's own check runs: a removing strategy (``ignore``, ``warn``,
            ``error``) reported now (``eager``, everywhere: the release's path and its sync) or on the
            host, where a read costs nothing (the release's values bit for bit, its warning from its
            own statement, its error from the same call). A float strategy keeps the corrections,
            ``disable`` its weight, ``off`` its silence."""
            strategy = metric.nan_strategy
            if type(strategy) is not str or strategy == "disable":
                return False
            mode = policy["nan_check"]
            if mode == "eager":
                return True
            if mode == "off" or not host.host_device(metric.device):
                return False
            return (not isinstance(x, Tensor) or host.on_host(x)) and (
                not isinstance(weight, Tensor) or host.on_host(weight))

        def handled(metric: Any, tracing: bool) -> Optional[str]:
            cls = metric.__class__
            if tracing:  # worked out while tracing: a lookup in the cache would be a guard on it
                kind = _kind(module, {}, cls)
            else:
                kinds = cache.kinds
                kind = kinds[cls] if cls in kinds else _kind(module, kinds, cls)
            strategy = metric.nan_strategy
            if kind is None or not (strategy in strings if type(strategy) is str else isinstance(strategy, float)):
                return None
            return kind

        if release.one_argument:
            #: id(metric) -> (update count, NaN mask of the value, the value returned: our own tensor, and the
            #: value given when the value returned is still to fill)
            pending: Dict[int, Tuple[int, Any, Any, Any]] = {}
            empty, broadcast_to = torch.empty, torch.broadcast_to

            def weight_of(metric: Any, given: Any, value: Any, weight: Any) -> Any:
                """MeanMetric's weight call (1.0.0): fills the value returned by its first call (a
                float32 value: the release's ``float()`` is the value itself) and returns the weight,
                NaN in either left out (or imputed), in four kernels."""
                strategy = metric.nan_strategy
                if given.numel() == 0:  # update() returns before using them, but the release has checked
                    if type(strategy) is str and strategy != "ignore":  # the weight on its own: a NaN is
                        report(metric, strategy, weight != weight)  # reported
                    return weight.float()
                weight = broadcast_to(weight, given.shape)
                if weight.is_complex():
                    nan = (given != given) | (weight != weight)
                else:
                    both = maximum(given, weight) if weight.is_floating_point() else given
                    nan = both != both
                imputing = type(strategy) is not str
                fill = _constants.full(writes.of(float32, strategy)[1] if imputing else 0.0, float32, given.device)
                where(nan, fill, given, out=value)
                if not imputing and strategy != "ignore":
                    report(metric, strategy, nan)
                return where(nan, _constants.operand(1.0 if imputing else 0.0, weight), weight).float()

            def _cast_and_nan_check_input_1_0_0(original: Callable, self: Any, x: Any) -> Any:
                tracing = compiling()
                kind = handled(self, tracing)
                if kind is None or (not tracing and releases(self, x, None)):
                    return original(self, x)  # MeanMetric's two calls alike: the metric's device decides
                if not isinstance(x, Tensor):
                    x = tensor(x, float32, self.device)
                if type(self.nan_strategy) is float and not tracing and (x.is_floating_point() or x.is_complex()) \
                        and writes.of(x.dtype, self.nan_strategy)[0] and (x != x).any():
                    # the release's write refused (the value's call, or the weight's): no stash left behind
                    pending.pop(id(self), None)
                    writes.refuse(x.dtype, self.nan_strategy)
                if kind != "mean":
                    return run(self, kind, self.nan_strategy, x, None, float32, not tracing)[0]
                # MeanMetric: no shortcut, the weight's call below fills the value the first one returned
                if tracing:  # one traced update makes both calls: a slot pairs them (the count is a guard)
                    stash, _paired.stash = _paired.stash, None
                    if stash is None or stash[0] is not self:  # MeanMetric's value
                        value = run(self, kind, self.nan_strategy, x, None, float32, False)[0]
                        _paired.stash = (self, x != x, value, None)
                        return value
                else:
                    stash = pending.pop(id(self), None)
                    if stash is None or stash[0] != self._update_count:  # MeanMetric's value
                        if len(pending) > 64:
                            pending.clear()  # updates that raised between the two calls
                        if x.dtype is float32 and not x.requires_grad and type(self.nan_strategy) in (str, float):
                            # the value is filled by the weight's call, which sees both: no kernel here
                            value = empty(x.shape, dtype=float32, device=x.device)
                            pending[id(self)] = (self._update_count, None, value, x)
                            return value
                        value = run(self, kind, self.nan_strategy, x, None, float32, False)[0]
                        pending[id(self)] = (self._update_count, x != x, value, None)
                        return value
                    if stash[3] is not None:  # MeanMetric's weight, the value still to fill
                        return weight_of(self, stash[3], stash[2], x)
                _, value_nan, value, _ = stash  # MeanMetric's weight: NaN where the value or the weight is
                if value_nan.numel() == 0:  # update() returns before using it, but the release has
                    if type(self.nan_strategy) is str and self.nan_strategy != "ignore":  # checked the
                        report(self, self.nan_strategy, x != x)  # weight on its own: a NaN is reported
                    return x.float()
                weight = torch.broadcast_to(x, value_nan.shape)
                weight_nan = weight != weight
                nan = value_nan | weight_nan
                imputing = type(self.nan_strategy) is not str
                if not imputing and self.nan_strategy != "ignore":  # an update whose value had NaN is counted
                    report(self, self.nan_strategy, weight_nan & ~value_nan.any())
                if value is not x and value.shape == weight_nan.shape:  # a tensor of ours (torch.where's)
                    with enable_grad() if value.requires_grad else contextlib.nullcontext():
                        fill = self.nan_strategy if imputing else 0.0
                        if imputing and not tracing:  # the value stored (masked_fill_ refuses one beyond the range)
                            fill = writes.of(value.dtype, fill)[1]
                        value.masked_fill_(weight_nan, fill)
                return where(nan, _constants.operand(1.0 if imputing else 0.0, weight), weight).float()

            return _cast_and_nan_check_input_1_0_0

        def _cast_and_nan_check_input(original: Callable, self: Any, x: Any, weight: Any = None) -> Any:
            tracing = compiling()
            kind = handled(self, tracing)
            if kind is None or (not tracing and releases(self, x, weight)):
                return original(self, x, weight)
            dtype = self.dtype if release.metric_dtype else float32
            if not isinstance(x, Tensor):
                x = tensor(x, dtype, self.device)
            if weight is not None and not isinstance(weight, Tensor):
                weight = tensor(weight, dtype, self.device)
            strategy = self.nan_strategy
            if strategy == "disable":  # 1.6.2+: no check; a user-supplied weight is kept (#3434)
                return x.to(dtype), (ones_like(x) if weight is None else weight).to(dtype)
            return run(self, kind, strategy, x, weight, dtype, not tracing)

        return _cast_and_nan_check_input

    return build


class _Writes:
    """What the release's imputation, ``x[nans] = value`` (a Python float written into the input
    where it holds NaN), does to a tensor of each dtype on this torch, found once per ``(dtype,
    value)`` on a one-element CPU tensor: the value stored (in ``x``'s dtype: an integer input
    stores it truncated, a float16 one rounded, 70000 as ``inf``), or whether torch refuses it
    (``value cannot be converted to type ... without overflow``: out of an integer's range, and
    for floats beyond the dtype's range on torch before 2.6 and from 2.15 on). The scalar is
    converted on the host, whatever the input's device: the CPU's answer is the device's.
    ``torch.where``, ``masked_fill_`` and ``torch.full`` are given the value stored, which each
    takes as it is (a value beyond a float dtype's range they may refuse, or not, on their own
    terms)."""

    __slots__ = ("found", "zeros", "ones", "tensor_type")

    def __init__(self, torch: Any) -> None:
        self.found: Dict[Tuple[Any, Any], Tuple[bool, Any]] = {}
        self.zeros = functools.partial(torch.zeros, 1, device="cpu")
        self.ones = functools.partial(torch.ones, 1, dtype=torch.bool, device="cpu")
        self.tensor_type = torch.Tensor

    def of(self, dtype: Any, value: float) -> Tuple[bool, Any]:
        """``(refused, stored)``; where refused (no value stored), an infinity of the value's sign
        for a float dtype, 0 for another: a fill for a mask without NaN. Host code only."""
        key = (dtype, value if value == value else "nan")
        found = self.found.get(key)
        if found is None:
            target = self.zeros(dtype=dtype)
            if type(target) is not self.tensor_type:  # a fake tensor (the audit's): no answer to keep
                return False, value
            try:
                target[self.ones()] = value
            except Exception:  # noqa: BLE001 - whatever torch raises there, the release raises
                floating = dtype.is_floating_point or dtype.is_complex
                found = (True, math.copysign(math.inf, value) if floating else 0)
            else:
                found = (False, target.item())
            self.found[key] = found
        return found

    def refuse(self, dtype: Any, value: float) -> None:
        """Raise what the release's write raises (torch's own error, from the same statement)."""
        self.zeros(dtype=dtype)[self.ones()] = value


class _Cache:
    """Holds the class -> kind cache for the replacement's closure (see ``build``)."""

    __slots__ = ("kinds",)

    def __init__(self, kinds: Dict[type, Optional[str]]) -> None:
        self.kinds = kinds


class _Paired:
    """1.0.0 in compiled code: the NaN mask of MeanMetric's value, for its weight's call."""

    __slots__ = ("stash",)

    def __init__(self) -> None:
        self.stash: Optional[Tuple[Any, Any, Any, Any]] = None


_paired = _Paired()

