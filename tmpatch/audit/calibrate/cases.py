"""The cases of the calibration (:mod:`tmpatch.audit.calibrate.run`): sources, timings, outcomes.

A source is ``source(real: bool) -> Iterable[(case name, report)]``; a report is an
:class:`~tmpatch.audit.AuditReport`, a :class:`~tmpatch.audit.BranchReport` or an
:class:`Outcome`. Built in: ``probes`` (:mod:`tmpatch.audit.calibrate.probes`) and ``panel``
(:mod:`tmpatch.audit.panel.run`, with the real time per ``update()``); a module named in
:data:`SWEEP_MODULES` that defines ``calibration_cases(real)`` (``audit --all``), and any
source given to :func:`add_source`.
"""
from __future__ import annotations

import importlib
import logging
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, Optional, Sequence, Tuple

import torch

import tmpatch
from tmpatch.audit import audit
from tmpatch.audit.calibrate.probes import PROBES
from tmpatch.audit.modes import deterministic, restored_patches
from tmpatch.audit.panel.run import find_row, run_panel

log = logging.getLogger("tmpatch")

#: modules that may contribute cases (``calibration_cases(real)``), imported when present
SWEEP_MODULES: Tuple[str, ...] = ("tmpatch.audit.sweep.run",)


@dataclass
class Outcome:
    """One case in one mode: the number of syncs (None: could not run), their kinds, an
    error, the real time per call, and (simulated side) whether the GPU's sync-debug mode is
    expected to see a sync (None: when the simulation sees one)."""

    syncs: Optional[int]
    kinds: Tuple[str, ...] = ()
    error: str = ""
    seconds: Optional[float] = None
    expected_real: Optional[bool] = None
    note: str = ""

    @property
    def verdict(self) -> Optional[bool]:
        """Whether it syncs (None: unknown)."""
        return None if self.syncs is None else self.syncs > 0


def outcome_of(report: Any, seconds: Optional[float] = None, **extra: Any) -> Outcome:
    """An :class:`Outcome` from an AuditReport, a BranchReport or an Outcome."""
    if isinstance(report, Outcome):
        return report
    error = getattr(report, "error", None)
    return Outcome(report.count, tuple(sorted({p.kind.value for p in report.sync_points})),
                   "" if error is None else f"{type(error).__name__}: {error}", seconds, **extra)


Source = Callable[[bool], Iterable[Tuple[str, Any]]]
SOURCES: Dict[str, Source] = {}


def add_source(name: str, source: Source) -> None:
    """Register a source: ``source(real)`` yields ``(case name, report)``."""
    SOURCES[name] = source


# --- timing -------------------------------------------------------------------------------------

def time_call(fn: Callable[[], Any], repeat: int) -> float:
    """Median seconds of ``fn()`` on the GPU (synchronised before and after each call)."""
    fn()  # warm-up
    times = []
    for _ in range(max(1, repeat)):
        torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _devices_needed(device: str) -> int:
    return torch.device(device).index + 1 if torch.device(device).index is not None else 1


