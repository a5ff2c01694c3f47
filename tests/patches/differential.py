"""Differential runs: the same script of calls on metrics built unpatched and on metrics built patched.

A :class:`Case` is source text: the metric's constructor (``make``) and its calls (``steps``, each
``update``/``forward``/``compute``/``reset`` with its arguments written as Python, ``T([...])`` for a
tensor), so that every run builds fresh metrics and fresh inputs and a failure prints a reproducer.
:func:`outcome` runs a case in this process as it stands (patched or not) and records, per call,
its result, its exception (type and message), its warnings (category, message, the file it is
attributed to, relative to its package, and how many), the states of every metric inside after it
(bitwise) and the caller's inputs after it (a write into them shows). :func:`differences` compares
two outcomes aspect by aspect; :func:`check` runs a case released and patched, with torch's
deterministic mode as the case says, and fails on every difference that no :data:`CORRECTIONS`
entry (the deliberate corrections of the patches' docstrings and the README) accounts for.
"""
from __future__ import annotations

import gc
import struct
import sys
import warnings
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, FrozenSet, List, Optional, Sequence, Tuple

import torch

import tmpatch

NAN, INF = float("nan"), float("inf")

#: the modules a case's names are looked up in, the first that has a name is its import
MODULES = ("torchmetrics", "torchmetrics.aggregation", "torchmetrics.classification", "torchmetrics.retrieval",
           "torchmetrics.regression", "torchmetrics.nominal", "torchmetrics.wrappers")

_DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
           "float64": torch.float64, "int64": torch.int64, "int32": torch.int32, "bool": torch.bool}
_AS_INT = {torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.float32: torch.int32,
           torch.float64: torch.int64}


def T(values: Any, dtype: str = "float32", grad: bool = False) -> torch.Tensor:  # noqa: N802 - reads as a literal
    """A tensor in a case's source: ``T([1.0, nan], "float64", grad=True)``."""
    tensor = torch.tensor(values, dtype=_DTYPES[dtype])
    return tensor.requires_grad_(True) if grad else tensor


def tensor_source(values: Any, dtype: str = "float32", grad: bool = False) -> str:
    """The source of ``T(values, dtype, grad)`` (``nan``, ``inf`` as names)."""
    text = repr(values)
    extra = f", {dtype!r}" if dtype != "float32" or grad else ""
    return f"T({text}{extra}{', grad=True' if grad else ''})"


_NAMESPACE: Optional[Dict[str, Any]] = None
_WHERE: Dict[str, str] = {}


def namespace() -> Dict[str, Any]:
    """The names a case's source may use: torch, T, nan, inf and the classes of :data:`MODULES`."""
    global _NAMESPACE
    if _NAMESPACE is None:
        import importlib

        space: Dict[str, Any] = {"torch": torch, "T": T, "nan": NAN, "inf": INF}
        for module_name in MODULES:
            try:
                module = importlib.import_module(module_name)
            except ImportError:
                continue
            for name in dir(module):
                value = getattr(module, name)
                if isinstance(value, type) and name not in space:
                    space[name] = value
                    _WHERE[name] = module_name
        _NAMESPACE = space
    return _NAMESPACE


def has(name: str) -> bool:
    """Whether the release under test has the class ``name``."""
    return name in namespace()


def accepts(name: str, argument: str) -> bool:
    """Whether the class ``name``'s constructor (or its ``__new__``, for task wrappers) names ``argument``."""
    import inspect

    cls = namespace().get(name)
    if cls is None:
        return False
    for fn in (cls.__init__, getattr(cls, "__new__", None)):
        try:
            if fn is not None and argument in inspect.signature(fn).parameters:
                return True
        except (TypeError, ValueError):
            continue
    return False


