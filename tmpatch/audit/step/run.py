"""``tmpatch audit --step``: the host-device syncs of the user's own step, unpatched and patched.

The contract: ``FUNCTION(device)`` (or ``FUNCTION()``, which then uses ``"cuda"`` itself)
builds the step's metrics and tensors on ``device`` and returns the step, a callable
without arguments. What runs before it returns is set-up, not counted; the step is then
called twice and the second call is audited: the first is set-up too (work done on a
first call only: a MetricCollection's compute-group check, an optimizer's new state). A
function that returns no callable is the step itself, set-up included. It runs twice,
with tmpatch reverted and applied (it must build its metrics itself, so that the patched
run has patched metrics), on simulated CUDA unless ``real``; each sync is reported at the
line of the user's code that led to it (the innermost frame outside torch, torchmetrics,
tmpatch, wrapt and the standard library) and where it happened.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import inspect
import os
import sys
import sysconfig
import traceback
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple, cast

import torch

import tmpatch
from tmpatch.audit.modes import restored_patches
from tmpatch.audit.oracle.api import _SYNC_MESSAGE, _real_point, _sync_debug
from tmpatch.audit.oracle.locate import short_path
from tmpatch.audit.oracle.recorder import FAKE_ERRORS, SyncRecorder
from tmpatch.audit.oracle.report import SyncKind, SyncPoint
from tmpatch.audit.oracle.sim import cuda_device, simulated_cuda

USAGE = "--step wants MODULE:FUNCTION or path/to/file.py:FUNCTION"


class StepError(Exception):
    """A step that cannot be loaded or run; the message is one line for the user."""


@dataclass(frozen=True)
class Seen:
    """One point of a step, with the line of the user's code that led to it."""

    point: SyncPoint
    where: str  #: ``file:line`` of the user's frame
    function: str


@dataclass
class StepRun:
    """One run of the step: ``unpatched`` or ``patched``."""

    mode: str
    seen: List[Seen] = field(default_factory=list)
    split: bool = False  #: the function returned the step: its set-up and first call are not counted
    first: List[Seen] = field(default_factory=list)  #: the points of the first call (split only; not counted)
    phase: str = "set-up"  #: what ran last: ``set-up``, ``first call``, ``second call`` (split) or ``step`` (whole)
    stopped: str = ""  #: the simulation stopped early there (an op it cannot size)
    backward: int = 0  #: backward passes of the audited call run on simulated CUDA (tmpatch.audit.oracle.autograd)
    backward_left_out: int = 0  #: backward passes of the audited call this torch cannot simulate
    states: Dict[str, str] = field(default_factory=dict)  #: patch states after the run (patched: applied)

    @property
    def count(self) -> int:
        """Number of sync points (events reported apart not counted)."""
        return sum(s.point.is_sync for s in self.seen)


# --- loading -----------------------------------------------------------------------------------