def device_for(device: str) -> str:
    """``device`` where the GPU has it, else ``cuda:0`` (a GPU with one device)."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 2
    return device if _devices_needed(device) <= count else "cuda:0"


# --- the sources --------------------------------------------------------------------------------

def probe_cases(real: bool, repeat: int = 20) -> Iterable[Tuple[str, Any]]:
    """Every probe of the table (those needing more GPUs than present: skipped on a GPU)."""
    for probe in PROBES:
        if real and probe.devices > torch.cuda.device_count():
            yield probe.name, Outcome(None, error=f"needs {probe.devices} GPUs")
            continue
        try:
            report = audit(probe.fn, *probe.make(), real=real)
            seconds = _time_probe(probe, repeat) if real else None
        except Exception as exc:  # noqa: BLE001 - one case must not stop the others
            expected = probe.raises is not None and isinstance(exc, probe.raises)
            yield probe.name, Outcome(0 if expected else None, error=f"{type(exc).__name__}: {exc}")
            continue
        yield probe.name, outcome_of(report, seconds, expected_real=None if real else probe.expected_real,
                                     note=probe.note)


def _time_probe(probe: Any, repeat: int) -> Optional[float]:
    args = [a.to("cuda:0") if isinstance(a, torch.Tensor) else a for a in probe.make()]
    try:
        return time_call(lambda: probe.fn(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args]), repeat)
    except Exception:  # noqa: BLE001 - a probe that raises has no time
        return None


def panel_cases(real: bool, repeat: int = 20, names: Optional[Sequence[str]] = None) -> Iterable[Tuple[str, Any]]:
    """Every panel row: update and compute, unpatched and patched; on a GPU, with the time
    per ``update()``."""
    panel = run_panel(names, real=real, device_for=device_for if real else None)
    for row in panel.rows:
        if not row.available:
            continue
        for part in ("update", "compute"):
            for mode, audited in getattr(row, part).items():
                seconds = time_row(row.name, mode == "patched", repeat) if real and part == "update" else None
                yield f"{row.name} | {part} | {mode}", outcome_of(audited.report, seconds)


def time_row(name: str, patched: bool, repeat: int) -> Optional[float]:
    """Median GPU seconds of one row's ``update()`` (all its calls), unpatched or patched."""
    row = find_row(name)
    with restored_patches():
        tmpatch.revert()
        if patched:
            tmpatch.apply()
        calls = row.build()
        device = device_for(row.device)
        moved = [((t.to(device) if isinstance(t, torch.nn.Module) else t),
                  tuple(a.to(device) if isinstance(a, torch.Tensor) else a for a in args), kwargs)
                 for t, args, kwargs in calls]

        def run() -> None:
            for target, args, kwargs in moved:
                (target.update if isinstance(target, torch.nn.Module) else target)(*args, **kwargs)  # type: ignore[operator]  # an update

        try:
            with deterministic(row.deterministic), torch.cuda.device(device):
                return time_call(run, repeat)
        except Exception as exc:  # noqa: BLE001
            log.warning("tmpatch.audit.calibrate: cannot time %s: %s", name, exc)
            return None


def _source_name(module_name: str) -> str:
    """A sweep's source name: its module's, or its package's for a ``run`` module (``sweep``)."""
    parts = module_name.split(".")
    return parts[-2] if parts[-1] == "run" and len(parts) > 1 else parts[-1]


def sweep_sources() -> Dict[str, Source]:
    """The sources of :data:`SWEEP_MODULES` that are installed."""
    found: Dict[str, Source] = {}
    for module_name in SWEEP_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        cases = getattr(module, "calibration_cases", None)
        if callable(cases):
            found[_source_name(module_name)] = cases
    return found


def sources(repeat: int, names: Optional[Sequence[str]] = None) -> Dict[str, Source]:
    """The sources to run, in order: probes, panel, then sweeps and added sources."""
    chosen: Dict[str, Source] = {
        "probes": lambda real: probe_cases(real, repeat),
        "panel": lambda real: panel_cases(real, repeat),
    }
    chosen.update(sweep_sources())
    chosen.update(SOURCES)
    return {k: v for k, v in chosen.items() if names is None or k in names}


def collect(chosen: Dict[str, Source], real: bool) -> Dict[Tuple[str, str], Outcome]:
    """Run every source in one mode."""
    results: Dict[Tuple[str, str], Outcome] = {}
    for name, source in chosen.items():
        log.info("tmpatch.audit.calibrate: %s (%s)", name, "real" if real else "simulated")
        try:
            for case, report in source(real):
                results[(name, case)] = outcome_of(report)
        except Exception as exc:  # noqa: BLE001 - a broken source must not stop the others
            log.warning("tmpatch.audit.calibrate: source %s failed: %r", name, exc)
            results[(name, "(the source itself)")] = Outcome(None, error=f"{type(exc).__name__}: {exc}")
    return results
