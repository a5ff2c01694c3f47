"""A compiled evaluation step with metric updates: step time and graph breaks, with and without tmpatch.

    python benchmarks/compile_step.py                         # releases 1.6.1 and 1.9.0 from .matrix/, CPU
    python benchmarks/compile_step.py --release 1.9.0 --rounds 15
    python benchmarks/compile_step.py --here                  # the torchmetrics on the path
    python benchmarks/compile_step.py --here --device cuda --backend inductor --batch 256   # on a GPU

The step, compiled with ``torch.compile`` (``--backend``, default ``eager``): a small
MLP's forward on a pre-built batch, its cross-entropy loss, and the updates of
MeanMetric (the loss), MulticlassAccuracy, MulticlassF1Score and
MulticlassConfusionMatrix (``validate_args=False``). Variants, each in its own child
process (tmpatch's layers are global: a process cannot hold a patched and an
unpatched compiled step without recompiling): ``no metrics``, ``unpatched``,
``patched`` (``tmpatch.apply()`` before the metrics are built) and ``unpatched again``
(the null row: the same code as ``unpatched``, the noise floor). The unpatched
variants make one eager update before compiling: on torch 2.6+ a first compiled
``_bincount`` fails on the release's lazy ``_XLA_AVAILABLE`` check otherwise.

Each child compiles its step, warms up, then times blocks of ``--number`` steps when
the parent asks; the parent runs ``--rounds`` rounds, each round one block of every
variant in rotating order, and reports per-round ratios to ``unpatched`` (median and
interquartile range): sides a second apart see nearly the same load on a shared
machine. The clock is the thread's CPU time on the CPU (one torch thread), wall time
with a synchronize on CUDA. Also reported per variant: the compile time of the first
step, dynamo's graph-break count, the graphs compiled, and whether a later step
recompiled. The figure to read: patched/unpatched step time, and patched breaks
(only the update count's, one per metric). Writes stdout only; compile_step.txt holds
the last recorded run.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from typing import Dict, List, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RELEASES = ("1.6.1", "1.9.0")
VARIANTS = ("no metrics", "unpatched", "patched", "unpatched again")


# -- the child: one variant ---------------------------------------------------------------
def child(args: argparse.Namespace, variant: str) -> None:
    import warnings

    warnings.filterwarnings("ignore")
    import torch

    torch.set_num_threads(1)
    if variant == "patched":
        import tmpatch

        tmpatch.apply()
    import torch._dynamo
    from torch._dynamo.utils import counters
    from torchmetrics import MeanMetric
    from torchmetrics.classification import MulticlassAccuracy, MulticlassConfusionMatrix, MulticlassF1Score

    device = torch.device(args.device)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(args.features, 128), torch.nn.ReLU(),
                                torch.nn.Linear(128, args.classes)).to(device).eval()
    metrics = [] if variant == "no metrics" else [
        MeanMetric(),
        MulticlassAccuracy(num_classes=args.classes, validate_args=False),
        MulticlassF1Score(num_classes=args.classes, validate_args=False),
        MulticlassConfusionMatrix(num_classes=args.classes, validate_args=False),
    ]
    metrics = [m.to(device) for m in metrics]
    batches = [(torch.randn(args.batch, args.features, device=device),
                torch.randint(0, args.classes, (args.batch,), device=device)) for _ in range(8)]
    if variant.startswith("unpatched") and metrics:
        # unpatched, a first compiled _bincount fails on torch 2.6+ (the lazy _XLA_AVAILABLE check);
        # one eager update, as a user would add, fills that cache first
        for metric in metrics[1:]:
            metric.update(model(batches[0][0]), batches[0][1])
            metric.reset()

    def step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            logits = model(x)
            loss = torch.nn.functional.cross_entropy(logits, y)
            if metrics:
                metrics[0].update(loss)
                for metric in metrics[1:]:
                    metric.update(logits, y)
        return loss

    compiled = torch.compile(step, backend=args.backend)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    clock = time.perf_counter_ns if device.type == "cuda" else time.thread_time_ns
    start = time.perf_counter()
    compiled(*batches[0])
    sync()
    compile_s = time.perf_counter() - start
    breaks, graphs = sum(counters["graph_break"].values()), counters["stats"]["unique_graphs"]
    recompiled = False
    try:
        with torch._dynamo.config.patch(error_on_recompile=True):
            for i in range(args.warmup):
                compiled(*batches[i % len(batches)])
    except torch._dynamo.exc.RecompileError:
        recompiled = True
        for i in range(args.warmup):
            compiled(*batches[i % len(batches)])
    sync()
    reasons = sorted({r.splitlines()[0][:70] for r in counters["graph_break"]})
    print(f"ready {compile_s:.2f} {breaks} {graphs} {int(recompiled)} {' | '.join(reasons) or '-'}", flush=True)
    i = 0
    for line in sys.stdin:
        if line.strip() != "go":
            break
        sync()
        t0 = clock()
        for _ in range(args.number):
            compiled(*batches[i % len(batches)])
            i += 1
        sync()
        print((clock() - t0) / args.number, flush=True)


# -- the parent ---------------------------------------------------------------------------
def _quartiles(values: Sequence[float]) -> str:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return f"{q[1]:.3f} [{q[0]:.3f}-{q[2]:.3f}]"


def measure(args: argparse.Namespace, env: Dict[str, str]) -> List[str]:
    procs = {}
    for variant in VARIANTS:
        cmd = [sys.executable, os.path.abspath(__file__), "--child", variant] + _forward(args)
        log = open(os.path.join(args.logs, f"compile_step.{variant.replace(' ', '_')}.log"), "w")
        procs[variant] = subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=log, text=True)
    info = {}
    for variant, proc in procs.items():
        line = proc.stdout.readline().split(" ", 5)
        if not line or line[0] != "ready":
            raise RuntimeError(f"{variant}: child failed to start (see {args.logs})")
        info[variant] = line
    times: Dict[str, List[float]] = {v: [] for v in VARIANTS}
    for r in range(args.rounds):
        order = VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]
        for variant in order:
            proc = procs[variant]
            proc.stdin.write("go\n")
            proc.stdin.flush()
            times[variant].append(float(proc.stdout.readline()))
    for proc in procs.values():
        proc.stdin.close()
        proc.wait()
    base = times["unpatched"]
    out = [f"  {'variant':<16} {'step':>10}   {'ratio to unpatched [IQR]':<26} {'compile':>8} {'breaks':>6} "
           f"{'graphs':>6} {'recompiled':>10}  break reasons"]
    for variant in VARIANTS:
        ratios = [t / b for t, b in zip(times[variant], base)]
        _, compile_s, breaks, graphs, recompiled, reasons = info[variant]
        out.append(f"  {variant:<16} {statistics.median(times[variant]) / 1e3:8.1f}us   {_quartiles(ratios):<26} "
                   f"{float(compile_s):7.1f}s {breaks:>6} {graphs:>6} {'yes' if recompiled == '1' else 'no':>10}  "
                   f"{reasons.strip()}")
    return out


def _forward(args: argparse.Namespace) -> List[str]:
    return ["--device", args.device, "--backend", args.backend, "--batch", str(args.batch), "--classes",
            str(args.classes), "--features", str(args.features), "--number", str(args.number),
            "--warmup", str(args.warmup)]


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--release", action="append", help="a release from .matrix/ (repeatable)")
    parser.add_argument("--here", action="store_true", help="the torchmetrics on the path")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--backend", default="eager")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--number", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--logs", default=os.environ.get("TMPDIR", "/tmp"), help="where the children's stderr goes")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args, args.child)
        return 0
    import torch

    env = dict(os.environ, OMP_NUM_THREADS="1")
    releases = [None] if args.here else (args.release or list(RELEASES))
    for release in releases:
        run_env = dict(env)
        if release is not None:
            run_env["PYTHONPATH"] = os.pathsep.join(
                p for p in (os.path.join(ROOT, ".matrix", release), ROOT, env.get("PYTHONPATH")) if p)
            name = release
        else:
            import torchmetrics

            name = torchmetrics.__version__
        print(f"torchmetrics {name}, torch {torch.__version__}, {args.device}, backend {args.backend}, "
              f"batch {args.batch}, {args.classes} classes; {args.rounds} rounds x {args.number} steps", flush=True)
        for line in measure(args, run_env):
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
