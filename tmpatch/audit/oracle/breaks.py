"""Graph breaks and recompiles of a call compiled with ``torch.compile``, next to its syncs.

:func:`graph_breaks` compiles ``fn`` (``backend="eager"``: dynamo's tracing, no code
generation) on the CPU tensors it is given, as a user's compiled step would, and reports

* the distinct places (``file:line``) where the first call breaks the graph, with dynamo's
  reason (``torch._dynamo.explain``);
* calls left out of the graph on purpose (a ``torch.compiler.disable``-d function, such
  as compiled_update's update count under ``update_count="outside"``): one break each,
  which ``explain`` does not list;
* the frames compiled again after the first call (recompiles), over ``steps`` calls;
* the error, when the first call raises inside dynamo (a crash).

Every call runs on a deep copy of the modules it reaches (as :func:`tmpatch.audit.audit`
does), so the caller's metrics are left as they were. Dynamo's caches are reset before
and after (``torch._dynamo.reset``): run it where nothing else is compiled, as the
``tmpatch audit --graph-breaks`` command line does.
"""
from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional

from tmpatch.audit.oracle.locate import short_path
from tmpatch.runtime.compiled import reset_dynamo

log = logging.getLogger("tmpatch")

#: what dynamo's reason for a call to a ``torch.compiler.disable``-d function says (2.1-2.13)
_DISABLED = ("disable()`d function", "_dynamo.disable", "torch.compiler.disable", "disabled function")


@dataclass
class Breaks:
    """The graph breaks of one compiled call; ``error`` set: the first call raised."""

    sites: List[str] = field(default_factory=list)  #: ``file:line: reason``, distinct, in order
    outside: int = 0  #: calls run outside the graph on purpose (``torch.compiler.disable``)
    recompiles: int = 0  #: frames compiled after the first call
    steps: int = 0
    error: str = ""

    @property
    def count(self) -> int:
        """Break sites, the calls left outside the graph included."""
        return len(self.sites) + self.outside

    def cell(self) -> str:
        """The table's cell: ``3``, ``0+1`` (one call outside the graph), ``crash``; `` rcN``:
        N recompiles."""
        if self.error:
            return "crash"
        text = f"{len(self.sites)}+{self.outside}" if self.outside else str(len(self.sites))
        return text + (f" rc{self.recompiles}" if self.recompiles else "")

    def to_dict(self) -> Dict[str, Any]:
        return {"sites": list(self.sites), "outside": self.outside, "recompiles": self.recompiles,
                "steps": self.steps, "error": self.error or None}


def _reason(text: object) -> str:
    line = str(text).strip().splitlines()[0] if str(text).strip() else "?"
    return line[:100]


def _is_outside(reason: str) -> bool:
    return any(word in reason for word in _DISABLED)


def graph_breaks(fn: Callable[..., Any], *args: Any, steps: int = 3, **kwargs: Any) -> Breaks:
    """Compile ``fn(*args, **kwargs)`` (CPU, ``backend="eager"``) and report its graph breaks
    and recompiles over ``steps`` calls (the same inputs each time); see the module's text."""
    import torch
    import torch._dynamo
    from torch._dynamo.utils import counters

    # here, not at the top: the command line's text imports this module, and below the audit's
    # torch floor the simulation cannot be imported (the command line says why instead)
    from tmpatch.audit.oracle.sim import copy_modules

    result = Breaks(steps=steps)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quiet = logging.getLogger("torch._dynamo")
        level = quiet.level
        quiet.setLevel(logging.CRITICAL)
        try:
            reset_dynamo()
            counters.clear()
            call, a, k = copy_modules(fn, args, kwargs)
            try:
                explained = torch._dynamo.explain(call)(*a, **k)
            except Exception as exc:  # noqa: BLE001 - a crash inside dynamo is the finding
                result.error = f"{type(exc).__name__}: {_reason(exc)}"
                return result
            for item in explained.break_reasons:
                frame = item.user_stack[-1] if item.user_stack else None
                where = f"{short_path(frame.filename)}:{frame.lineno}" if frame is not None else "?"
                site = f"{where}: {_reason(item.reason)}"
                if not any(s.startswith(where + ":") for s in result.sites):
                    result.sites.append(site)
            result.outside = sum(1 for reason in counters["graph_break"] if _is_outside(reason))
            reset_dynamo()
            counters.clear()
            call, a, k = copy_modules(fn, args, kwargs)
            compiled = torch.compile(call, backend="eager")
            compiled(*a, **k)
            first = counters["frames"]["ok"]
            for _ in range(steps - 1):
                compiled(*a, **k)
            result.recompiles = counters["frames"]["ok"] - first
        except Exception as exc:  # noqa: BLE001 - a later step's crash: reported, never raised
            result.error = result.error or f"{type(exc).__name__}: {_reason(exc)}"
        finally:
            reset_dynamo()
            counters.clear()
            quiet.setLevel(level)
    return result


def describe(before: Optional[Breaks], after: Optional[Breaks]) -> List[str]:
    """Notes for a row: the patched breaks' places, the calls left outside the graph and a
    crash (unpatched too when only it crashed); recompiles are in the cell."""
    lines: List[str] = []
    if before is not None and before.error and (after is None or not after.error):
        lines.append(f"compiled unpatched: crash, {before.error}")
    if after is None:
        return lines
    if after.error:
        lines.append(f"compiled patched: crash, {after.error}")
    lines += [f"graph break at {site}" for site in after.sites]
    if after.outside:
        lines.append(f"{after.outside} call(s) run outside the graph on purpose (torch.compiler.disable), "
                     "e.g. the update count under update_count='outside' (the default, 'device', adds it in the graph)")
    return lines