@dataclass(frozen=True)
class Case:
    """A metric (``make``: a constructor's source) and its calls (``(call, arguments' source)``)."""

    make: str
    steps: Tuple[Tuple[str, str], ...]
    deterministic: bool = False
    #: what the generator knows of the case, for :data:`CORRECTIONS` (``"impute"``, ``"out_of_range"`` ...)
    tags: FrozenSet[str] = frozenset()
    #: the same calls with arguments whose outcome the patched one must equal where a correction says so
    corrected: Optional[Tuple[Tuple[str, str], ...]] = None

    def source(self) -> str:
        """A reproducer: python code that runs the case (then ``tmpatch.apply()`` and again)."""
        space = namespace()
        import re

        used = sorted({w for w in re.findall(r"[A-Za-z_]\w*", self.make + "".join(a for _, a in self.steps))
                       if w in _WHERE and w in space})
        lines = ["import torch, tmpatch"]
        by_module: Dict[str, List[str]] = {}
        for name in used:
            by_module.setdefault(_WHERE[name], []).append(name)
        lines += [f"from {module} import {', '.join(names)}" for module, names in by_module.items()]
        lines.append("from tests.patches.differential import T, nan, inf")
        if self.deterministic:
            lines.append("torch.use_deterministic_algorithms(True)")
        lines.append("torch.manual_seed(0)")
        lines.append(f"m = {self.make}")
        for call, args in self.steps:
            lines.append(f"m.{call}({args})")
        return "\n".join(lines)


@dataclass
class Step:
    """What one call gave: canonical (compared) and readable (shown) forms."""

    call: str
    result: Any = None
    error: Optional[Tuple[str, str]] = None
    warnings: Tuple[Tuple[str, str, str], ...] = ()
    states: Any = None
    inputs: Any = None
    shown: Dict[str, str] = field(default_factory=dict)


def _float_bits(value: float) -> int:
    return struct.unpack("<q", struct.pack("<d", value))[0]


