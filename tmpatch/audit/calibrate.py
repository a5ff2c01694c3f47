"""Calibrate the simulated audit on a real GPU: ``python -m tmpatch.audit.calibrate``
(also ``tmpatch audit --calibrate``).

Runs every case twice, simulated (fake CUDA tensors, the oracle) and real (the GPU,
``torch.cuda.set_sync_debug_mode("warn")``), with real timings, and prints where the
verdicts differ. The cases come from sources:

* ``probes``: the probe table (:mod:`tmpatch.audit.probes`), one event per function;
* ``panel``: the built-in panel (:mod:`tmpatch.audit.panel`), update and compute, unpatched
  and patched, with the real time per ``update()`` unpatched and patched;
* any module named in :data:`tmpatch.audit.cases.SWEEP_MODULES` that imports and defines
  ``calibration_cases(real: bool) -> Iterable[tuple[str, report]]`` (a report is an
  :class:`~tmpatch.audit.AuditReport`, a :class:`~tmpatch.audit.BranchReport` or an
  :class:`Outcome`): ``audit --all`` plugs in there, or through :func:`add_source`.

Without a GPU the simulated half runs and the command stops before the real one (exit 2),
or, with ``--simulated-only``, prints the simulated verdicts (exit 0). Exit 0: no
unexpected difference; 1: differences; 2: no GPU (or a usage error).
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from tmpatch.audit.cases import (SOURCES, Outcome, add_source, collect, device_for, outcome_of,  # noqa: F401
                                 panel_cases, probe_cases, sources, time_call)


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


# --- command line -------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tmpatch.audit.calibrate", description=__doc__.split("\n\n")[0],
                                     epilog="exit status: 0 no unexpected difference; 1 differences; 2 no GPU "
                                            "(or a usage error)")
    parser.add_argument("--source", action="append", metavar="NAME",
                        help="only this source: probes, panel, or a sweep (repeatable)")
    parser.add_argument("--repeat", type=int, default=20, help="timed calls per case (median; default 20)")
    parser.add_argument("--simulated-only", action="store_true", help="no GPU needed: the simulated verdicts only")
    parser.add_argument("--json", metavar="FILE", help="also write every comparison as JSON")
    parser.add_argument("--out", metavar="FILE", help="also write the report to FILE")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the calibration; returns the exit status."""
    from tmpatch.audit import support

    try:
        args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as exc:
        return int(exc.code or 0)
    problem = support.problem()
    if problem is not None:
        print(f"calibrate: {problem}", file=sys.stderr)
        return 2
    chosen = sources(args.repeat, args.source)
    unknown = sorted(set(args.source or ()) - set(chosen))
    if unknown:
        print(f"calibrate: unknown --source {', '.join(unknown)}; known: {', '.join(sources(1))}", file=sys.stderr)
        return 2
    gpu = not args.simulated_only and torch.cuda.is_available()
    if gpu:
        torch.cuda.init()  # before the simulated half: it then never shims CUDA's initialisation
    simulated = collect(chosen, real=False)
    if not gpu:
        comparisons = compare(simulated, None)
        text = render(comparisons, header(False))
        _write(args, text, comparisons)
        print(text)
        if args.simulated_only:
            return 0
        print("calibrate: no CUDA GPU here: the simulated half ran; the real half needs a GPU "
              "(or pass --simulated-only)", file=sys.stderr)
        return 2
    comparisons = compare(simulated, collect(chosen, real=True))
    text = render(comparisons, header(True))
    _write(args, text, comparisons)
    print(text)
    return 1 if any(c.status in ("differs", "error") for c in comparisons) else 0


def _write(args: argparse.Namespace, text: str, comparisons: List[Comparison]) -> None:
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            handle.write(f"$ python -m tmpatch.audit.calibrate {' '.join(sys.argv[1:])}\n{text}\n")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump([c.to_dict() for c in comparisons], handle, indent=1, default=str)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
