"""The text of ``tmpatch audit``: the panel's table (120 columns), notes, totals, labels."""
from __future__ import annotations

import textwrap
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from tmpatch.audit.oracle.breaks import describe
from tmpatch.audit.oracle.locate import short_location
from tmpatch.audit.panel.run import Panel, RowResult, label_for
from tmpatch.control.report import grouped
from tmpatch.spec import Label

WIDTH = 120  #: every line of the text output fits this many columns


# --- cells and labels ---------------------------------------------------------------------------

def fit(text: str, indent: int = 0, width: int = WIDTH) -> List[str]:
    """``text`` wrapped to ``width`` columns, continuation lines ``indent`` deeper than its own."""
    lead = len(text) - len(text.lstrip(" "))
    return textwrap.wrap(text, width, subsequent_indent=" " * (lead + indent), break_on_hyphens=False,
                         break_long_words=True) or [""]


def tag(label: Optional[Label]) -> str:
    """The label word of a sync point (see ``--help``): ``inherent``, ``patch bincount``, ..."""
    if label is None:
        return "unexplained"
    category, patch = label.category, label.patch
    return f"patch {patch}" if category == "patch" and patch else category


def _fmt(a: Any) -> str:
    return "-" if a is None else str(a.count)


def _pair(results: Mapping[str, Any]) -> str:
    return f"{_fmt(results.get('unpatched'))} -> {_fmt(results.get('patched'))}"


def _breaks_pair(breaks: Mapping[str, Any]) -> str:
    cells = [getattr(breaks.get(mode), "cell", lambda: "-")() for mode in ("unpatched", "patched")]
    return f"{cells[0]} -> {cells[1]}"


# --- the panel's table -------------------------------------------------------------------------

def _counts(part: Mapping[str, Any]) -> Tuple[int, int]:
    unpatched, patched = (getattr(part.get(mode), "count", None) or 0 for mode in ("unpatched", "patched"))
    return unpatched, patched


def shown(row: RowResult) -> bool:
    """Whether a row is in the default table: it shows a patch not in force, or its audit failed,
    or its counts change, or its patched calls still have a point (a sync or an event reported
    apart); other n/a rows are not."""
    if row.stands_for:
        return True
    if row.error or not row.available:
        return bool(row.error)
    before, after = row.breaks.get("unpatched"), row.breaks.get("patched")
    if after is not None and (after.error or after.count or after.recompiles
                              or before is None or before.cell() != after.cell()):
        return True
    for part in (row.update, row.compute):
        was, now = _counts(part)
        patched = part.get("patched")
        if was != now or now or (patched is not None and patched.points):
            return True
    return False


def totals(rows: Sequence[RowResult]) -> str:
    """The totals line: sync points per update and per compute, unpatched -> patched, over ``rows``."""
    audited = [row for row in rows if row.available]
    update = [sum(pair) for pair in zip(*(_counts(row.update) for row in audited))] or [0, 0]
    compute = [sum(pair) for pair in zip(*(_counts(row.compute) for row in audited))] or [0, 0]
    return (f"total, {len(audited)} rows audited: {update[0]} -> {update[1]} sync points in update/forward, "
            f"{compute[0]} -> {compute[1]} in compute (unpatched -> patched)")


