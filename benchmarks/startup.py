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
checkout of tmpatch put first on PYTHONPATH, so that two can be compared, run by run
interleaved; bytecode caches are written as an installed package has them):

* ``apply``  CPU time of ``import tmpatch; tmpatch.apply()`` after ``import torch,
  torchmetrics``, the disk cache warm (every process after the first);
* ``cold``   the same with an empty cache directory (the first process after an
  install or upgrade);
* ``import`` CPU time of ``import torchmetrics`` (after ``import torch``) with ``TMPATCH=1``
  and the bootstrap first on PYTHONPATH (as ``tmpatch run`` starts a command: ``apply()``
  runs inside that import, and its post-import hooks), less that of the same import
  without ``TMPATCH``; the median of the per-run differences (the interpreter's start
  with the variable is the table above).
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


APPLY = ("import sys, time, torch, torchmetrics; start = time.process_time(); import tmpatch; "
         "tmpatch.apply(); print(time.process_time() - start, tmpatch.__file__)")
IMPORT = "import time, torch; start = time.process_time(); import torchmetrics; print(time.process_time() - start)"


def _cost_environ(tree: str, cache: str, on: bool = False) -> Dict[str, str]:
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith("TMPATCH") and k not in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE")}
    environ["XDG_CACHE_HOME"] = cache
    environ["PYTHONPATH"] = os.pathsep.join([os.path.join(tree, "tmpatch", "bootstrap"), tree] if on else [tree])
    if on:
        environ["TMPATCH"] = "1"
    return environ


def _import_cpu(python: str, environ: Dict[str, str]) -> float:
    """CPU seconds of ``import torchmetrics`` in a fresh interpreter (torch imported first)."""
    out = subprocess.run([python, "-c", IMPORT], env=environ, stdout=subprocess.PIPE, text=True, check=True,
                         cwd=environ["XDG_CACHE_HOME"]).stdout  # not a checkout: python -c puts the directory first
    return float(out.strip().splitlines()[-1])


def _apply_cpu(python: str, environ: Dict[str, str]) -> float:
    os.makedirs(environ["XDG_CACHE_HOME"], exist_ok=True)
    out = subprocess.run([python, "-c", APPLY], env=environ, stdout=subprocess.PIPE, text=True, check=True,
                         cwd=environ["XDG_CACHE_HOME"]).stdout
    seconds, where = out.strip().splitlines()[-1].split(" ", 1)
    tree = environ["PYTHONPATH"].split(os.pathsep)[-1]
    if not where.startswith(os.path.join(tree, "")):
        raise SystemExit(f"tmpatch came from {where}, not from {tree}")
    return float(seconds)


def cost(python: str, trees: List[str], runs: int) -> int:
    """The ``--cost`` table: per tree, apply() warm and cold, and TMPATCH=1 on an import."""
    trees = [os.path.abspath(t) for t in trees]
    scratch = tempfile.mkdtemp(prefix="tmpatch-startup-")
    times: Dict[str, Dict[str, List[float]]] = {t: {"apply": [], "cold": [], "import": []} for t in trees}
    try:
        caches = {tree: os.path.join(scratch, f"warm{i}") for i, tree in enumerate(trees)}
        for tree in trees:  # bytecode written, the cache warm
            os.makedirs(caches[tree])
            _apply_cpu(python, _cost_environ(tree, caches[tree]))
            _import_cpu(python, _cost_environ(tree, caches[tree], on=True))
        for run in range(runs):
            for tree in trees:
                times[tree]["apply"].append(_apply_cpu(python, _cost_environ(tree, caches[tree])))
                cold = os.path.join(scratch, f"cold{run}")
                times[tree]["cold"].append(_apply_cpu(python, _cost_environ(tree, cold)))
                shutil.rmtree(cold, ignore_errors=True)
                plain = _import_cpu(python, _cost_environ(tree, caches[tree]))
                patched = _import_cpu(python, _cost_environ(tree, caches[tree], on=True))
                times[tree]["import"].append(patched - plain)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    release = subprocess.run([python, "-c", "import sys, torch, torchmetrics; print(sys.version.split()[0], "
                              "torch.__version__, torchmetrics.__version__)"], stdout=subprocess.PIPE, text=True,
                             check=True, cwd=tempfile.gettempdir()).stdout.split()
    print(f"python {release[0]}, torch {release[1]}, torchmetrics {release[2]} ({python}); {runs} runs per tree, "
          f"interleaved; CPU ms, median (min-max)")
    print(f"{'tree':<40} {'apply (warm)':>22} {'apply (cold)':>22} {'TMPATCH=1 import':>22}")
    for tree in trees:
        cells = []
        for key in ("apply", "cold", "import"):
            values = [v * 1000 for v in times[tree][key]]
            cells.append(f"{statistics.median(values):7.1f} ({min(values):.0f}-{max(values):.0f})")
        print(f"{tree[-40:]:<40} " + " ".join(f"{cell:>22}" for cell in cells))
    return 0


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable, help="interpreter with tmpatch installed")
    parser.add_argument("--runs", type=int, default=None, help="starts per way (default 40; --cost: 15)")
    parser.add_argument("--cost", action="append", metavar="TREE",
                        help="measure apply() and TMPATCH=1 on an import with this tmpatch checkout (repeatable)")
    args = parser.parse_args(argv)
    if args.cost:
        return cost(args.python, args.cost, args.runs or 15)
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
