"""Start real multi-process runs for the tests, bounded in time, and collect their results.

* :func:`spawn` starts ``world_size`` processes with ``torch.multiprocessing``
  (start method "spawn"); :func:`torchrun` runs a script under
  ``python -m torch.distributed.run --standalone``.
* Rendezvous never uses a fixed port: spawn runs meet in a ``FileStore`` in a
  fresh directory (``init_method="file://..."``), torchrun's standalone mode
  binds port 0; gloo's own connections use ephemeral ports. Runs back to back,
  or two test sessions at once (the release matrix), cannot collide.
* A worker's exception reaches the caller as :class:`WorkerError` carrying
  the worker's traceback; the other ranks are terminated. A run that outlives
  ``timeout`` is killed (every rank) and raises :class:`WorkerTimeout`, unless every
  rank had written its result (then only teardown was left: noted on stderr).
* Results are what the ranks saved as ``<out_dir>/rank<N>.pt``.
"""
from __future__ import annotations

import inspect
import os
import signal
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


class WorkerError(AssertionError):
    """A rank failed; the message holds its traceback (or torchrun's output)."""


class WorkerTimeout(WorkerError):
    """The run did not finish in time; every process of it was killed."""


class _Env:
    """Set environment variables for the duration of a ``with`` block (children inherit them)."""

    def __init__(self, env: Optional[Mapping[str, Optional[str]]]) -> None:
        self.env, self.saved = dict(env or {}), {}

    def __enter__(self) -> None:
        for key, value in self.env.items():
            self.saved[key] = os.environ.get(key)
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value

    def __exit__(self, *exc: Any) -> None:
        for key, value in self.saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _kill(processes: Sequence[Any]) -> List[int]:
    """Terminate, then kill, every live process; return the pids that were alive."""
    alive = [p for p in processes if p.is_alive()]
    for p in alive:
        p.terminate()
    end = time.monotonic() + 5
    for p in alive:
        p.join(max(0.0, end - time.monotonic()))
    for p in alive:
        if p.is_alive():
            p.kill()
            p.join(5)
    return [p.pid for p in alive]


