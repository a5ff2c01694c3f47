"""``tmpatch audit``: the host-device syncs of common metrics, unpatched and patched.

Called by :mod:`tmpatch.cli` as ``main(argv) -> int`` with the arguments after ``audit``.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Dict, List, Optional, Sequence

DESCRIPTION = """\
Audit a built-in panel of metric calls for host-device synchronisations, on the
torchmetrics release installed here: per update() and per compute() (after one
update), on the release's own code and with tmpatch applied, side by side. Without
a GPU the calls run on simulated CUDA tensors and an oracle finds the sync points;
with one, torch.cuda.set_sync_debug_mode counts them. tmpatch is left as found."""

FAIL_RULE = """\
--fail-on-sync: exit 1 when the patched update() of a row still has a sync point
that is not labelled "inherent" (no implementation can avoid it, e.g. CUDA
bincount, CatMetric dropping NaN) or "validation" (validate_args=True), or when
a row could not be audited. Syncs in compute() and unpatched syncs never fail."""

EPILOG = FAIL_RULE + """

exit status: 0 done; 1 --fail-on-sync found a sync (or torchmetrics cannot be
imported, or torch is older than 2.1); 2 usage error (e.g. an unknown --metric
name)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tmpatch audit", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--metric", action="append", metavar="NAME",
                        help="audit only this row (repeatable; case-insensitive; --list shows the names)")
    parser.add_argument("--list", action="store_true", help="print the row names and exit")
    parser.add_argument("--json", action="store_true", help="print the whole result, every sync point, as JSON")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="list each sync point: kind, op, file:line, function, label")
    parser.add_argument("--fail-on-sync", action="store_true", help="exit 1 when a patched update still syncs "
                        "(see below)")
    parser.add_argument("--simulated", action="store_true", help="simulate CUDA even when a GPU is present")
    parser.add_argument("--calibrate", action="store_true",
                        help="on a GPU: run the panel and the probe table simulated and real, and "
                             "print where they differ; see python -m tmpatch.audit.calibrate --help")
    return parser


def _fmt(a: Optional[object]) -> str:
    return "-" if a is None else str(a.count)  # type: ignore[attr-defined]


def _pair(results: Dict[str, object], helper_na: bool) -> str:
    if helper_na:
        return "n/a"
    return f"{_fmt(results.get('unpatched'))} -> {_fmt(results.get('patched'))}"


def _location(location: str) -> str:
    """Shorten a path to its package-relative part (``torchmetrics/...``, ``tmpatch/...``)."""
    path, _, line = location.rpartition(":")
    for package in ("torchmetrics/", "tmpatch/"):
        at = path.replace("\\", "/").rfind("/" + package)
        if at >= 0:
            return f"{path[at + 1:]}:{line}"
    return location


def render(panel: "object", verbose: bool = False) -> str:
    """The table (and with ``verbose`` every sync point) of a :class:`~tmpatch.audit.panel.Panel`."""
    from tmpatch.audit.panel import label_for

    legend: List[str] = []
    table = [("row", "update syncs", "compute syncs", "fixed by", "note")]
    for row in panel.rows:  # type: ignore[attr-defined]
        if not row.available:
            table.append((row.name, "n/a", "n/a", "", row.why_na))
            continue
        marks = []
        for text in row.notes():
            if text not in legend:
                legend.append(text)
            marks.append(f"[{legend.index(text) + 1}]")
        table.append((row.name, _pair(row.update, False), _pair(row.compute, row.helper),
                      ",".join(row.fixed_by()), " ".join(marks)))
    widths = [max(len(r[i]) for r in table) for i in range(4)]
    lines = [f"{r[0]:<{widths[0]}}  {r[1]:>{widths[1]}}  {r[2]:>{widths[2]}}  {r[3]:<{widths[3]}}  {r[4]}".rstrip()
             for r in table]
    lines.insert(1, "  ".join("-" * w for w in widths) + "  ----")
    if legend:
        lines += ["", "notes (remaining syncs, patched):"]
        lines += [f"  [{i}] {text}" for i, text in enumerate(legend, 1)]
    if verbose:
        lines += ["", "sync points:"]
        for row in panel.rows:  # type: ignore[attr-defined]
            for part in ("update", "compute"):
                for mode, audited in getattr(row, part).items():
                    for point in audited.points:
                        label = label_for(point)
                        tag = f"  [{label.category}]" if label else "  [unlabelled]"
                        tag += "" if point.is_sync else "  (not a sync)"
                        lines.append(f"  {row.name} | {part} {mode} | {point.kind.value} | {point.op} | "
                                     f"{_location(point.location)} | {point.function}{tag}")
    return "\n".join(lines)


def header(panel: "object") -> str:
    """The release, the mode and the patch states."""
    mode = {"simulated": "simulated CUDA (no GPU needed: an oracle on fake CUDA tensors)",
            "real": "real GPU (torch.cuda.set_sync_debug_mode)"}.get(panel.mode, panel.mode)  # type: ignore
    states = ", ".join(f"{k} {v}" for k, v in panel.patch_states.items())  # type: ignore[attr-defined]
    return (f"tmpatch audit: torchmetrics {panel.release}, {mode}\n"  # type: ignore[attr-defined]
            f"patched with: {states}\n"
            "syncs per call: unpatched -> patched; compute after one update\n")


def _run(args: argparse.Namespace) -> int:
    from tmpatch.audit import support

    problem = support.problem()
    if problem is not None:
        print(f"tmpatch audit: {problem}", file=sys.stderr)
        return 1
    from tmpatch.audit import panel as panel_module

    if args.list:
        print("\n".join(panel_module.ROW_NAMES))
        return 0
    names = args.metric
    for name in names or ():
        try:
            panel_module.find_row(name)
        except KeyError:
            print(f"tmpatch audit: unknown --metric {name!r}; valid names:\n  "
                  + "\n  ".join(panel_module.ROW_NAMES), file=sys.stderr)
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
        print(render(result, verbose=args.verbose))
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
