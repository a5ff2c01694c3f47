"""Start-up cost of auto-apply: ``python -c pass`` with TMPATCH=1 against without.

    python benchmarks/startup.py --python VENV/bin/python [--runs 40]

VENV must have tmpatch installed (``pip install .`` or ``-e .``: its
site-packages holds tmpatch.pth). Three ways to start, interleaved run by run,
median wall time of each (the goal: under +10 ms with the variable):

* ``off``  no TMPATCH: the .pth line only reads the environment;
* ``pth``  TMPATCH=1: the .pth line arms tmpatch;
* ``run``  TMPATCH=1 and the bootstrap directory first on PYTHONPATH, as
  ``tmpatch run`` starts a command (the .pth comes first, sitecustomize chains).

Each way is also checked once: what start-up imported of tmpatch, wrapt, torch,
torchmetrics. Writes nothing but stdout (benchmarks/startup.txt holds the last
recorded run).

``--cost TREE [--cost TREE ...]`` measures what tmpatch costs a process that uses
torchmetrics instead (any interpreter with torch and torchmetrics; each TREE is a
directory holding the ``tmpatch`` package, a checkout or a wheel installed with
``pip install --target``, put first on PYTHONPATH, so that several can be compared, run by
run interleaved). The process is a user's: ``import torch, torchmetrics`` and then the
libraries of ``--load`` (default ``scipy sklearn lightning``: about 3,300 modules and
360,000 objects with torch 2.13), or, with ``--heap``, 2,500 modules and 250,000 objects
made up; the collector on, as the user has it. Per tree:

* ``warm``  CPU time of ``import tmpatch; tmpatch.apply()`` there, bytecode written (as an
  installed package has it) and tmpatch's disk cache warm (every process after the first);
* ``cold``  the same with an empty cache directory (the first process after an install or
  upgrade);
* ``no pyc`` the same, cache warm, from a copy of the tree without ``__pycache__`` and with
  ``PYTHONDONTWRITEBYTECODE=1`` (a checkout in a container that writes no bytecode);
* ``import`` CPU time of ``import torchmetrics`` (after ``import torch``) with ``TMPATCH=1``
  and the bootstrap first on PYTHONPATH (as ``tmpatch run`` starts a command: ``apply()``
  runs inside that import, and its post-import hooks), less that of the same import
  without ``TMPATCH``; the median of the per-run differences (the interpreter's start
  with the variable is the table above).

Then where ``warm`` goes, from ``--shares`` more runs per tree (median of each): the
collector's passes during it (``gc.callbacks``; how many of each generation), the imports it
makes (tmpatch's modules, the catalogue's, wrapt: each module's own execution), the look
through ``sys.modules`` for references (the engine's index), and the rest: building,
fingerprints, installing.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

PROBE = ("import sys; print(' '.join(sorted(m for m in sys.modules "
         "if m.split('.')[0] in ('tmpatch', 'wrapt', 'torch', 'torchmetrics'))) or '-')")


def _environ(python: str, mode: str, boot: str) -> Dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TMPATCH") and k != "PYTHONPATH"}
    if mode in ("pth", "run"):
        environ["TMPATCH"] = "1"
    if mode == "run":
        environ["PYTHONPATH"] = boot
    return environ


#: the libraries a user's process has loaded besides torch and torchmetrics (``--load``)
LOADS = ("scipy", "sklearn", "lightning")

#: ``--heap``: modules and objects made up instead (a heap like a user's, without those libraries):
#: 2,500 modules, each with a function, a class with a method and 30 other values, and 250,000 objects
HEAP = """
import types as _types
_kept = [[_n] for _n in range(250000)]  # lists: the collector tracks every one (a dict or tuple of numbers it drops)
def _f(x, y=1):
    return x
class _C:
    def g(self):
        return 1
for _n in range(2500):
    _module = _types.ModuleType(f"tmpatch_heap_{_n}")
    _space = vars(_module)
    _space["f"] = _types.FunctionType(_f.__code__, _space, "f", _f.__defaults__)
    _space["C"] = type("C", (), {"g": _types.FunctionType(_C.g.__code__, _space, "g"), "__module__": _module.__name__})
    _space.update({f"v{_k}": _k for _k in range(30)})
    sys.modules[_module.__name__] = _module
