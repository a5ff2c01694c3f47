"""``tmpatch audit``: the host-device syncs of common metrics, or of the user's own step,
unpatched and patched.

Called by :mod:`tmpatch.cli` as ``main(argv) -> int`` with the arguments after ``audit``.
"""
from __future__ import annotations

import argparse
import difflib
import importlib
import json
import sys
from typing import List, Optional, Sequence, Tuple

from tmpatch.audit import support

DESCRIPTION = """\
Audit a built-in panel of metric calls for host-device synchronisations, on the
torchmetrics release installed here: per update() and per compute() (after one
update), on the release's own code and with tmpatch applied, side by side. Without
a GPU the calls run on simulated CUDA tensors and an oracle finds the sync points;
with one, torch.cuda.set_sync_debug_mode counts them. tmpatch is left as found.
By default the table shows the rows that change or still sync (--all-rows: all).

--step MODULE:FUNCTION (or path/to/file.py:FUNCTION) audits your own step instead:
FUNCTION(device) builds its metrics and tensors on the device it is given and
returns the step (a callable without arguments); the step is audited, unpatched
and patched, and every sync is listed at the line of your code that led to it."""

LABELS_HELP = """\
labels of a sync point (-v, the notes, --step):
  inherent     no implementation of the call can avoid it (CatMetric dropping NaN
               elements, an unbinned curve's length at compute)
  validation   input validation the user asked for (validate_args=True)
  patch NAME   tmpatch's patch NAME removes it (seen patched: NAME is not in effect)
  upstream     a defect of the release, fixed in a later one
  deferred     a check a patch moved from update() to compute(): one read per compute
  unexplained  none of the above
  your code    (--step) a sync in your own code, none of the above: yours to remove"""

FAIL_RULE = """\
--fail-on-sync: exit 1 when the patched update() of a row (or the patched --step)
still has a sync point not labelled "inherent" or "validation", or when a row (or
the step) could not be audited to its end. Syncs in compute() and unpatched syncs
never fail."""