def load(spec: str) -> Callable[..., Any]:
    """The function named by ``MODULE:FUNCTION`` or ``path/to/file.py:FUNCTION`` (``FUNCTION``
    may be dotted: ``Class.method``); :class:`StepError` says what is wrong."""
    source, colon, name = spec.rpartition(":")
    if not colon or not source or not name:
        raise StepError(f"{USAGE}, got {spec!r}")
    if source.endswith(".py") or os.sep in source or "/" in source:
        if not os.path.isfile(source):
            raise StepError(f"--step: no file {source!r}")
        what, folder = f"file {source!r}", os.path.dirname(os.path.abspath(source))
        loader = importlib.util.spec_from_file_location(f"tmpatch_step_{abs(hash(source))}", os.path.abspath(source))

        def call() -> Any:
            module = importlib.util.module_from_spec(loader)  # type: ignore[arg-type]  # a .py path: a spec
            sys.modules[loader.name] = module  # type: ignore[union-attr]  # a spec; as a script: dataclasses, pickle
            loader.loader.exec_module(module)  # type: ignore[union-attr]  # a .py path: a source loader
            return module
    else:
        what, folder = f"module {source!r}", os.getcwd()  # as ``python -m``: the current directory's modules
        call = lambda: importlib.import_module(source)  # noqa: E731
    added = folder not in sys.path
    if added:  # as ``python FILE``: the file's folder, for its own imports
        sys.path.insert(0, folder)
    try:
        module = call()
    except ModuleNotFoundError as exc:
        raise StepError(f"--step: cannot import {what} ({exc})") from None
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the user's module: any error, one line
        raise StepError(f"--step: importing {what} raised {_one_line(exc)}") from None
    finally:
        if added:
            sys.path.remove(folder)
    obj: Any = module
    for part in name.split("."):
        if not hasattr(obj, part):
            raise StepError(f"--step: {what} has no {name!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise StepError(f"--step: {spec!r} is a {type(obj).__name__}, not a function")
    return obj


def takes_device(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` is called with the device (it has a positional parameter) or with nothing."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin or an odd callable: give it the device
        return True
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
    required = [p for p in params if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    if len(required) > 1 or any(p.kind is p.KEYWORD_ONLY for p in required):
        raise StepError(f"--step: {getattr(fn, '__qualname__', fn)!r} wants {len(required)} arguments; "
                        "a step function takes the device, or nothing")
    return bool(positional)


# --- whose code --------------------------------------------------------------------------------

def _library_dirs() -> Tuple[str, ...]:
    dirs = [os.path.dirname(os.path.abspath(cast(str, m.__file__))) for m in (torch, tmpatch)]  # both from files
    for name in ("torchmetrics", "wrapt"):  # found, not imported
        found = importlib.util.find_spec(name)
        if found is not None and found.origin:
            dirs.append(os.path.dirname(os.path.abspath(found.origin)))
    dirs += [sysconfig.get_paths()[key] for key in ("stdlib", "platstdlib")]
    return tuple(os.path.join(d, "") for d in dirs)


def yours(filename: str, skip: Tuple[str, ...]) -> bool:
    """Whether a frame's file is the user's code (not a library's, not ``<frozen ...>``)."""
    path = os.path.abspath(filename)
    return not filename.startswith("<") and not path.startswith(skip)


def _your_frame(skip: Tuple[str, ...]) -> Tuple[str, str]:
    frame = sys._getframe(1)
    while frame is not None and not yours(frame.f_code.co_filename, skip):
        frame = frame.f_back  # type: ignore[assignment]  # None ends the loop
    if frame is None:
        return "?", "?"
    return f"{frame.f_code.co_filename}:{frame.f_lineno}", frame.f_code.co_name


def _one_line(exc: BaseException, skip: Tuple[str, ...] = ()) -> str:
    text = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}".rstrip(": ")
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if yours(f.filename, skip or _library_dirs())]
    return f"{text} (at {short_path(frames[-1].filename)}:{frames[-1].lineno})" if frames else text


# --- running -----------------------------------------------------------------------------------

def _call(fn: Callable[..., Any], device: Optional[torch.device], run: StepRun, clear: Callable[[], None],
          mark: Callable[[], None] = lambda: None) -> None:
    out = fn(device) if device is not None else fn()
    if callable(out):
        run.split = True
        clear()
        run.phase = "first call"
        out()
        run.first = list(run.seen)
        clear()
        run.phase = "second call"
        mark()
        out()
    else:
        run.phase = "step"


def _simulated(fn: Callable[..., Any], device: Optional[torch.device], run: StepRun, dev: torch.device) -> None:
    skip = _library_dirs()
    with simulated_cuda(dev, on_sync=lambda point: run.seen.append(Seen(point, *_your_frame(skip)))) as sim:
        before = [0, 0]

        def mark() -> None:
            before[:] = [sim.backward_calls, sim.backward_left_out]

        try:
            _call(fn, device, run, lambda: run.seen.clear(), mark)
        except FAKE_ERRORS as exc:
            run.stopped = _one_line(exc, skip)
            if run.phase == "first call":  # what was seen is the first call's
                run.first, run.seen = list(run.seen), []
        finally:
            if run.phase in ("step", "second call"):
                run.backward, run.backward_left_out = sim.backward_calls - before[0], sim.backward_left_out - before[1]


@contextlib.contextmanager
def _watch_real(run: StepRun) -> Iterator[None]:
    skip = _library_dirs()
    tracker = SyncRecorder(lambda point: None, simulate=False)
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        shown = warnings.showwarning

        def hook(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
            if _SYNC_MESSAGE in str(message):
                run.seen.append(Seen(_real_point(tracker, str(message)), *_your_frame(skip)))
            else:
                shown(message, category, filename, lineno, file, line)

        warnings.showwarning = hook
        with _sync_debug("warn"), tracker:
            yield


def run_step(fn: Callable[..., Any], mode: str, dev: torch.device, real: bool = False) -> StepRun:
    """One run of the step function ``fn`` on ``dev``; its exceptions become :class:`StepError`."""
    run = StepRun(mode)
    device = dev if takes_device(fn) else None
    try:
        if not real:
            _simulated(fn, device, run, dev)
            return run
        with torch.cuda.device(dev), _watch_real(run):
            _call(fn, device, run, lambda: run.seen.clear())
    except StepError:
        raise
    except Exception as exc:  # noqa: BLE001 - the user's code: one line, no traceback
        where = f"{mode} run" + (f", {run.phase}" if run.split else "")
        raise StepError(f"--step: the step raised {_one_line(exc)} ({where}{_hint(exc, real, run)})") from None
    return run


def _release_check(exc: BaseException) -> Optional[str]:
    """The torchmetrics function whose own ``raise`` ``exc`` is (its innermost frame), or None;
    :func:`_hint` blames the simulation when that function saw a made-up size or value."""
    found = importlib.util.find_spec("torchmetrics")
    frames = traceback.extract_tb(exc.__traceback__)
    if found is None or not found.origin or not frames:
        return None
    folder = os.path.join(os.path.dirname(os.path.abspath(found.origin)), "")
    return frames[-1].name if os.path.abspath(frames[-1].filename).startswith(folder) else None


#: the points whose value the simulation made up: a size that depends on values, a value read
_MADE_UP = (SyncKind.DATA_DEPENDENT_SHAPE, SyncKind.D2H_READ)


def _hint(exc: BaseException, real: bool, run: StepRun) -> str:
    if real:
        return ""
    check = _release_check(exc)
    if check is not None:  # the release's own check: real, unless it read a made-up size or value
        if not any(s.point.function == check and s.point.kind in _MADE_UP for s in run.seen):
            return ""
        return (f"; raised by torchmetrics' {check} on simulated values: they have shapes, not values, and a "
                "size that depends on them is the largest it can be (torch.unique keeps every element unless the "
                "tensor comes from torch.randint, argmax or host data); validate_args=False leaves the check "
                "out, --real on a GPU runs it on real values")
    if isinstance(exc, (RuntimeError, NotImplementedError)):
        return "; some ops cannot run on simulated CUDA: --real on a GPU runs them"
    return ""


def audit_step(fn: Callable[..., Any], device: Any = "cuda:0", real: bool = False) -> Dict[str, StepRun]:
    """Run the step function ``fn`` with tmpatch reverted, then applied (tmpatch is left as found)."""
    dev = cuda_device(device)
    if real and not torch.cuda.is_available():
        raise StepError("--real needs a CUDA GPU (torch.cuda.is_available() is False); leave it out to simulate")
    runs: Dict[str, StepRun] = {}
    with restored_patches():
        tmpatch.revert()
        runs["unpatched"] = run_step(fn, "unpatched", dev, real)
        tmpatch.apply()
        runs["patched"] = run_step(fn, "patched", dev, real)
        runs["patched"].states = tmpatch.status().states()  # after the step: what it imported applied
    return runs