def render(panel: Panel, verbose: bool = False, all_rows: bool = False) -> str:
    """The table of a :class:`~tmpatch.audit.panel.run.Panel` (rows per :func:`shown` unless
    ``all_rows``), its notes, the totals line, and with ``verbose`` every sync point."""
    rows = [row for row in panel.rows if all_rows or shown(row)]
    legend: List[str] = []

    def mark(text: str) -> str:
        if text not in legend:
            legend.append(text)
        return f"[{legend.index(text) + 1}]"

    compiled = any(row.breaks for row in panel.rows)
    table = [("row", "update", "compute") + (("graph breaks",) if compiled else ()) + ("fixed by, notes",)]
    for row in rows:
        if not row.available:
            table.append((row.name, "n/a", "n/a") + (("n/a",) if compiled else ()) + (mark(row.why_na),))
            continue
        last = ", ".join(row.fixed_by())
        marks = " ".join(mark(text) for text in notes(row))
        compute = "-" if row.helper else _pair(row.compute)
        cells = (row.name, _pair(row.update), compute) + ((_breaks_pair(row.breaks),) if compiled else ())
        table.append(cells + (f"{last} {marks}".strip(),))
    columns = len(table[0]) - 1
    widths = [max(len(r[i]) for r in table) for i in range(columns)]
    start = sum(widths) + 2 * columns
    lines = []
    for r in table:
        head = f"{r[0]:<{widths[0]}}  " + "".join(f"{r[i]:>{widths[i]}}  " for i in range(1, columns))
        body = fit(r[-1], width=WIDTH - start) if r[-1] else [""]
        lines += [(head + body[0]).rstrip()] + [" " * start + more for more in body[1:]]
    lines.insert(1, "  ".join("-" * w for w in widths) + "  " + "-" * 15)
    hidden = [row for row in panel.rows if row not in rows]
    lost = [row for row in rows if row.stands_for]
    if lost:
        lines += fit(f"({len(lost)} {'rows show' if len(lost) > 1 else 'row shows'} what the patches not in force "
                     "would repair: "
                     + "; ".join(sorted({label for row in lost for label in row.stands_for})) + ")", 1)
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
    lines += ["", *fit(totals(panel.rows), 4)]
    if verbose:
        lines += ["", "sync points (label: see tmpatch audit --help):"] + _points(rows)
    return "\n".join(lines)


def notes(row: RowResult) -> List[str]:
    """The distinct reasons of a row's patched points (``label: reason``), in order."""
    reasons: List[str] = [f"error: {row.error}"] if row.error else []
    for audited in (row.update.get("patched"), row.compute.get("patched")):
        for point in [] if audited is None else audited.points:
            label = label_for(point)
            text = f"{tag(label)}: {'sync' if label is None else label.reason}"
            text += "" if point.is_sync else f" ({point.kind.value}, not a sync)"
            reasons += [] if text in reasons else [text]
        if audited is not None and audited.report is not None and not audited.report.complete:
            reasons += [] if "audit stopped early" in reasons else ["audit stopped early"]
    breaks = row.breaks
    reasons += [text for text in describe(breaks.get("unpatched"), breaks.get("patched")) if text not in reasons]
    return reasons


def _points(rows: Sequence[RowResult]) -> List[str]:
    lines: List[str] = []
    for row in rows:
        points = [(part, mode, point) for part in ("update", "compute")
                  for mode, audited in getattr(row, part).items() for point in audited.points]
        if points:
            lines.append(f"  {row.name}")
        for part, mode, point in points:
            extra = "" if point.is_sync else ", not a sync"
            lines += fit(f"    {part} {mode}: {point.kind.value} ({point.op}) [{tag(label_for(point))}{extra}]", 4)
            lines += fit(f"      at {short_location(point.location)} in {point.function}", 4)
    return lines


def header(panel: Panel) -> str:
    """The release, the mode, the patch states and how to read the counts."""
    mode = {"simulated": "simulated CUDA (no GPU needed: an oracle on fake CUDA tensors)",
            "real": "real GPU (torch.cuda.set_sync_debug_mode)"}.get(panel.mode, panel.mode)
    lines = fit(f"tmpatch audit: torchmetrics {panel.code or panel.release}, {mode}", 4)
    lines += patched_with(panel.patch_states)
    lines += ["sync points per call, unpatched -> patched. update: per update() (forward() runs it: a cost "
              "paid every step);", "compute: one compute() after one update, paid once per compute() "
              "(its result is read anyway); -: no compute()"]
    if any(row.breaks for row in panel.rows):
        lines += ["graph breaks: break sites of update() compiled with torch.compile(backend='eager') on the CPU, "
                  "unpatched -> patched;", "+N: calls run outside the graph on purpose; rcN: N frames recompiled "
                  "over 3 calls; crash: the first call raised"]
    return "\n".join(lines) + "\n"


def patched_with(states: Dict[str, str]) -> List[str]:
    """``patched with:`` and the patches grouped by state, a group a line (``applied (20): a, b, ...``;
    ``pending``: their modules were not imported by the rows)."""
    return ["patched with:"] + [f"  {line}" for line in grouped(states, width=WIDTH - 2)]