def _descendants(pid: int) -> List[int]:
    """Every live process below ``pid`` (Linux ``/proc``). torchrun starts each worker in a
    session of its own, so a signal to torchrun's process group would miss them."""
    parents: Dict[int, List[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                ppid = int(handle.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        parents.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


def _kill_tree(pid: int) -> List[int]:
    """SIGTERM ``pid`` and everything below it (a rank prints its stack: faulthandler), then
    SIGKILL what is left after 5 s; return the pids signalled."""
    tree = [pid] + _descendants(pid)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in tree + [d for d in _descendants(pid) if d not in tree]:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
        end = time.monotonic() + 5
        while time.monotonic() < end and any(_alive(p) for p in tree):
            time.sleep(0.1)
    return tree


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _other_tracebacks(context: Any, exc: Any) -> str:
    """The tracebacks of the ranks other than the one torch reported (a rank that
    fails first is often only the victim of another's failure)."""
    import pickle

    text = ""
    for rank, path in enumerate(getattr(context, "error_files", ())):  # torch 2.1: error queues, no files
        if rank == getattr(exc, "error_index", None) or not path or not os.path.exists(path):
            continue
        try:
            with open(path, "rb") as handle:
                text += f"\n\n-- Process {rank} also failed:\n{pickle.load(handle)}"
        except Exception:  # noqa: BLE001 - a half-written file: nothing more to say
            pass
    return text


def _all_written(out_dir: str, world_size: int) -> bool:
    return all(os.path.exists(os.path.join(out_dir, f"rank{r}.pt")) for r in range(world_size))


def _note_teardown(what: str, killed: Sequence[int]) -> None:
    """Every rank wrote its result (whole: written aside, then renamed), so every collective
    of the run completed; a rank still alive is stuck tearing down torch's process group,
    which no test here checks (seen under load with torch 2.5.1's gloo). Its stack went to
    stderr when it was terminated (faulthandler)."""
    sys.stderr.write(f"[ddp] {what}: every rank wrote its result; pids {list(killed)} were still "
                     f"tearing down and were killed\n")


def load_results(out_dir: str, ranks: Sequence[int]) -> Dict[int, Dict[str, Any]]:
    results = {}
    for rank in ranks:
        path = os.path.join(out_dir, f"rank{rank}.pt")
        if not os.path.exists(path):
            raise WorkerError(f"rank {rank} finished without writing {path}")
        results[rank] = torch.load(path, weights_only=True)
    return results


def spawn(
    fn: Callable[..., None],
    world_size: int,
    workdir: str,
    args: Sequence[Any] = (),
    timeout: float = 120.0,
    env: Optional[Mapping[str, Optional[str]]] = None,
) -> Dict[int, Dict[str, Any]]:
    """Run ``fn(rank, world_size, init_method, out_dir, *args)`` on ``world_size``
    spawned processes; return ``{rank: result}`` from ``<workdir>/out``.

    ``env``: variables the children start with (``None`` removes one).
    """
    import torch.multiprocessing as mp
    from torch.multiprocessing.spawn import ProcessException

    os.makedirs(workdir, exist_ok=False)  # a fresh store for every run
    out_dir = os.path.join(workdir, "out")
    os.makedirs(out_dir)
    init_method = "file://" + os.path.join(workdir, "store")
    with _Env(env):
        context = mp.start_processes(
            fn, args=(world_size, init_method, out_dir, *args), nprocs=world_size, join=False, start_method="spawn"
        )
    deadline = time.monotonic() + timeout
    try:
        # grace_period (torch 2.6+): when a rank fails, the others get a few seconds to fail
        # (and write their traceback) on their own before they are terminated
        grace = {"grace_period": 5.0} if "grace_period" in inspect.signature(context.join).parameters else {}
        while not context.join(timeout=max(0.0, min(0.5, deadline - time.monotonic())), **grace):
            if time.monotonic() >= deadline:
                killed = _kill(context.processes)
                if _all_written(out_dir, world_size):
                    _note_teardown(fn.__name__, killed)
                    break
                raise WorkerTimeout(
                    f"{fn.__name__} on {world_size} ranks still running after {timeout:.0f}s; "
                    f"killed pids {killed}"
                )
    except ProcessException as exc:  # a rank raised, or exited with a signal / non-zero code
        raise WorkerError(
            f"{fn.__name__} on {world_size} ranks failed:{exc}{_other_tracebacks(context, exc)}") from None
    finally:
        _kill(context.processes)  # nothing outlives the call
        for path in getattr(context, "error_files", ()):
            if path and os.path.exists(path):
                os.unlink(path)
    return load_results(out_dir, range(world_size))


def child_pythonpath(extra: Sequence[str] = ()) -> str:
    """This interpreter's path, for children started as fresh scripts."""
    entries = list(extra) + [p for p in sys.path if p and os.path.isdir(p)]
    if ROOT not in entries:
        entries.append(ROOT)
    return os.pathsep.join(dict.fromkeys(entries))


def torchrun(
    script: str,
    world_size: int,
    workdir: str,
    script_args: Sequence[str] = (),
    timeout: float = 120.0,
    env: Optional[Mapping[str, str]] = None,
) -> Dict[int, Dict[str, Any]]:
    """Run ``script --out <workdir>/out *script_args`` under ``torch.distributed.run``."""
    os.makedirs(workdir, exist_ok=False)
    out_dir = os.path.join(workdir, "out")
    os.makedirs(out_dir)
    full_env = dict(os.environ)
    full_env.update({"PYTHONPATH": child_pythonpath(), "OMP_NUM_THREADS": "1"})
    full_env.update(env or {})
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={world_size}",
        "--max-restarts=0", "--monitor-interval=0.2", script, "--out", out_dir, *script_args,
    ]
    # output to a file, not a pipe: a worker that outlives the agent cannot keep the read open
    with open(os.path.join(workdir, "torchrun.log"), "w+") as log:
        proc = subprocess.Popen(command, cwd=ROOT, env=full_env, stdout=log, stderr=subprocess.STDOUT)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            killed = _kill_tree(proc.pid)
            proc.wait()
            log.seek(0)
            output = log.read()
            if _all_written(out_dir, world_size):
                _note_teardown("torchrun", killed)
                sys.stderr.write(output[-4000:])
                return load_results(out_dir, range(world_size))
            raise WorkerTimeout(
                f"torchrun still running after {timeout:.0f}s; killed pids {killed}:\n{output}") from None
        log.seek(0)
        output = log.read()
    if proc.returncode != 0:
        raise WorkerError(f"torchrun exited with {proc.returncode}:\n{output}")
    return load_results(out_dir, range(world_size))
