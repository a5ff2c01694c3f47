"""Calibrate the simulated audit on a real GPU: ``python -m tmpatch.audit.calibrate``
(also ``tmpatch audit --calibrate``).

Runs every case twice, simulated (fake CUDA tensors, the oracle) and real (the GPU,
``torch.cuda.set_sync_debug_mode("warn")``), with real timings, and prints where the
verdicts differ. The cases come from sources:

* ``probes``: the probe table (:mod:`tmpatch.audit.calibrate.probes`), one event per function;
* ``panel``: the built-in panel (:mod:`tmpatch.audit.panel.run`), update and compute, unpatched
  and patched, with the real time per ``update()`` unpatched and patched;
* any module named in :data:`tmpatch.audit.calibrate.cases.SWEEP_MODULES` that imports and defines
  ``calibration_cases(real: bool) -> Iterable[tuple[str, report]]`` (a report is an
  :class:`~tmpatch.audit.AuditReport`, a :class:`~tmpatch.audit.BranchReport` or an
  :class:`Outcome`): ``audit --all`` plugs in there, or through :func:`tmpatch.audit.calibrate.cases.add_source`.

Without a GPU the command stops at once (exit 2, one line), or, with ``--simulated-only``,
prints the simulated verdicts (exit 0). Exit 0: no
unexpected difference; 1: differences; 2: no GPU (or a usage error).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional, Tuple

import torch

from tmpatch.audit.calibrate.cases import Outcome

# --- comparing ----------------------------------------------------------------------------------

@dataclass
class Comparison:
    source: str
    case: str
    simulated: Outcome
    real: Optional[Outcome]
    status: str  #: same, differs, expected, count, error, skipped

    def to_dict(self) -> Dict[str, Any]:
        return {"source": self.source, "case": self.case, "status": self.status,
                "simulated": asdict(self.simulated), "real": None if self.real is None else asdict(self.real)}


def compare(simulated: Dict[Tuple[str, str], Outcome],
            real: Optional[Dict[Tuple[str, str], Outcome]]) -> List[Comparison]:
    """One :class:`Comparison` per simulated case (``real`` None: status ``simulated``)."""
    out = []
    for key, sim in simulated.items():
        got = None if real is None else real.get(key)
        if real is None:
            status = "simulated"
        elif got is None or got.verdict is None or sim.verdict is None:
            status = "skipped" if got is not None and got.error.startswith("needs") else "error"
        elif got.verdict != sim.verdict:
            status = "expected" if sim.expected_real is not None and sim.expected_real == got.verdict else "differs"
        elif got.syncs != sim.syncs:
            status = "count"
        else:
            status = "same"
        out.append(Comparison(key[0], key[1], sim, got, status))
    return out


def _fmt(outcome: Optional[Outcome]) -> str:
    if outcome is None:
        return "-"  # not run (no GPU)
    if outcome.syncs is None:
        return f"n/a ({outcome.error[:40]})" if outcome.error else "n/a"
    return f"{outcome.syncs}" + (f" ({', '.join(outcome.kinds)})" if outcome.kinds else "")


def render(comparisons: List[Comparison], header: str) -> str:
    """The report: every case, the differences, the timings, a summary."""
    lines = [header, "", f"{'source':<8} {'case':<64} {'simulated':<40} {'real':<40} status"]
    for c in comparisons:
        ms = "" if c.real is None or c.real.seconds is None else f" {c.real.seconds * 1e3:.3f} ms"
        lines.append(f"{c.source:<8} {c.case[:64]:<64} {_fmt(c.simulated)[:40]:<40} {(_fmt(c.real) + ms)[:40]:<40} "
                     f"{c.status}")
    differs = [c for c in comparisons if c.status in ("differs", "expected", "error")]
    if differs:
        lines += ["", "where simulated and real differ:"]
        for c in differs:
            why = {"expected": "expected: " + (c.simulated.note or "the sync-debug mode does not see it"),
                   "error": "could not compare: " + ((c.real.error if c.real else "") or c.simulated.error)}.get(
                c.status, "the simulated verdict is wrong")
            lines.append(f"  {c.source} {c.case}: simulated {_fmt(c.simulated)}, real {_fmt(c.real)}; {why}")
    timed = _row_timings(comparisons)
    if timed:
        lines += ["", "real time per update() (median), unpatched -> patched:"]
        lines += [f"  {row:<60} {u * 1e3:8.3f} ms -> {p * 1e3:8.3f} ms  ({p / u:.2f})" for row, u, p in timed]
    statuses = ("same", "count", "differs", "expected", "error", "skipped", "simulated")
    counts = {s: sum(c.status == s for c in comparisons) for s in statuses}
    lines += ["", "calibration: " + ", ".join(f"{n} {s}" for s, n in counts.items() if n or s in statuses[:5])]
    return "\n".join(lines)


def _row_timings(comparisons: List[Comparison]) -> List[Tuple[str, float, float]]:
    times: Dict[str, Dict[str, float]] = {}
    for c in comparisons:
        if c.source == "panel" and c.real is not None and c.real.seconds:
            row, part, mode = c.case.split(" | ")
            times.setdefault(row, {})[mode] = c.real.seconds
    return [(row, t["unpatched"], t["patched"]) for row, t in times.items() if {"unpatched", "patched"} <= set(t)]


def header(real: bool) -> str:
    """Versions and the device."""
    try:
        import torchmetrics

        release = torchmetrics.__version__
    except ImportError:
        release = "not installed"
    device = (f"{torch.cuda.get_device_name(0)} ({torch.cuda.device_count()} device(s))" if real
              else "no GPU: simulated only")
    return f"tmpatch audit calibration: torch {torch.__version__}, torchmetrics {release}, {device}"