def canon(value: Any) -> Any:
    """A hashable, bitwise form of ``value`` (tensors: dtype, shape, device, bits, requires_grad)."""
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        if t.dtype in _AS_INT:
            bits = t.view(_AS_INT[t.dtype]).flatten().tolist()
        elif t.is_complex():
            bits = torch.view_as_real(t).flatten().tolist()
        else:
            bits = t.flatten().tolist()
        return ("tensor", str(t.dtype), tuple(t.shape), str(value.device), tuple(bits), value.requires_grad)
    if isinstance(value, dict):
        return ("dict", tuple((k, canon(v)) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(canon(v) for v in value))
    if isinstance(value, float):
        return ("float", _float_bits(value))
    if value is None or isinstance(value, (int, bool, str)):
        return value
    return ("object", type(value).__name__)


def shown(value: Any, limit: int = 300) -> str:
    """A short readable form of ``value``."""
    if isinstance(value, torch.Tensor):
        text = f"tensor({value.detach().tolist()}, {value.dtype}{', grad' if value.requires_grad else ''})"
    elif isinstance(value, dict):
        text = "{" + ", ".join(f"{k}: {shown(v, 80)}" for k, v in value.items()) + "}"
    elif isinstance(value, (list, tuple)):
        text = "[" + ", ".join(shown(v, 80) for v in value) + "]"
    else:
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _where(filename: str) -> str:
    """A warning's file relative to its package (``torchmetrics/utilities/prints.py``)."""
    parts = filename.replace("\\", "/").split("/")
    for anchor in ("torchmetrics", "tmpatch", "torch", "tests", "warnings.py"):
        if anchor in parts:
            return "/".join(parts[len(parts) - 1 - parts[::-1].index(anchor):])
    return parts[-1]


def states_of(metric: Any) -> Dict[str, Any]:
    """Every state of every metric in ``metric`` (its own, its children's), by module path."""
    from torchmetrics import Metric

    out: Dict[str, Any] = {}
    for path, module in metric.named_modules():
        if isinstance(module, Metric):
            for name in module._defaults:
                value = getattr(module, name)
                out[f"{path or '.'}:{name}"] = list(value) if isinstance(value, list) else value
            out[f"{path or '.'}:_update_count"] = getattr(module, "_update_count", None)
    return out


def _call_args(space: Dict[str, Any], source: str) -> Tuple[tuple, dict]:
    return eval(f"(lambda *a, **k: (a, k))({source})", space)  # noqa: S307 - the tests' own source


def outcome(case: Case, steps: Optional[Sequence[Tuple[str, str]]] = None) -> List[Step]:
    """Run ``case`` (its ``steps``, or the ones given) here as things stand; what each call gave."""
    space = dict(namespace())
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(case.deterministic)
    torch.manual_seed(0)
    recorded: List[Step] = []
    try:
        metric = _record(recorded, "init", eval, (case.make, space), {}, None)
        if metric is None:
            return recorded
        for call, source in (case.steps if steps is None else steps):
            args, kwargs = _call_args(space, source)
            _record(recorded, call, getattr(metric, call), args, kwargs, metric)
        unraisable: List[str] = []
        hook, sys.unraisablehook = sys.unraisablehook, lambda u: unraisable.append(
            f"{type(u.exc_value).__name__}: {u.exc_value}")
        step = Step("del")
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                del metric
                if zlib.crc32(case.source().encode()) % 4 == 0:  # a full collection costs 0.15 s: one case in 4
                    gc.collect()
        finally:
            sys.unraisablehook = hook
        step.warnings = tuple((w.category.__name__, str(w.message), _where(w.filename)) for w in caught)
        step.shown["warnings"] = repr(list(step.warnings))
        if unraisable:
            step.error = ("unraisable", "; ".join(unraisable))
            step.shown["error"] = step.error[1]
        recorded.append(step)
    finally:
        torch.use_deterministic_algorithms(previous)
    return recorded


def _record(recorded: List[Step], call: str, fn: Callable[..., Any], args: tuple, kwargs: dict, metric: Any) -> Any:
    step = Step(call)
    result = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - the outcome compared
            step.error = (type(exc).__qualname__, str(exc))
            step.shown["error"] = f"{type(exc).__name__}: {exc}"
    step.warnings = tuple((w.category.__name__, str(w.message), _where(w.filename)) for w in caught)
    step.shown["warnings"] = repr(list(step.warnings))
    if call not in ("init", "del"):
        step.result, step.shown["result"] = canon(result), shown(result)
        states = states_of(metric)
        step.states, step.shown["states"] = canon(states), shown(states, 1200)
        step.inputs, step.shown["inputs"] = canon((args, kwargs)), shown((args, kwargs))
    recorded.append(step)
    return result if call == "init" else None


@dataclass
class Difference:
    """One aspect of one call that differs."""

    index: int
    call: str
    aspect: str  # "call", "error", "warnings", "result", "states", "inputs"
    release: str
    patched: str

    def __str__(self) -> str:
        return (f"  step {self.index} {self.call}(): {self.aspect} differ\n    release: {self.release}\n"
                f"    patched: {self.patched}")


ASPECTS = ("error", "warnings", "result", "states", "inputs")


def differences(release: List[Step], patched: List[Step]) -> List[Difference]:
    """Each aspect of each call where ``patched`` is not ``release``."""
    found = []
    for index, (r, p) in enumerate(zip(release, patched)):
        for aspect in ASPECTS:
            if getattr(r, aspect) != getattr(p, aspect):
                found.append(Difference(index, r.call, aspect, r.shown.get(aspect, repr(getattr(r, aspect))),
                                        p.shown.get(aspect, repr(getattr(p, aspect)))))
    if len(release) != len(patched):
        found.append(Difference(min(len(release), len(patched)), "?", "call", f"{len(release)} calls",
                                f"{len(patched)} calls"))
    return found


@dataclass(frozen=True)
class Correction:
    """A deliberate difference a patch keeps: ``covers(case, difference, release, patched, expected)``
    says whether it accounts for a difference (``expected``: the outcome of the case's ``corrected``
    calls on the release, where it has them); ``sticky``: the aspects it accounts for from that
    call on, once it accounted for one."""

    name: str
    reason: str
    covers: Callable[["Case", Difference, List[Step], List[Step], Optional[List[Step]]], bool]
    sticky: Tuple[str, ...] = ()


def _unchanged_inputs(case: Case, diff: Difference, release: List[Step], patched: List[Step],
                      expected: Optional[List[Step]]) -> bool:
    """The patched call left the caller's inputs as they were passed (the release wrote into them)."""
    if diff.aspect != "inputs" or "impute" not in case.tags:
        return False
    fresh = outcome_inputs(case, diff.index)
    return patched[diff.index].inputs == fresh


def outcome_inputs(case: Case, index: int) -> Any:
    """The canonical inputs of step ``index`` (1-based after init) as the source makes them."""
    space = dict(namespace())
    return canon(_call_args(space, case.steps[index - 1][1]))


def _as_corrected(aspects: Tuple[str, ...]) -> Callable[..., bool]:
    def covers(case: Case, diff: Difference, release: List[Step], patched: List[Step],
               expected: Optional[List[Step]]) -> bool:
        return (expected is not None and diff.aspect in aspects and diff.index < len(expected)
                and getattr(expected[diff.index], diff.aspect) == getattr(patched[diff.index], diff.aspect))
    return covers


def _tagged(tag: str, aspects: Tuple[str, ...]) -> Callable[..., bool]:
    def covers(case: Case, diff: Difference, release: List[Step], patched: List[Step],
               expected: Optional[List[Step]]) -> bool:
        return tag in case.tags and diff.aspect in aspects
    return covers


def _close(case: Case, diff: Difference, release: List[Step], patched: List[Step],
           expected: Optional[List[Step]]) -> bool:
    """Values equal but for the last bits (a broadcast MeanMetric weight)."""
    if "broadcast_weight" not in case.tags or diff.aspect not in ("result", "states"):
        return False
    return _near(getattr(release[diff.index], diff.aspect), getattr(patched[diff.index], diff.aspect))


def _near(a: Any, b: Any) -> bool:
    if isinstance(a, tuple) and a and a[0] == "tensor" and isinstance(b, tuple) and b and b[0] == "tensor":
        if a[:4] != b[:4] or a[5] != b[5]:
            return False
        dtype = _DTYPES.get(a[1].replace("torch.", ""))
        if dtype not in _AS_INT:
            return a == b
        x = torch.tensor(a[4], dtype=_AS_INT[dtype]).view(dtype).double()
        y = torch.tensor(b[4], dtype=_AS_INT[dtype]).view(dtype).double()
        return bool(torch.allclose(x, y, rtol=1e-5, atol=1e-6, equal_nan=True))
    if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b):
        return all(_near(x, y) for x, y in zip(a, b))
    return a == b


