"""sdr_solve: SignalDistortionRatio solves for its filter without reading the solver's error code.

Defect: ``signal_distortion_ratio`` solves the Toeplitz system of each signal with
``torch.linalg.solve``, which checks the solver's error code on the host to raise on a
singular system (``torch.linalg.LinAlgError``): one device read on every ``update()`` of
SignalDistortionRatio, with no argument to turn it off. Not fixed upstream (1.9.0
included).

Repair: the class ``update`` marks the update of a metric with a deferred-report book
(built while ``deferred_reports`` is applied). In a marked update an edit hands the
solve to :func:`torch.linalg.solve_ex`, the very solver ``torch.linalg.solve`` runs
before its check (the solution is the same, bit for bit), and counts the singular
systems on the device; the release's ``LinAlgError`` (torch's message first, tmpatch's note
after it) is raised once, from a later update, the next ``compute()`` or settle point. On the
CPU, where the check costs nothing, the class ``update`` runs the release's update unmarked:
its error from that update, before a state changes. Outside a marked update (the functional
API, metrics built before ``apply()``) the release's ``torch.linalg.solve`` runs.

Deliberate difference (on a device only): a batch with a singular system is added to the states (upstream,
``update()`` raised before); its SDR is whatever the solver gave (NaN or infinite) until
``reset()``.

Policy ``checks`` (``TMPATCH_CHECKS``): ``eager`` leaves the update unmarked, so the release's
code runs, its error raised in ``update()`` with its syncs.

Releases: 0.10.0-1.9.0 (two spellings of the solve: a module alias ``solve`` until 1.2.0,
``torch.linalg.solve`` from 1.2.1; one class ``update``).
"""
from __future__ import annotations

from types import ModuleType
from typing import Any, Callable, Dict, List, Tuple

from tmpatch.runtime import deferred, host
from tmpatch.runtime.compiled import compiling
from tmpatch.runtime.deferred.marking import Marker
from tmpatch.spec import PATCHED, Edit, Label, Patch, Rewrite, Target, Together, Variant, inline, since, span

#: torch's message for a singular system (``torch.linalg.solve`` of one system, torch 2.1-2.13)
MESSAGE = "torch.linalg.solve: The solver failed because the input matrix is singular."


def _message() -> str:
    """Torch's own message for a singular system, as this torch words it."""
    import torch

    try:
        torch.linalg.solve(torch.zeros(1, 1), torch.zeros(1))
    except torch.linalg.LinAlgError as exc:
        return str(exc)
    return MESSAGE


def _report(top: Any, found: List[Tuple[Any, int]], all_ranks: bool) -> None:
    """On a device: torch's LinAlgError, once, for every update that met a singular system."""
    import torch

    count = sum(n for _, n in found)
    where = " on some rank" if all_ranks else ""
    raise deferred.error_as_release(torch.linalg.LinAlgError, _message(), (
        f"tmpatch sdr_solve: {count} update(s) of {type(top).__name__}{where} since the last report "
        f"met a singular system (which batch element: not read on the device); reported at {deferred.point()} "
        "instead of in update(). Unlike without tmpatch, those batches were added to the metric's states: "
        "reset() discards them. TMPATCH_CHECKS=eager raises it in update(), as without tmpatch"))


#: updates that met a singular system, reported at compute
RECORD = deferred.Record("sdr_solve", _report)

#: the marked update of the metric running in this thread / task (class ``update`` below)
MARK = Marker("tmpatch_sdr", RECORD)


def build_update(module: ModuleType) -> Callable[..., Any]:
    """``SignalDistortionRatio.update``, installed itself (``spec.inline``): the release's update,
    marked when the metric has a book. On the CPU (:func:`tmpatch.runtime.host.on_host`), where the
    solver's check costs nothing, the release's update unmarked: its error from that update."""
    import torch

    recorded, slot, Tensor = MARK.waits, MARK.slot, torch.Tensor

    def update(self: Any, preds: Any, target: Any, *, _tmpatch_route: Any) -> Any:
        original = _tmpatch_route.original
        if (not _tmpatch_route.on or (type(preds) is Tensor and host.on_host(preds) and not compiling())
                or not recorded(self)):
            return original(self, preds, target)
        token = slot.set(self)
        try:
            return original(self, preds, target)
        finally:
            slot.reset(token)

    return inline(update)


def _names(module: ModuleType) -> Dict[str, Any]:
    import torch

    linalg = torch.linalg

    def solve(a: Any, b: Any) -> Any:
        """The release's ``torch.linalg.solve(a, b)``; in a marked update on a device, its solver without
        the check, the failures counted for later."""
        metric = MARK.get()
        if metric is None or (host.on_host(a) and not compiling()):  # the check costs nothing on the CPU
            return linalg.solve(a, b)
        result, info = linalg.solve_ex(a, b)
        RECORD.add(metric, info.any())
        return result

    return {"_tmpatch_solve": solve}


def _edit(call: str) -> Rewrite:
    return Rewrite((Edit(f"sol = {call}(r, b)", "sol = _tmpatch_solve(r, b)"),), _names)


PATCH = Patch(
    name="sdr_solve",
    summary="SignalDistortionRatio's torch.linalg.solve reads the solver's error code on each update(); the "
            "failures are counted on the device and reported later, once, without a sync",
    known=since("0.10.0"),
    upstream="not fixed upstream (torch.linalg.solve always checks)",
    changes="on a GPU a singular system raises torch's LinAlgError once "
            "(from a later update(), or compute()), the batch in the states "
            "(upstream and on the CPU: raised in that update())",
    requires=("deferred_reports",),
    labels=(
        Label(PATCHED, "SignalDistortionRatio solves with torch.linalg.solve, which reads its error code to raise on "
              "a singular system; the sdr_solve patch counts it on the device and reports it later, once",
              function="signal_distortion_ratio", op="aten._linalg_check_errors"),
    ),
    together=(Together("the solve is deferred only in the update that marks it"),),
    targets=(
        Target(module="torchmetrics.functional.audio.sdr", qualname="signal_distortion_ratio", variants=(
            # 0.10: ``solve = torch.linalg.solve`` from torch 1.8 (a fall-back below, never taken here)
            Variant(span("0.10.0", "0.10.3"), "862bc502821a6c96", _edit("solve")),
            Variant(span("0.11.0", "0.11.4"), "aa0b6fc284d04b48", _edit("solve")),
            Variant(span("1.0.0", "1.2.0"), "c74594abad3b8610", _edit("solve")),
            Variant(span("1.2.1", "1.9.0"), "171e276254d99c9c", _edit("torch.linalg.solve")),
        )),
        Target(module="torchmetrics.audio.sdr", qualname="SignalDistortionRatio.update",
               variants=(Variant(span("0.10.0", "1.9.0"), "346b759df3d2878c", build_update),)),
    ),
)
