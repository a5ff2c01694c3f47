"""``tmpatch audit --step SPEC``: the command's run, output and exit status."""
from __future__ import annotations

import json
import sys
from typing import Optional

from tmpatch.audit.panel.run import TOLERATED, label_for
from tmpatch.audit.step.run import StepError, StepRun, audit_step, load
from tmpatch.audit.step.text import render, to_dict


def main(spec: str, real: bool = False, as_json: bool = False, fail_on_sync: bool = False,
         device: Optional[str] = None) -> int:
    """``tmpatch audit --step SPEC``: 0 done, 1 ``fail_on_sync`` and the patched step still syncs
    (or the simulation stopped early), 2 the step cannot be loaded or raises."""
    try:
        fn = load(spec)
        runs = audit_step(fn, device or "cuda:0", real=real)
    except StepError as exc:
        print(f"tmpatch audit: {exc}", file=sys.stderr)
        return 2
    try:
        import torchmetrics

        release = torchmetrics.__version__
    except ImportError:
        release = "(not installed)"
    states = runs["patched"].states
    args = (spec, runs, release, states, real)
    print(json.dumps(to_dict(*args), indent=2) if as_json else render(*args))
    patched = runs["patched"]
    if fail_on_sync and (patched.stopped or _untolerated(patched)):
        print(f"tmpatch audit: --fail-on-sync: the patched step still has {_untolerated(patched)} sync point(s) "
              "not labelled inherent or validation" + (" and stopped early" if patched.stopped else ""),
              file=sys.stderr)
        return 1
    return 0


def _untolerated(run: StepRun) -> int:
    labels = [label_for(s.point) for s in run.seen if s.point.is_sync]
    return sum(label is None or label.category not in TOLERATED for label in labels)