def _kept_batch(case: Case, diff: Difference, release: List[Step], patched: List[Step],
                expected: Optional[List[Step]]) -> bool:
    """The release raised in update()/forward(), patched raised the same type there: its states
    keep the bad batch (from then on, states and results may differ, and what later calls warn or
    raise; the raising call's message is still compared)."""
    if "checked" not in case.tags:
        return False
    for index, (r, p) in enumerate(zip(release[: diff.index + 1], patched[: diff.index + 1])):
        if r.call in ("update", "forward") and r.error is not None and p.error is not None \
                and r.error[0] == p.error[0]:
            return diff.aspect in ("states", "result") or (diff.index > index and diff.aspect in ("warnings",
                                                                                                 "error"))
    return False


def _no_write(case: Case, diff: Difference, release: List[Step], patched: List[Step],
              expected: Optional[List[Step]]) -> bool:
    """A float nan_strategy writes nothing into the caller's tensor: what the release's write raises
    (torch's in-place error on a leaf that requires grad, in forward()) or warns (torch's index_put_
    on an expanded tensor) does not come; the rest is compared with the imputed-beforehand run."""
    if "impute" not in case.tags or diff.aspect not in ("error", "warnings"):
        return False
    mine, theirs = patched[diff.index], release[diff.index]
    if diff.aspect == "error":
        return mine.error is None and theirs.error is not None and "in-place operation" in theirs.error[1]
    return expected is not None and diff.index < len(expected) and expected[diff.index].warnings == mine.warnings


def _denominator_kept(case: Case, diff: Difference, release: List[Step], patched: List[Step],
                      expected: Optional[List[Step]]) -> bool:
    """safe_divide (0.10.0-1.3.2): the release writes 1 into the caller's zero denominators, and a
    metric that divides by the same tensor again (BinaryFairness' rates) computes from the written
    one: the difference is the one the release gives with safe_divide alone patched."""
    if diff.aspect not in ("result", "states") or not any(
            row.name == "safe_divide" and row.state == "applied" for row in tmpatch.apply("safe_divide")):
        tmpatch.revert()
        return False
    try:
        alone = outcome(case)
    finally:
        tmpatch.revert()
    return diff.index < len(alone) and getattr(alone[diff.index], diff.aspect) == getattr(patched[diff.index],
                                                                                         diff.aspect)


