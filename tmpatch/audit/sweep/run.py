"""The library sweep (``tmpatch audit --all``): every concrete Metric class of the installed
torchmetrics, ``update()`` and ``forward()``, unpatched and patched, on simulated CUDA.

Each class is built with simple valid arguments and small generated inputs
(:mod:`tmpatch.audit.sweep.args`; the first input the release's own ``forward()`` accepts
on the CPU is kept), then audited; forward's syncs made inside a ``compute()`` are marked.
The causes of the syncs left patched, the results and the table are in
:mod:`tmpatch.audit.sweep.results`. Classes that need optional packages or pretrained
weights, take strings, or cannot be built are listed as skipped, with why. Also a
calibration source (:func:`calibration_cases`, found through
:data:`tmpatch.audit.calibrate.cases.SWEEP_MODULES`).
"""
from __future__ import annotations

import contextlib
import copy
import importlib
import inspect
import json
import logging
import textwrap
import warnings
from dataclasses import dataclass
from typing import Any, Dict, FrozenSet, Iterable, Iterator, List, Optional, Sequence, Tuple

import torch

import tmpatch
from tmpatch.audit.modes import restored_patches
from tmpatch.audit.oracle.api import audit, audit_simulated
from tmpatch.audit.oracle.report import AuditReport
from tmpatch.audit.oracle.sim import active, copy_modules, cuda_device, module_owner
from tmpatch.audit.sweep.args import input_candidates, kwargs_for, skip_reason
from tmpatch.audit.sweep.results import MODES, WIDTH, ClassResult, Sweep, render, shorten

log = logging.getLogger("tmpatch")

#: torchmetrics subpackages whose ``__all__`` is searched (the top level first); absent ones are passed over
SUBPACKAGES = ("", "aggregation", "classification", "regression", "image", "audio", "retrieval", "nominal",
               "segmentation", "detection", "clustering", "wrappers", "multimodal", "shape", "text", "video")

# --- classes -----------------------------------------------------------------------------------

def metric_classes() -> List[type]:
    """Concrete Metric subclasses exported by torchmetrics and its subpackages' ``__all__``
    (deprecated ``_Name`` aliases left out), by name."""
    import torchmetrics

    found: Dict[str, type] = {}
    for sub in SUBPACKAGES:
        try:
            module = importlib.import_module("torchmetrics" + (f".{sub}" if sub else ""))
        except Exception:  # noqa: BLE001 - a subpackage this release lacks, or one needing an extra
            continue
        for name in getattr(module, "__all__", ()):
            obj = getattr(module, name, None)
            if (name.startswith("_") or not inspect.isclass(obj) or obj.__name__.startswith("_")
                    or not issubclass(obj, torchmetrics.Metric)
                    or inspect.isabstract(obj)):
                continue
            found.setdefault(obj.__name__, obj)
    return [found[name] for name in sorted(found)]


# --- running -----------------------------------------------------------------------------------

@dataclass
class _Case:
    cls: type
    args: tuple
    kwargs: dict


def _build(cls: type) -> Any:
    return cls(**kwargs_for(cls))


def _pick_inputs(cls: type) -> Tuple[Optional[_Case], str]:
    """The first candidate input the release's own update accepts on the CPU, or why none."""
    try:
        metric = _build(cls)
    except (ImportError, ModuleNotFoundError) as exc:
        return None, f"needs an optional package ({exc})"
    except Exception as exc:  # noqa: BLE001
        if "install" in str(exc):
            return None, f"needs an optional package ({shorten(str(exc), 100)})"
        return None, f"cannot be built: {type(exc).__name__}: {shorten(str(exc), 120)}"
    last = ""
    for args, kwargs in input_candidates(cls, metric):
        try:
            copy.deepcopy(metric)(*args, **kwargs)  # forward: update, and compute on the batch
        except (ImportError, ModuleNotFoundError) as exc:
            return None, f"needs an optional package ({exc})"
        except Exception as exc:  # noqa: BLE001 - try the next candidate
            last = f"{type(exc).__name__}: {shorten(str(exc), 120)}"
            continue
        return _Case(cls, args, kwargs), ""
    return None, f"no generated input accepted ({last})"


def _describe(args: tuple, kwargs: dict) -> str:
    def one(v: Any) -> str:
        if isinstance(v, torch.Tensor):
            return f"{v.dtype}".replace("torch.", "") + str(list(v.shape))
        if isinstance(v, dict):
            return "{" + ", ".join(f"{k}: {one(x)}" for k, x in v.items()) + "}"
        return type(v).__name__
    return ", ".join([one(a) for a in args] + [f"{k}={one(v)}" for k, v in kwargs.items()])


