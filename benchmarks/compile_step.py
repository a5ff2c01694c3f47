"""A compiled evaluation step with metric updates: step time, graph breaks and recompiles, eager and
compiled, with and without tmpatch.

    python benchmarks/compile_step.py                           # release 1.9.0 from .matrix/, CPU, inductor
    python benchmarks/compile_step.py --release 1.6.1 --set collection
    python benchmarks/compile_step.py --here --backend eager    # the torchmetrics on the path
    python benchmarks/compile_step.py --here --device cuda --batch 256          # on a GPU

The step, on pre-built batches of logits and targets (no grad): the cross-entropy loss and
metric updates (``validate_args=False``, ``--classes`` classes); ``--model mlp`` computes the
logits with a small MLP's forward first:

* ``--set published`` (default): the published case's five updates, MeanMetric of the loss,
  multiclass Accuracy, Precision, Recall and F1;
* ``--set families``: MeanMetric of the loss, multiclass Accuracy, a confusion matrix and a
  binned precision-recall curve (``thresholds=20``);
* ``--set collection``: a MetricCollection of Accuracy, Precision, Recall, F1 and a
  confusion matrix (its compute groups formed by one eager update first), and MeanMetric.

Variants, each in its own child process (tmpatch's layers are global): ``no metrics``
(compiled) and ``eager no metrics`` (the step without updates), ``eager release`` and
``eager patched`` (the step not compiled), ``compiled release`` (``torch.compile(step)``,
one eager update first: on torch 2.6+ a first compiled ``_bincount`` crashes on the
release's lazy ``_XLA_AVAILABLE`` check otherwise), ``compiled patched``
(``fullgraph=True``, the default ``update_count`` policy), ``compiled outside`` (patched,
``update_count="outside"``: the former default, a graph break per update) and ``eager
patched again`` (the null row: the code of ``eager patched``).

Each child builds and compiles its step, warms up, then times blocks of ``--number`` steps
when the parent asks; the parent runs ``--rounds`` rounds, each round one block of every
variant in rotating order, and reports per-round ratios to ``eager patched`` (median and
interquartile range): sides a second apart see nearly the same load on a shared machine.
The metrics' share: per round, compiled patched less compiled no metrics over eager patched
less eager no metrics (what compiling does to the updates' own cost, with a model's share
taken out).
The clock is the thread's CPU time on the CPU (one torch thread), wall time with a
synchronize on CUDA. Also per variant: the first step's time (compile), dynamo's
graph-break count, the graphs compiled at the first step, and the frames compiled after it
over every later step (``recompiled``: warm-up and timing, ``--warmup`` + rounds x number
steps). Writes stdout only; compile_step.txt holds the last recorded run.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Callable, Dict, List, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIANTS = ("no metrics", "eager no metrics", "eager release", "eager patched", "compiled release",
            "compiled patched", "compiled outside", "eager patched again")
BASE = "eager patched"


def _metrics(which: str, classes: int):
    from torchmetrics import MeanMetric, MetricCollection
    from torchmetrics.classification import (
        MulticlassAccuracy,
        MulticlassConfusionMatrix,
        MulticlassF1Score,
        MulticlassPrecision,
        MulticlassPrecisionRecallCurve,
        MulticlassRecall,
    )

    kw = {"num_classes": classes, "validate_args": False}
    if which == "published":
        return [MeanMetric()] + [cls(**kw) for cls in (MulticlassAccuracy, MulticlassPrecision, MulticlassRecall,
                                                       MulticlassF1Score)]
    if which == "families":
        return [MeanMetric(), MulticlassAccuracy(**kw), MulticlassConfusionMatrix(**kw),
                MulticlassPrecisionRecallCurve(thresholds=20, **kw)]
    return [MeanMetric(), MetricCollection([cls(**kw) for cls in (MulticlassAccuracy, MulticlassPrecision,
                                                                  MulticlassRecall, MulticlassF1Score,
                                                                  MulticlassConfusionMatrix)])]


# -- the child: one variant ---------------------------------------------------------------
def make_step(model: Any, metrics: List[Any]) -> Callable[[Any, Any], Any]:
    """The evaluation step: ``model``'s logits, their cross-entropy, the loss into ``metrics[0]``
    and the logits into the others."""
    import torch

    def step(x: Any, y: Any) -> Any:
        with torch.no_grad():
            logits = model(x)
            loss = torch.nn.functional.cross_entropy(logits, y)
            if metrics:
                metrics[0].update(loss)
                for metric in metrics[1:]:
                    metric.update(logits, y)
        return loss

    return step


def child(args: argparse.Namespace, variant: str) -> None:
    import warnings

    warnings.filterwarnings("ignore")
    import torch

    torch.set_num_threads(1)
    patched = "patched" in variant or variant == "compiled outside"
    if patched:
        import tmpatch

        tmpatch.apply(update_count="outside" if variant == "compiled outside" else "device")
    import torch._dynamo
    from torch._dynamo.utils import counters

    device = torch.device(args.device)
    torch.manual_seed(0)
    if args.model == "mlp":
        model = torch.nn.Sequential(torch.nn.Linear(args.features, 128), torch.nn.ReLU(),
                                    torch.nn.Linear(128, args.classes)).to(device).eval()
    else:
        model = torch.nn.Identity()
    metrics = [] if variant.endswith("no metrics") else [m.to(device) for m in _metrics(args.set, args.classes)]
    features = args.features if args.model == "mlp" else args.classes
    batches = [(torch.randn(args.batch, features, device=device),
                torch.randint(0, args.classes, (args.batch,), device=device)) for _ in range(8)]
    if metrics and (variant == "compiled release" or args.set == "collection"):
        # the release's first compiled _bincount crashes on torch 2.6+ without an eager update first (the lazy
        # _XLA_AVAILABLE check); a collection forms its compute groups at its first eager update
        with torch.no_grad():
            logits = model(batches[0][0])
            for metric in metrics[1:]:
                metric.update(logits, batches[0][1])

    step = make_step(model, metrics)
    if variant.startswith("eager"):
        run = step
    else:
        run = torch.compile(step, backend=args.backend, fullgraph=variant in ("compiled patched", "no metrics"))
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    clock = time.perf_counter_ns if device.type == "cuda" else time.thread_time_ns
    start = time.perf_counter()
    run(*batches[0])
    sync()
    compile_s = time.perf_counter() - start
    breaks, graphs = sum(counters["graph_break"].values()), counters["stats"]["unique_graphs"]
    for i in range(args.warmup):
        run(*batches[i % len(batches)])
    sync()
    reasons = sorted({r.splitlines()[0][:60] for r in counters["graph_break"]})
    print(f"ready {compile_s:.2f} {breaks} {graphs} {' | '.join(reasons) or '-'}", flush=True)
    i = 0
    for line in sys.stdin:
        if line.strip() != "go":
            break
        sync()
        t0 = clock()
        for _ in range(args.number):
            run(*batches[i % len(batches)])
            i += 1
        sync()
        print((clock() - t0) / args.number, counters["stats"]["unique_graphs"] - graphs, flush=True)


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
        line = proc.stdout.readline().rstrip("\n").split(" ", 4)
        if not line or line[0] != "ready":
            raise RuntimeError(f"{variant}: child failed to start (see {args.logs})")
        info[variant] = line
    times: Dict[str, List[float]] = {v: [] for v in VARIANTS}
    later: Dict[str, int] = {v: 0 for v in VARIANTS}
    for r in range(args.rounds):
        order = VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]
        for variant in order:
            proc = procs[variant]
            proc.stdin.write("go\n")
            proc.stdin.flush()
            took, more = proc.stdout.readline().split()
            times[variant].append(float(took))
            later[variant] = int(more)
    for proc in procs.values():
        proc.stdin.close()
        proc.wait()
    base = times[BASE]
    steps = args.warmup + args.rounds * args.number
    out = [f"  {'variant':<20} {'step':>10}   {'ratio to eager patched':<24} {'1st step':>8} {'breaks':>6} "
           f"{'graphs':>6} {'recompiled':>10}  break reasons"]
    for variant in VARIANTS:
        ratios = [t / b for t, b in zip(times[variant], base)]
        _, compile_s, breaks, graphs, reasons = info[variant]
        eager = variant.startswith("eager")
        out.append(f"  {variant:<20} {statistics.median(times[variant]) / 1e3:8.1f}us   {_quartiles(ratios):<24} "
                   f"{float(compile_s):7.1f}s {'-' if eager else breaks:>6} {'-' if eager else graphs:>6} "
                   f"{'-' if eager else later[variant]:>10}  {'' if eager else reasons.strip()}")
    shares = [(c - n) / (e - m) for c, n, e, m in zip(times["compiled patched"], times["no metrics"], base,
                                                      times["eager no metrics"])]
    out.append(f"  metrics' share, compiled patched over eager patched (each less its step without metrics): "
               f"{_quartiles(shares)}")
    out.append(f"  (recompiled: frames compiled after the first step, over {steps} later steps)")
    return out


def _forward(args: argparse.Namespace) -> List[str]:
    return ["--device", args.device, "--backend", args.backend, "--batch", str(args.batch), "--classes",
            str(args.classes), "--features", str(args.features), "--number", str(args.number),
            "--warmup", str(args.warmup), "--set", args.set, "--model", args.model]


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--release", action="append", help="a release from .matrix/ (repeatable; default 1.9.0)")
    parser.add_argument("--here", action="store_true", help="the torchmetrics on the path")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--backend", default="inductor")
    parser.add_argument("--set", default="published", choices=("published", "families", "collection"))
    parser.add_argument("--model", default="none", choices=("none", "mlp"))
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--number", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--logs", default=os.environ.get("TMPDIR", "/tmp"), help="where the children's stderr goes")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args, args.child)
        return 0
    import torch

    env = dict(os.environ, OMP_NUM_THREADS="1")
    releases = [None] if args.here else (args.release or ["1.9.0"])
    for release in releases:
        run_env = dict(env)
        if release is not None:
            run_env["PYTHONPATH"] = os.pathsep.join(
                p for p in (os.path.join(ROOT, ".matrix", release), ROOT, env.get("PYTHONPATH")) if p)
            name = release
        else:
            import torchmetrics

            name = torchmetrics.__version__
        print(f"torchmetrics {name}, torch {torch.__version__}, {args.device}, backend {args.backend}, set "
              f"{args.set}, model {args.model}, batch {args.batch}, {args.classes} classes; "
              f"{args.rounds} rounds x {args.number} steps",
              flush=True)
        for line in measure(args, run_env):
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