#: the deliberate corrections (tmpatch's patches' docstrings, "Deliberate corrections", and the README)
CORRECTIONS: Tuple[Correction, ...] = (
    Correction("nan_check: the caller's tensors are never written into",
               "the release imputes a float nan_strategy into the caller's tensors (x[nans] = strategy): "
               "patched, the inputs after the call are the ones passed", _unchanged_inputs),
    Correction("nan_check: the caller's tensors are never written into, so its write's error and warning "
               "do not come", "a float nan_strategy on a leaf that requires grad (torch's in-place error in "
               "forward()) or an expanded tensor (torch's index_put_ warning)", _no_write),
    Correction("safe_divide: the caller's denominator is not overwritten",
               "0.10.0-1.3.2: the outcome of the release with safe_divide alone patched", _denominator_kept),
    Correction("nan_check: an imputed element gets weight 1",
               "float nan_strategy: the patched outcome equals the release's on the inputs imputed beforehand "
               "(NaN -> strategy, its weight 1)", _as_corrected(("result", "states")), ("result", "states")),
    Correction("nan_check: nan_strategy='disable' honours a user-supplied weight (#3434)",
               "the release replaces the weight by ones: not compared", _tagged("disable_weight",
                                                                                ("result", "states")),
               ("result", "states")),
    Correction("nan_check: a broadcast MeanMetric weight may differ in its last bits",
               "compared with rtol 1e-5", _close),
    Correction("checks reported as nan_check's: the bad batch is kept in the states",
               "retrieval_check, fairness_groups, tweedie_checks, bincount, nominal_bincount: the release raised "
               "before adding the batch; patched raises the same type, having added it", _kept_batch,
               ("states", "result")),
)


def check(case: Case) -> List[str]:
    """:func:`check_all` of one case."""
    return check_all([case])


def check_all(cases: Sequence[Case]) -> List[str]:
    """Run each case released, then patched (metrics built after one ``tmpatch.apply()``); the names of
    the corrections that accounted for a difference. Fails with every other difference and a reproducer."""
    tmpatch.revert()
    releases = [outcome(case) for case in cases]
    expected = [outcome(case, case.corrected) if case.corrected is not None else None for case in cases]
    try:
        tmpatch.apply()
        patched = [outcome(case) for case in cases]
    finally:
        tmpatch.revert()
    used: List[str] = []
    failures = []
    for case, release, mine, wanted in zip(cases, releases, patched, expected):
        left = _unaccounted(case, release, mine, wanted, used)
        if left:
            failures.append(_message(case, left, release, mine))
    if failures:
        raise AssertionError("\n\n".join(failures))
    return sorted(set(used))


def _unaccounted(case: Case, release: List[Step], patched: List[Step], expected: Optional[List[Step]],
                 used: List[str]) -> List[Difference]:
    left: List[Difference] = []
    masked: Dict[str, Tuple[int, str]] = {}  # aspect -> (from index, correction)
    for diff in differences(release, patched):
        held = masked.get(diff.aspect)
        if held is not None and diff.index >= held[0]:
            continue
        for correction in CORRECTIONS:
            if correction.covers(case, diff, release, patched, expected):
                used.append(correction.name)
                for aspect in correction.sticky:
                    masked.setdefault(aspect, (diff.index, correction.name))
                break
        else:
            left.append(diff)
    return left


def _message(case: Case, left: List[Difference], release: List[Step], patched: List[Step]) -> str:
    first = left[0]
    kinds = sorted({d.aspect for d in left})
    lines = [f"patched differs from the release in {', '.join(kinds)} "
             f"(first at step {first.index}, {first.call}(); deterministic={case.deterministic}):"]
    lines += [str(d) for d in left[:6]]
    if len(left) > 6:
        lines.append(f"  ... and {len(left) - 6} more")
    lines += ["reproducer (run it, then tmpatch.apply() and run it again):", case.source()]
    return "\n".join(lines)