def _mark_compute(owner: Any, spans: List[Tuple[int, int]]) -> None:
    """Wrap the ``compute`` of ``owner`` and its sub-metrics so that the syncs seen while one
    runs (``forward()`` computes the batch value) are known: ``spans`` gets (first, end) sync
    indices, and (-1, -1) when a compute raised."""
    import torchmetrics

    def syncs() -> int:
        sim = active()
        return 0 if sim is None else sum(p.is_sync for p in sim.sync_points)

    for module in owner.modules():
        if not isinstance(module, torchmetrics.Metric):
            continue
        inner = module.compute

        def marked(*args: Any, _inner: Any = inner, **kwargs: Any) -> Any:
            start = syncs()
            try:
                return _inner(*args, **kwargs)
            except BaseException:
                spans.append((-1, -1))
                raise
            finally:
                spans.append((start, syncs()))

        module.compute = marked  # type: ignore[method-assign]  # an instance attribute, as torchmetrics' own wrapper is


def _audit_call(fn: Any, case: _Case, real: bool) -> Tuple[AuditReport, FrozenSet[int]]:
    """The report of ``fn`` on the case's inputs, and the indices of its syncs made in a compute()."""
    if real:
        return audit(fn, *case.args, real=True, **case.kwargs), frozenset()
    fn, args, kwargs = copy_modules(fn, case.args, case.kwargs)
    spans: List[Tuple[int, int]] = []
    _mark_compute(module_owner(fn), spans)
    report = audit_simulated(fn, args, kwargs, cuda_device("cuda:0"), catch=True)
    return report, frozenset(i for start, end in spans for i in (range(start, end) if start >= 0 else (-1,)))


def _audit_class(case: _Case, real: bool) -> Dict[str, Tuple[AuditReport, FrozenSet[int]]]:
    metric = _build(case.cls)  # after apply()/revert(): torchmetrics binds update at construction
    return {"update": _audit_call(metric.update, case, real), "forward": _audit_call(metric.forward, case, real)}


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """torchmetrics' own warnings and the audit's "stopped early" log lines off."""
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        log.setLevel(level)


def run_sweep(names: Optional[Sequence[str]] = None, real: bool = False,
              exclude: Optional[Sequence[str]] = None) -> Sweep:
    """Audit every class (or those ``names``), unpatched then patched (every patch but
    ``exclude``); tmpatch is left as found."""
    import torchmetrics

    results: List[ClassResult] = []
    cases: Dict[str, _Case] = {}
    classes: Dict[str, type] = {}
    with _quiet():
        for cls in metric_classes():
            if names is not None and cls.__name__ not in names:
                continue
            classes[cls.__name__] = cls
            results.append(ClassResult(cls.__name__, cls.__module__, skipped=skip_reason(cls) or ""))
        with restored_patches():
            for mode in MODES:
                tmpatch.revert()
                if mode == "patched":
                    tmpatch.apply(exclude=list(exclude) if exclude else None)
                for result in results:
                    if result.skipped:
                        continue
                    cls = classes[result.name]
                    if mode == "unpatched":
                        tmpatch.revert()
                        case, why = _pick_inputs(cls)
                        if case is None:
                            result.skipped = why
                            continue
                        cases[result.name] = case
                        result.inputs = _describe(case.args, case.kwargs)
                    try:
                        for call, (report, in_compute) in _audit_class(cases[result.name], real).items():
                            result.reports.setdefault(call, {})[mode] = report
                            result.in_compute[(call, mode)] = in_compute
                    except Exception as exc:  # noqa: BLE001 - one class must not stop the sweep
                        log.info("tmpatch.audit.sweep.run: %s (%s): %r", result.name, mode, exc)
                        if mode == "unpatched":
                            result.skipped = f"cannot be audited: {type(exc).__name__}: {shorten(str(exc), 100)}"
    return Sweep(torchmetrics.__version__, results, tmpatch.status().release)  # what the gating found of its code


# --- entry points ------------------------------------------------------------------------------

def calibration_cases(real: bool) -> Iterable[Tuple[str, Any]]:
    """The calibration source (:mod:`tmpatch.audit.calibrate.cases`): every audited class, update and
    forward, unpatched and patched."""
    sweep = run_sweep(real=real)
    for result in sweep.audited:
        for call, modes in result.reports.items():
            for mode, report in modes.items():
                yield f"{result.name} | {call} | {mode}", report


def report_text(as_json: bool = False, names: Optional[Sequence[str]] = None) -> str:
    """What ``tmpatch audit --all [--json]`` prints: the table (or the JSON) of a sweep."""
    sweep = run_sweep(names)
    if as_json:
        return json.dumps(sweep.to_dict(), indent=2)
    head = textwrap.fill(f"tmpatch audit --all: torchmetrics {sweep.code or sweep.release}, simulated CUDA (no GPU "
                         "needed); every concrete Metric class,", WIDTH, subsequent_indent="    ",
                         break_long_words=False, break_on_hyphens=False)
    return (head + "\nsyncs per call, unpatched -> patched; under each class its remaining syncs "
            "(patched) and their cause\n\n" + render(sweep))
