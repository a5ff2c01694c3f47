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
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
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


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--python", default=sys.executable, help="interpreter with tmpatch installed")
    parser.add_argument("--runs", type=int, default=40, help="starts per way (default 40)")
    args = parser.parse_args(argv)
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
