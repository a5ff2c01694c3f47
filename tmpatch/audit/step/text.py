"""``tmpatch audit --step``'s output: each sync at the user's line, unpatched -> patched."""
from __future__ import annotations

import linecache
from typing import Any, Dict, List, Tuple

from tmpatch.audit.oracle.autograd import LEFT_OUT, NOT_RUN
from tmpatch.audit.oracle.locate import short_location
from tmpatch.audit.panel.run import label_for
from tmpatch.audit.panel.text import WIDTH, fit, tag
from tmpatch.audit.step.run import StepRun, _library_dirs, yours
from tmpatch.control.report import State

MODES = ("unpatched", "patched")


def _label(point: Any, skip: Tuple[str, ...]) -> str:
    label = label_for(point)
    if label is None and yours(point.location.rpartition(":")[0], skip):
        return "your code"
    return tag(label)


def _passes(n: int) -> str:
    return "1 pass" if n == 1 else f"{n} passes"


def _groups(runs: Dict[str, StepRun]) -> Dict[Tuple[str, str], Dict[Any, List[int]]]:
    """user line -> (kind, op, location, function, is_sync) -> [unpatched count, patched count]."""
    groups: Dict[Tuple[str, str], Dict[Any, List[int]]] = {}
    for index, mode in enumerate(MODES):
        for seen in runs[mode].seen:
            p = seen.point
            key = (p.kind.value, p.op, p.location, p.function, p.is_sync, p)
            counts = groups.setdefault((seen.where, seen.function), {})
            match = next((k for k in counts if k[:5] == key[:5]), key)
            counts.setdefault(match, [0, 0])[index] += 1
    return groups


def _states(states: Dict[str, str]) -> str:
    """``24 applied, 3 pending (until their modules are imported: dice_weights, ...), 5 not-needed``."""
    counts: Dict[str, int] = {}
    for state in states.values():
        counts[state] = counts.get(state, 0) + 1
    order = [state for state in State.ORDER if state in counts] + [s for s in counts if s not in State.ORDER]
    parts = []
    for state in order:
        part = f"{counts[state]} {state}"
        if state == State.PENDING:
            part += f" ({State.PENDING_MEANS}: {', '.join(n for n, s in states.items() if s == state)})"
        parts.append(part)
    return ", ".join(parts)


def render(spec: str, runs: Dict[str, StepRun], release: str, states: Dict[str, str], real: bool) -> str:
    """The text report of :func:`tmpatch.audit.step.run.audit_step`'s runs."""
    skip = _library_dirs()
    mode = "real GPU (torch.cuda.set_sync_debug_mode)" if real else \
        "simulated CUDA (fake tensors: shapes and devices, no values; a value read gets a plausible answer)"
    lines = fit(f"tmpatch audit --step {spec}: torchmetrics {release}", 4) + mode.splitlines()
    lines += fit("patched: tmpatch.apply(); after the step " + _states(states) + " (tmpatch status names them)", 4)
    what = "the second call of the step the function returned (the set-up before it and the first call, with " \
        "its first-call work such as a MetricCollection's compute-group check, are not counted)" \
        if runs["unpatched"].split else "one call of the function, set-up included (return the step to leave it out)"
    lines += fit(f"audited: {what}", 4)
    backward, left_out = (max(getattr(runs[m], name) for m in MODES) for name in ("backward", "backward_left_out"))
    if backward and not real:
        lines += fit(f"backward ({_passes(backward)} per step): run by tmpatch's own walk of the autograd graph "
                     f"(torch's engine needs a GPU); its ops are audited, {LEFT_OUT}", 4)
    if left_out and not real:
        lines += fit(f"backward ({_passes(left_out)} per step): {NOT_RUN}", 4)
    lines.append("")
    before, after = (runs[m].count for m in MODES)
    lines.append(f"sync points per step, unpatched -> patched: {before} -> {after}")
    first = [sum(s.point.is_sync for s in runs[m].first) for m in MODES]
    if runs["unpatched"].split and first != [before, after]:  # first-call work: shown, not counted
        lines.append(f"first call (set-up, not counted), unpatched -> patched: {first[0]} -> {first[1]}")
    for mode in MODES:
        run = runs[mode]
        if run.stopped:
            where = "in the first call (the audited call did not run)" if run.phase == "first call" else "early"
            lines += fit(f"{mode}: the simulation stopped {where}, {run.stopped}: an op whose output size "
                         "it cannot work out; syncs after it are not seen (--real on a GPU runs it)", 4)
    groups = _groups(runs)
    if groups:
        lines += ["", "at your code (unpatched -> patched), then each sync (label: see tmpatch audit --help):"]
    for (where, function), counts in groups.items():
        path, _, number = where.rpartition(":")
        source = linecache.getline(path, int(number)).strip() if number.isdigit() else ""
        total = [sum(c[i] for k, c in counts.items() if k[4]) for i in (0, 1)]
        head = f"{short_location(where)} in {function}: {total[0]} -> {total[1]}"
        lines += fit(f"{head}   {source}" if len(head) + len(source) + 3 <= WIDTH else head, 6)
        for key, (was, now) in counts.items():
            kind, op, location, inner, is_sync, point = key
            extra = "" if is_sync else ", not a sync"
            lines += fit(f"    {was} -> {now}  {kind} ({op}) [{_label(point, skip)}{extra}]", 10)
            if location != where:
                lines += fit(f"              at {short_location(location)} in {inner}", 4)
    return "\n".join(lines)


def to_dict(spec: str, runs: Dict[str, StepRun], release: str, states: Dict[str, str], real: bool) -> Dict[str, Any]:
    """Plain-JSON form: every point of each run, with the user's line."""
    def point(seen: Any) -> Dict[str, Any]:
        label = label_for(seen.point)
        return dict(seen.point.to_dict(), at=seen.where, at_function=seen.function,
                    label=None if label is None else {"category": label.category, "reason": label.reason})

    return {"step": spec, "torchmetrics": release, "mode": "real" if real else "simulated", "patches": states,
            **{mode: {"count": run.count, "split": run.split, "stopped": run.stopped or None,
                      "stopped_in": run.phase if run.stopped else None, "backward": run.backward,
                      "backward_left_out": run.backward_left_out,
                      "points": [point(s) for s in run.seen],
                      "first_call": {"count": sum(s.point.is_sync for s in run.first),
                                     "points": [point(s) for s in run.first]}}
               for mode, run in runs.items()}}