"""


def _prelude(loads: List[str], heap: bool) -> str:
    lines = ["import sys, time, gc, torch, torchmetrics"] + [f"import {name}" for name in loads]
    if heap:
        lines.append(HEAP)
    return "\n".join(lines) + "\n"


APPLY = ("start = time.process_time()\nimport tmpatch\ntmpatch.apply()\n"
         "print(time.process_time() - start, len(sys.modules), len(gc.get_objects()), tmpatch.__file__)\n")

#: where apply()'s time goes, in a run like ``warm``: the collector's passes (``gc.callbacks``), the
#: imports it makes (each module's own execution, less the modules it imports and the passes in
#: it: the import system's ``_load_unlocked`` timed), the look for references (the engine's index),
#: and the rest
SHARES = '''
import importlib._bootstrap as _bootstrap
spent = {"gc": 0.0, "gc_importing": 0.0, "imports": 0.0, "refs": 0.0, "passes": [0, 0, 0], "at": 0.0}
_stack = []  # the imports under way: [time they began, time of the imports inside them]

def _on_gc(phase, info):
    if phase == "start":
        spent["at"] = time.process_time()
    else:
        took = time.process_time() - spent["at"]
        spent["gc"] += took
        spent["gc_importing"] += took if _stack else 0.0
        spent["passes"][info["generation"]] += 1

_load = _bootstrap._load_unlocked

def _timed_load(spec):
    _stack.append([time.process_time(), 0.0])
    try:
        return _load(spec)
    finally:
        began, inner = _stack.pop()
        took = time.process_time() - began
        spent["imports"] += took - inner
        if _stack:
            _stack[-1][1] += took

def _timed(function):
    def timed(*args, **kwargs):
        at = time.process_time()
        try:
            return function(*args, **kwargs)
        finally:
            spent["refs"] += time.process_time() - at
    return timed

gc.callbacks.append(_on_gc)
_bootstrap._load_unlocked = _timed_load
begin = time.process_time()
import tmpatch
from tmpatch.engine import references
for _name in ("_update", "_open"):  # the look through sys.modules (and the counts, where there are)
    if hasattr(references._Index, _name):
        setattr(references._Index, _name, _timed(getattr(references._Index, _name)))
tmpatch.apply()
total = time.process_time() - begin
_bootstrap._load_unlocked = _load
print(total, spent["gc"], spent["imports"] - spent["gc_importing"], spent["refs"], *spent["passes"], tmpatch.__file__)
'''

IMPORT = "import time, torch; start = time.process_time(); import torchmetrics; print(time.process_time() - start)"


def _cost_environ(tree: str, cache: str, on: bool = False, bytecode: bool = True) -> Dict[str, str]:
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith("TMPATCH") and k not in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE")}
    environ["XDG_CACHE_HOME"] = cache
    environ["PYTHONPATH"] = os.pathsep.join([os.path.join(tree, "tmpatch", "bootstrap"), tree] if on else [tree])
    if on:
        environ["TMPATCH"] = "1"
    if not bytecode:
        environ["PYTHONDONTWRITEBYTECODE"] = "1"
    return environ


def _run(python: str, code: str, environ: Dict[str, str]) -> List[str]:
    """The last line ``code`` prints, split (a fresh interpreter, not in a checkout: ``python -c``
    puts the working directory first on sys.path)."""
    os.makedirs(environ["XDG_CACHE_HOME"], exist_ok=True)
    out = subprocess.run([python, "-c", code], env=environ, stdout=subprocess.PIPE, text=True, check=True,
                         cwd=environ["XDG_CACHE_HOME"]).stdout
    fields = out.strip().splitlines()[-1].split()
    tree = environ["PYTHONPATH"].split(os.pathsep)[-1]
    if fields and fields[-1].endswith(".py") and not fields[-1].startswith(os.path.join(tree, "")):
        raise SystemExit(f"tmpatch came from {fields[-1]}, not from {tree}")
    return fields


def _import_cpu(python: str, environ: Dict[str, str]) -> float:
    """CPU seconds of ``import torchmetrics`` in a fresh interpreter (torch imported first)."""
    return float(_run(python, IMPORT, environ)[0])


def _without_bytecode(tree: str, scratch: str, index: int) -> str:
    """A copy of ``tree``'s tmpatch package without ``__pycache__`` (a checkout that writes none)."""
    copy = os.path.join(scratch, f"nopyc{index}")
    shutil.copytree(os.path.join(tree, "tmpatch"), os.path.join(copy, "tmpatch"),
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return copy


def _ms(values: List[float]) -> str:
    values = [v * 1000 for v in values]
    return f"{statistics.median(values):6.1f} ({min(values):.0f}-{max(values):.0f})"


def cost(python: str, trees: List[str], runs: int, loads: List[str], heap: bool, shares: int) -> int:
    """The ``--cost`` table: per tree, apply() warm, cold and without bytecode, TMPATCH=1 on an
    import; then where apply()'s time goes."""
    trees = [os.path.abspath(t) for t in trees]
    python = os.path.abspath(python) if os.sep in python else python  # the runs start in other directories
    prelude = _prelude(loads, heap)
    scratch = tempfile.mkdtemp(prefix="tmpatch-startup-")
    columns = ("warm", "cold", "nopyc", "import")
    times: Dict[str, Dict[str, List[float]]] = {t: {c: [] for c in columns} for t in trees}
    parts: Dict[str, List[List[float]]] = {t: [] for t in trees}
    process = ""
    try:
        caches = {tree: os.path.join(scratch, f"warm{i}") for i, tree in enumerate(trees)}
        bare = {tree: _without_bytecode(tree, scratch, i) for i, tree in enumerate(trees)}
        bare_caches = {tree: os.path.join(scratch, f"nopyc-cache{i}") for i, tree in enumerate(trees)}
        for tree in trees:  # bytecode written, the caches warm
            _run(python, prelude + APPLY, _cost_environ(tree, caches[tree]))
            _run(python, prelude + APPLY, _cost_environ(bare[tree], bare_caches[tree], bytecode=False))
            _import_cpu(python, _cost_environ(tree, caches[tree], on=True))
        for run in range(runs):
            for tree in trees:
                fields = _run(python, prelude + APPLY, _cost_environ(tree, caches[tree]))
                times[tree]["warm"].append(float(fields[0]))
                process = f"{int(fields[1]):,} modules, {int(fields[2]):,} objects after apply()"
                cold = os.path.join(scratch, f"cold{run}")
                times[tree]["cold"].append(float(_run(python, prelude + APPLY, _cost_environ(tree, cold))[0]))
                shutil.rmtree(cold, ignore_errors=True)
                nopyc = _cost_environ(bare[tree], bare_caches[tree], bytecode=False)
                times[tree]["nopyc"].append(float(_run(python, prelude + APPLY, nopyc)[0]))
                plain = _import_cpu(python, _cost_environ(tree, caches[tree]))
                patched = _import_cpu(python, _cost_environ(tree, caches[tree], on=True))
                times[tree]["import"].append(patched - plain)
        for _ in range(shares):
            for tree in trees:
                fields = _run(python, prelude + SHARES, _cost_environ(tree, caches[tree]))
                parts[tree].append([float(v) for v in fields[:7]])
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    release = subprocess.run([python, "-c", "import sys, torch, torchmetrics; print(sys.version.split()[0], "
                              "torch.__version__, torchmetrics.__version__)"], stdout=subprocess.PIPE, text=True,
                             check=True, cwd=tempfile.gettempdir()).stdout.split()
    loaded = ", ".join(["torch", "torchmetrics"] + loads) + (" and a heap made up" if heap else "")
    print(f"python {release[0]}, torch {release[1]}, torchmetrics {release[2]} ({python})")
    print(f"the process: import {loaded} ({process}); the collector on")
    print(f"{runs} runs per tree, interleaved; CPU ms of import tmpatch; tmpatch.apply(), median (min-max)")
    print(f"{'tree':<34} {'warm':>16} {'cold':>16} {'no pyc':>16} {'TMPATCH=1 import':>17}")
    for tree in trees:
        print(f"{tree[-34:]:<34} " + " ".join(f"{_ms(times[tree][c]):>16}" for c in columns[:3])
              + f" {_ms(times[tree]['import']):>17}")
    if shares:
        print(f"\nwhere warm goes ({shares} more runs per tree; median ms): the collector's passes during it (passes "
              "of generation 0/1/2), the imports it makes, the look for references, the rest (building, fingerprints, "
              "installing)")
        print(f"{'tree':<34} {'total':>7} {'collection':>11} {'passes':>9} {'imports':>8} {'references':>11} "
              f"{'building':>9}")
        for tree in trees:
            rows = parts[tree]
            total, collected, imported, refs = (statistics.median(r[i] for r in rows) * 1000 for i in range(4))
            passes = "/".join(str(int(statistics.median(r[i] for r in rows))) for i in (4, 5, 6))
            rest = statistics.median((r[0] - r[1] - r[2] - r[3]) for r in rows) * 1000
            print(f"{tree[-34:]:<34} {total:7.1f} {collected:11.1f} {passes:>9} {imported:8.1f} {refs:11.1f} "
                  f"{rest:9.1f}")
    return 0


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable, help="interpreter with tmpatch installed")
    parser.add_argument("--runs", type=int, default=None, help="starts per way (default 40; --cost: 15)")
    parser.add_argument("--cost", action="append", metavar="TREE",
                        help="measure apply() and TMPATCH=1 on an import with the tmpatch in TREE (repeatable)")
    parser.add_argument("--load", nargs="*", default=list(LOADS), metavar="MODULE",
                        help=f"--cost: what the process imports after torch and torchmetrics "
                             f"(default: {' '.join(LOADS)})")
    parser.add_argument("--heap", action="store_true",
                        help="--cost: 2,500 modules and 250,000 objects made up (with --load and no module: instead)")
    parser.add_argument("--shares", type=int, default=5,
                        help="--cost: runs per tree for where apply() goes (default 5)")
    args = parser.parse_args(argv)
    if args.cost:
        return cost(args.python, args.cost, args.runs or 15, args.load, args.heap, args.shares)
    args.runs = args.runs or 40
    info = subprocess.run(
        [args.python, "-c", "import os, site, sys, tmpatch.bootstrap as b; "
         "print(b.DIRECTORY); print(any(os.path.exists(os.path.join(d, 'tmpatch.pth')) "
         "for d in site.getsitepackages())); print(sys.version.split()[0])"],
        env=_environ(args.python, "off", ""), stdout=subprocess.PIPE, text=True, check=True,
    ).stdout.split()
    boot, has_pth, version = info[0], info[1] == "True", info[2]
    if not has_pth:
        print(f"note: no tmpatch.pth in the site-packages of {args.python}: 'pth' measures nothing extra")
    modes = ("off", "pth", "run")
    times: Dict[str, List[float]] = {mode: [] for mode in modes}
    with open(os.devnull, "w") as null:
        for mode in modes:  # warm the caches (bytecode, page cache)
            subprocess.run([args.python, "-c", "pass"], env=_environ(args.python, mode, boot), check=True)
        for _ in range(args.runs):
            for mode in modes:
                environ = _environ(args.python, mode, boot)
                start = time.perf_counter()
                subprocess.run([args.python, "-c", "pass"], env=environ, stdout=null, check=True)
                times[mode].append(time.perf_counter() - start)
    base = statistics.median(times["off"])
    print(f"python {version} ({args.python}), {args.runs} runs per way, interleaved")
    print(f"{'way':<5} {'median ms':>9} {'vs off':>8}  imported at start-up")
    for mode in modes:
        median = statistics.median(times[mode])
        loaded = subprocess.run([args.python, "-c", PROBE], env=_environ(args.python, mode, boot),
                                stdout=subprocess.PIPE, text=True, check=True).stdout.strip()
        delta = "" if mode == "off" else f"{(median - base) * 1000:+.1f}"
        print(f"{mode:<5} {median * 1000:9.1f} {delta:>8}  {loaded}")
    worst = max(statistics.median(times[m]) for m in ("pth", "run")) - base
    print(f"goal: under +10 ms with the variable: {'met' if worst < 0.010 else 'NOT met'} ({worst * 1000:+.1f} ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