EPILOG = LABELS_HELP + "\n\n" + FAIL_RULE + """

options: --step, --all and --list choose another audit than the panel (one of them
at most); with --step: --real, --json, --fail-on-sync; with --all: --json; with --list:
none. An option the chosen audit does not take is a usage error.

exit status: 0 done; 1 --fail-on-sync found a sync (or torchmetrics cannot be
imported, or torch is older than 2.1); 2 usage error (e.g. no row matches --metric,
options that do not go together, a --step that cannot be loaded or that raises)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tmpatch audit", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    parser.add_argument("--metric", action="append", metavar="NAME",
                        help="audit only these rows: a row name, a metric class (MeanMetric: its 3 rows) or "
                             "part of a name; case-insensitive, repeatable (--list shows the names)")
    parser.add_argument("--all-rows", action="store_true",
                        help="show every row (default: rows that change or still sync, and rows named by --metric)")
    parser.add_argument("--list", action="store_true", help="print the row names and exit")
    parser.add_argument("--json", action="store_true", help="print the whole result, every sync point, as JSON")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="list each sync point: kind, op, file:line, function, label")
    parser.add_argument("--fail-on-sync", action="store_true", help="exit 1 when a patched update still syncs "
                        "(see below)")
    parser.add_argument("--simulated", action="store_true", help="simulate CUDA even when a GPU is present")
    parser.add_argument("--step", metavar="MODULE:FUNCTION",
                        help="audit your own step: FUNCTION(device) in MODULE (or path/to/file.py) builds its "
                             "metrics on the device and returns the step; simulated CUDA unless --real")
    parser.add_argument("--real", action="store_true", help="with --step: run on the GPU (CUDA sync debug mode)")
    parser.add_argument("--all", action="store_true",
                        help="the library sweep: every concrete Metric class of the installed torchmetrics, update() "
                             "and forward(), unpatched and patched (simulated CUDA; with --json too)")
    parser.add_argument("--graph-breaks", action="store_true",
                        help="also compile each row's update with torch.compile (backend eager, on the CPU) and show "
                             "its graph breaks and recompiles, unpatched and patched, next to the syncs")
    parser.add_argument("--calibrate", action="store_true",
                        help="on a GPU: run the panel and the probe table simulated and real, and "
                             "print where they differ; see python -m tmpatch.audit.calibrate --help")
    return parser


# --- running -----------------------------------------------------------------------------------

def select(wanted: Sequence[str], names: Sequence[str]) -> Tuple[List[str], List[str]]:
    """The rows ``wanted`` names (an exact row name, else a metric class, else a substring of
    row names; case-insensitive), in panel order, and the ``wanted`` entries matching none."""
    chosen, unknown = set(), []
    for want in wanted:
        key = want.strip().lower()
        found = [n for n in names if n.lower() == key] or \
            [n for n in names if n.split(" (")[0].lower() == key] or [n for n in names if key in n.lower()]
        chosen.update(found)
        if not found:
            unknown.append(want)
    return [n for n in names if n in chosen], unknown


def _unknown(unknown: Sequence[str], names: Sequence[str]) -> str:
    candidates = list(dict.fromkeys([*names, *(n.split(" (")[0] for n in names)]))
    close = difflib.get_close_matches(unknown[0], candidates, n=3)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    return (f"tmpatch audit: no row matches --metric {unknown[0]!r}{hint} (a row name, a metric class or part "
            f"of a name; tmpatch audit --list shows the {len(names)} rows)")


#: what each audit takes besides the option that chooses it (the panel: none chooses it)
TAKES = {
    "the panel": ("--metric", "--all-rows", "--json", "--verbose", "--fail-on-sync", "--simulated", "--graph-breaks"),
    "--step": ("--real", "--json", "--fail-on-sync"),
    "--all": ("--json",),
    "--list": (),
}


def conflict(args: argparse.Namespace) -> Optional[str]:
    """Why the options given do not go together (None when they do): two audits chosen, or an
    option the chosen audit does not take."""
    ways = [way for way, chosen in (("--step", args.step is not None), ("--all", args.all), ("--list", args.list))
            if chosen]
    if len(ways) > 1:
        return f"{ways[0]} and {ways[1]} are different audits; give one of them"
    way = ways[0] if ways else "the panel"
    given = {"--metric": bool(args.metric), "--all-rows": args.all_rows, "--json": args.json,
             "--verbose": args.verbose, "--fail-on-sync": args.fail_on_sync, "--simulated": args.simulated,
             "--graph-breaks": args.graph_breaks, "--real": args.real}
    for option, on in given.items():
        if on and option not in TAKES[way]:
            homes = [home for home, takes in TAKES.items() if option in takes]
            return f"{option} goes with {' or '.join(homes)}, not with {way}"
    return None


def _run(args: argparse.Namespace) -> int:
    problem = support.problem()
    if problem is not None:
        print(f"tmpatch audit: {problem}", file=sys.stderr)
        return 1
    if args.step is not None:
        from tmpatch.audit.step import cli as step_cli

        return step_cli.main(args.step, real=args.real, as_json=args.json, fail_on_sync=args.fail_on_sync)
    from tmpatch.audit.panel import rows as panel_rows, run as panel_module

    if args.list:  # the default rows, then those shown for a patch not in force
        print("\n".join(panel_rows.ROW_NAMES + panel_rows.PATCH_ROW_NAMES))
        return 0
    if args.all:  # the library sweep: tmpatch/audit/sweep/run.py
        from tmpatch.audit.sweep import run as sweep

        print(sweep.report_text(as_json=args.json))
        return 0
    names: Optional[List[str]] = None
    if args.metric:
        every = panel_rows.ROW_NAMES + panel_rows.PATCH_ROW_NAMES
        names, unknown = select(args.metric, every)
        if unknown:
            print(_unknown(unknown, every), file=sys.stderr)
            return 2
    try:
        importlib.import_module("torchmetrics")  # the subject of the audit
    except Exception as exc:  # noqa: BLE001
        print(f"tmpatch audit: cannot import torchmetrics ({type(exc).__name__}: {exc})", file=sys.stderr)
        return 1
    result = panel_module.run_panel(names, real=False if args.simulated else None, breaks=args.graph_breaks)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        from tmpatch.audit.panel.text import header, render  # the simulation: after the torch check

        print(header(result))
        print(render(result, verbose=args.verbose, all_rows=args.all_rows or names is not None))
    if args.fail_on_sync:
        failing = result.failing()
        if failing:
            print(f"tmpatch audit: --fail-on-sync: {len(failing)} row(s) still sync in a patched update: "
                  + ", ".join(row.name for row in failing), file=sys.stderr)
            return 1
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run ``tmpatch audit`` with ``argv`` (default ``sys.argv[1:]``); returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--calibrate" in argv:  # its own options: python -m tmpatch.audit.calibrate --help
        from tmpatch.audit.calibrate import cli as calibrate_cli

        return calibrate_cli.main([a for a in argv if a != "--calibrate"])
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2)
        return int(exc.code or 0)
    problem = conflict(args)
    if problem is not None:  # one line, as argparse words a usage error
        print(f"{parser.prog}: error: {problem}", file=sys.stderr)
        return 2
    return _run(args)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
