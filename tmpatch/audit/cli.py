"""``tmpatch audit``: the host-device syncs of common metrics, or of the user's own step,
unpatched and patched.

Called by :mod:`tmpatch.cli` as ``main(argv) -> int`` with the arguments after ``audit``.
"""
from __future__ import annotations

import argparse
import difflib
import json
import sys
import textwrap
from typing import Dict, List, Optional, Sequence, Tuple

WIDTH = 120  #: every line of the text output fits this many columns

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
  unexplained  none of the above (in your own code: yours to remove)"""

FAIL_RULE = """\
--fail-on-sync: exit 1 when the patched update() of a row (or the patched --step)
still has a sync point not labelled "inherent" or "validation", or when a row (or
the step) could not be audited to its end. Syncs in compute() and unpatched syncs
never fail."""

EPILOG = LABELS_HELP + "\n\n" + FAIL_RULE + """

exit status: 0 done; 1 --fail-on-sync found a sync (or torchmetrics cannot be
imported, or torch is older than 2.1); 2 usage error (e.g. no row matches --metric,
a --step that cannot be loaded or that raises)."""


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
    parser.add_argument("--calibrate", action="store_true",
                        help="on a GPU: run the panel and the probe table simulated and real, and "
                             "print where they differ; see python -m tmpatch.audit.calibrate --help")
    return parser


# --- text --------------------------------------------------------------------------------------

def fit(text: str, indent: int = 0, width: int = WIDTH) -> List[str]:
    """``text`` wrapped to ``width`` columns, continuation lines ``indent`` deeper than its own."""
    lead = len(text) - len(text.lstrip(" "))
    return textwrap.wrap(text, width, subsequent_indent=" " * (lead + indent), break_on_hyphens=False,
                         break_long_words=True) or [""]


def tag(label: Optional[object]) -> str:
    """The label word of a sync point (see ``--help``): ``inherent``, ``patch bincount``, ..."""
    if label is None:
        return "unexplained"
    category, patch = label.category, label.patch  # type: ignore[attr-defined]
    return f"patch {patch}" if category == "patch" and patch else category


def _fmt(a: Optional[object]) -> str:
    return "-" if a is None else str(a.count)  # type: ignore[attr-defined]


def _pair(results: Dict[str, object]) -> str:
    return f"{_fmt(results.get('unpatched'))} -> {_fmt(results.get('patched'))}"


def _location(location: str) -> str:
    """Shorten a path to its package-relative part (``torchmetrics/...``, ``tmpatch/...``)."""
    path, _, line = location.rpartition(":")
    for package in ("torchmetrics/", "tmpatch/"):
        at = path.replace("\\", "/").rfind("/" + package)
        if at >= 0:
            return f"{path[at + 1:]}:{line}"
    return location


# --- the panel's table -------------------------------------------------------------------------

def _counts(part: Dict[str, object]) -> Tuple[int, int]:
    return tuple(getattr(part.get(mode), "count", None) or 0 for mode in ("unpatched", "patched"))  # type: ignore


def shown(row: "object") -> bool:
    """Whether a row is in the default table: its audit failed, or its counts change, or its
    patched calls still have a point (a sync or an event reported apart); n/a rows are not."""
    if row.error or not row.available:  # type: ignore[attr-defined]
        return bool(row.error)  # type: ignore[attr-defined]
    for part in (row.update, row.compute):  # type: ignore[attr-defined]
        before, after = _counts(part)
        patched = part.get("patched")
        if before != after or after or (patched is not None and patched.points):
            return True
    return False


def totals(rows: Sequence["object"]) -> str:
    """The totals line: sync points per update and per compute, unpatched -> patched, over ``rows``."""
    audited = [row for row in rows if row.available]  # type: ignore[attr-defined]
    update = [sum(pair) for pair in zip(*(_counts(row.update) for row in audited))] or [0, 0]  # type: ignore
    compute = [sum(pair) for pair in zip(*(_counts(row.compute) for row in audited))] or [0, 0]  # type: ignore
    return (f"total, {len(audited)} rows audited: {update[0]} -> {update[1]} sync points in update/forward, "
            f"{compute[0]} -> {compute[1]} in compute (unpatched -> patched)")


def render(panel: "object", verbose: bool = False, all_rows: bool = False) -> str:
    """The table of a :class:`~tmpatch.audit.panel.Panel` (rows per :func:`shown` unless
    ``all_rows``), its notes, the totals line, and with ``verbose`` every sync point."""
    rows = [row for row in panel.rows if all_rows or shown(row)]  # type: ignore[attr-defined]
    legend: List[str] = []

    def mark(text: str) -> str:
        if text not in legend:
            legend.append(text)
        return f"[{legend.index(text) + 1}]"

    table = [("row", "update", "compute", "fixed by, notes")]
    for row in rows:
        if not row.available:
            table.append((row.name, "n/a", "n/a", mark(row.why_na)))
            continue
        last = ", ".join(row.fixed_by())
        marks = " ".join(mark(text) for text in notes(row))
        compute = "-" if row.helper else _pair(row.compute)
        table.append((row.name, _pair(row.update), compute, f"{last} {marks}".strip()))
    widths = [max(len(r[i]) for r in table) for i in range(3)]
    start = sum(widths) + 6
    lines = []
    for r in table:
        head = f"{r[0]:<{widths[0]}}  {r[1]:>{widths[1]}}  {r[2]:>{widths[2]}}  "
        body = fit(r[3], width=WIDTH - start) if r[3] else [""]
        lines += [(head + body[0]).rstrip()] + [" " * start + more for more in body[1:]]
    lines.insert(1, "  ".join("-" * w for w in widths) + "  " + "-" * 15)
    hidden = [row for row in panel.rows if row not in rows]  # type: ignore[attr-defined]
    if hidden:
        na = sum(not row.available for row in hidden)
        lines += fit(f"({len(hidden) - na} rows with no sync, unpatched or patched, "
                     + (f"and {na} rows n/a here " if na else "") + "not shown: --all-rows shows them)", 1)
    step = next((row for row in rows if row.name == "training step"), None)
    if step is not None:
        lines += fit(f"training step: {step.doc}", 4)
    if legend:
        lines += ["", "notes (of the patched calls, and why a row is n/a):"]
        for i, text in enumerate(legend, 1):
            lines += fit(f"  [{i}] {text}", 4)
    lines += ["", *fit(totals(panel.rows), 4)]  # type: ignore[attr-defined]
    if verbose:
        lines += ["", "sync points (label: see tmpatch audit --help):"] + _points(rows)
    return "\n".join(lines)


def notes(row: "object") -> List[str]:
    """The distinct reasons of a row's patched points (``label: reason``), in order."""
    from tmpatch.audit.panel import label_for

    reasons: List[str] = [f"error: {row.error}"] if row.error else []  # type: ignore[attr-defined]
    for audited in (row.update.get("patched"), row.compute.get("patched")):  # type: ignore[attr-defined]
        for point in [] if audited is None else audited.points:
            label = label_for(point)
            text = f"{tag(label)}: {'sync' if label is None else label.reason}"
            text += "" if point.is_sync else f" ({point.kind.value}, not a sync)"
            reasons += [] if text in reasons else [text]
        if audited is not None and audited.report is not None and not audited.report.complete:
            reasons += [] if "audit stopped early" in reasons else ["audit stopped early"]
    return reasons


