"""``python -m tmpatch.audit.calibrate`` (and ``tmpatch audit --calibrate``): the command line
of :mod:`tmpatch.audit.calibrate.run`, which is the library part (sources, comparison, report)."""
from __future__ import annotations

import argparse
import json
import sys
from typing import List, Optional, Sequence

import torch

from tmpatch.audit import support
from tmpatch.audit.calibrate import cases, run as calibrate


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tmpatch.audit.calibrate",
                                     description=(calibrate.__doc__ or "").split("\n\n")[0],
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
    try:
        args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    except SystemExit as exc:
        return int(exc.code or 0)
    problem = support.problem()
    if problem is not None:
        print(f"calibrate: {problem}", file=sys.stderr)
        return 2
    chosen = cases.sources(args.repeat, args.source)
    unknown = sorted(set(args.source or ()) - set(chosen))
    if unknown:
        print(f"calibrate: unknown --source {', '.join(unknown)}; known: {', '.join(cases.sources(1))}",
              file=sys.stderr)
        return 2
    gpu = not args.simulated_only and torch.cuda.is_available()
    if not gpu and not args.simulated_only:  # at once: the simulated half alone takes minutes
        print("calibrate: no CUDA GPU here (torch.cuda.is_available() is False): the calibration compares "
              "simulated with real runs; --simulated-only runs the simulated half alone", file=sys.stderr)
        return 2
    if gpu:
        torch.cuda.init()  # before the simulated half: it then never shims CUDA's initialisation
    simulated = cases.collect(chosen, real=False)
    if not gpu:
        comparisons = calibrate.compare(simulated, None)
        text = calibrate.render(comparisons, calibrate.header(False))
        _write(args, text, comparisons)
        print(text)
        return 0
    comparisons = calibrate.compare(simulated, cases.collect(chosen, real=True))
    text = calibrate.render(comparisons, calibrate.header(True))
    _write(args, text, comparisons)
    print(text)
    return 1 if any(c.status in ("differs", "error") for c in comparisons) else 0


def _write(args: argparse.Namespace, text: str, comparisons: List[calibrate.Comparison]) -> None:
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            handle.write(f"$ python -m tmpatch.audit.calibrate {' '.join(sys.argv[1:])}\n{text}\n")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump([c.to_dict() for c in comparisons], handle, indent=1, default=str)