def _points(rows: Sequence["object"]) -> List[str]:
    from tmpatch.audit.panel import label_for

    lines: List[str] = []
    for row in rows:
        points = [(part, mode, point) for part in ("update", "compute")
                  for mode, audited in getattr(row, part).items() for point in audited.points]
        if points:
            lines.append(f"  {row.name}")  # type: ignore[attr-defined]
        for part, mode, point in points:
            extra = "" if point.is_sync else ", not a sync"
            lines += fit(f"    {part} {mode}: {point.kind.value} ({point.op}) [{tag(label_for(point))}{extra}]", 4)
            lines += fit(f"      at {_location(point.location)} in {point.function}", 4)
    return lines


def header(panel: "object") -> str:
    """The release, the mode, the patch states and how to read the counts."""
    mode = {"simulated": "simulated CUDA (no GPU needed: an oracle on fake CUDA tensors)",
            "real": "real GPU (torch.cuda.set_sync_debug_mode)"}.get(panel.mode, panel.mode)  # type: ignore
    lines = [f"tmpatch audit: torchmetrics {panel.release}, {mode}"]  # type: ignore[attr-defined]
    lines += fit(patched_with(panel.patch_states), 4)  # type: ignore[attr-defined]
    lines += ["sync points per call, unpatched -> patched. update: per update() (forward() runs it: a cost "
              "paid every step);", "compute: one compute() after one update, paid once per compute() "
              "(its result is read anyway); -: no compute()"]
    return "\n".join(lines) + "\n"


def patched_with(states: Dict[str, str]) -> str:
    """``patched with: applied a, b; not-needed c`` (states grouped, in catalogue order)."""
    groups: Dict[str, List[str]] = {}
    for name, state in states.items():
        groups.setdefault(state, []).append(name)
    return "patched with: " + "; ".join(f"{state} {', '.join(names)}" for state, names in groups.items())


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
    close = difflib.get_close_matches(unknown[0], list(names) + sorted({n.split(" (")[0] for n in names}), n=3)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    return (f"tmpatch audit: no row matches --metric {unknown[0]!r}{hint} (a row name, a metric class or part "
            f"of a name; tmpatch audit --list shows the {len(names)} rows)")


def _run(args: argparse.Namespace) -> int:
    from tmpatch.audit import support

    problem = support.problem()
    if problem is not None:
        print(f"tmpatch audit: {problem}", file=sys.stderr)
        return 1
    if args.step is not None or args.real:
        if args.step is None or args.metric or args.list or args.all_rows:
            print("tmpatch audit: --real goes with --step, and --step with neither --metric, --list nor "
                  "--all-rows", file=sys.stderr)
            return 2
        from tmpatch.audit import step_cli

        return step_cli.main(args.step, real=args.real, as_json=args.json, fail_on_sync=args.fail_on_sync)
    from tmpatch.audit import panel as panel_module

    if args.list:
        print("\n".join(panel_module.ROW_NAMES))
        return 0
    names: Optional[List[str]] = None
    if args.metric:
        names, unknown = select(args.metric, panel_module.ROW_NAMES)
        if unknown:
            print(_unknown(unknown, panel_module.ROW_NAMES), file=sys.stderr)
            return 2
    try:
        import torchmetrics  # noqa: F401 - the subject of the audit
    except Exception as exc:  # noqa: BLE001
        print(f"tmpatch audit: cannot import torchmetrics ({type(exc).__name__}: {exc})", file=sys.stderr)
        return 1
    result = panel_module.run_panel(names, real=False if args.simulated else None)
    if args.json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
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
        from tmpatch.audit import calibrate

        return calibrate.main([a for a in argv if a != "--calibrate"])
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help (0) or a usage error (2)
        return int(exc.code or 0)
    return _run(args)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
