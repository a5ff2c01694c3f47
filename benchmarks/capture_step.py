"""A launch-bound training step with metric updates: eager, patched, captured in CUDA graphs.

    python benchmarks/capture_step.py --device cuda                 # on a GPU (the figure this is for)
    python benchmarks/capture_step.py --device cuda --release 1.6.1 --batch 128 --classes 1000
    python benchmarks/capture_step.py --device cpu --backend eager --rounds 3   # a smoke run, no graphs

The step: a small MLP (``--width``, ``--depth``) trained with SGD on pre-built batches, host
paced on a GPU (many small kernels); then the published case's updates, MeanMetric of the
loss and multiclass Accuracy, Precision, Recall and F1 over ``--classes`` classes
(``validate_args=False``, a MetricCollection). Variants, each in its own child process:

* ``no metrics``; ``eager release`` (no tmpatch); ``eager patched`` (``tmpatch.apply()``);
* ``captured``: patched, the updates through ``tmpatch.capture`` (the MeanMetric and the
  collection: two compiled calls, each replayed from a CUDA graph; the model eager);
* ``compiled, no metrics`` and ``compiled``: the forward and loss (and the updates) compiled
  together with ``mode="reduce-overhead"``, backward and the optimizer step eager.

The parent runs ``--rounds`` rounds, each one block of ``--number`` steps of every variant
in rotating order, and reports the median step time, its ratio to ``no metrics`` (the
compiled ones also to ``compiled, no metrics``) and the metrics' share of the step
(``variant / its no-metrics step - 1``; the goal: at most 5% for ``captured``). Each child
also reports the graphs inductor did not capture (``counters["inductor"]["cudagraph_skips"]``;
the reasons are in its log, ``--logs``) and whether the metrics' results equal those of ``eager patched``
(``same``). Not run on a GPU here: the CPU smoke run checks the script.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from typing import Dict, List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VARIANTS = ("no metrics", "eager release", "eager patched", "captured", "compiled, no metrics", "compiled")


def child(args: argparse.Namespace, variant: str) -> None:
    import warnings

    warnings.filterwarnings("ignore")
    import torch

    if args.device == "cpu":
        torch.set_num_threads(1)
    try:  # inductor's reasons for each graph it did not capture ("skipping cudagraphs due to ..."): the child's log
        torch._logging.set_logs(perf_hints=True)
    except Exception:  # noqa: BLE001 - an older torch without the artifact
        pass
    if variant not in ("no metrics", "eager release", "compiled, no metrics"):
        import tmpatch

        tmpatch.apply()
    from torch._dynamo.utils import counters
    from torchmetrics import MeanMetric, MetricCollection
    from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score, MulticlassPrecision, MulticlassRecall

    device = torch.device(args.device)
    torch.manual_seed(0)
    layers: List[torch.nn.Module] = [torch.nn.Linear(args.features, args.width), torch.nn.ReLU()]
    for _ in range(args.depth - 2):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(args.width, args.classes)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    with_metrics = "no metrics" not in variant
    kw = {"num_classes": args.classes, "validate_args": False}
    mean = MeanMetric().to(device)
    collection = MetricCollection([cls(**kw) for cls in (MulticlassAccuracy, MulticlassPrecision, MulticlassRecall,
                                                         MulticlassF1Score)]).to(device)
    batches = [(torch.randn(args.batch, args.features, device=device),
                torch.randint(0, args.classes, (args.batch,), device=device)) for _ in range(8)]
    update_mean, update_collection = mean.update, collection.update
    if variant == "captured":
        import tmpatch

        options = {} if args.backend == "inductor" else {"backend": args.backend}
        update_mean, update_collection = tmpatch.capture(mean, **options), tmpatch.capture(collection, **options)

    compiled = variant.startswith("compiled")
    last: List[torch.Tensor] = []

    def forward(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits, y)
        if with_metrics and compiled:
            mean.update(loss.detach())
            collection.update(logits.detach(), y)
        elif with_metrics:
            last[:] = [logits.detach()]
        return loss

    if compiled:
        options = {"mode": "reduce-overhead"} if args.backend == "inductor" else {"backend": args.backend}
        forward = torch.compile(forward, **options)

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        optimizer.zero_grad(set_to_none=True)
        loss = forward(x, y)
        loss.backward()
        optimizer.step()
        if with_metrics and not compiled:
            update_mean(loss.detach())
            update_collection(last[0], y)

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for i in range(args.warmup):
        step(*batches[i % len(batches)])
    sync()
    # the metrics' results after the warm-up, against eager patched's (the parent compares them)
    result = ([round(float(v), 4) for v in [mean.compute()] + list(collection.compute().values())]
              if with_metrics else [])
    skips = counters["inductor"]["cudagraph_skips"]
    print("ready", skips, " ".join(map(str, result)) or "-", flush=True)
    i = 0
    for line in sys.stdin:
        if line.strip() != "go":
            break
        sync()
        t0 = time.perf_counter_ns()
        for _ in range(args.number):
            step(*batches[i % len(batches)])
            i += 1
        sync()
        print((time.perf_counter_ns() - t0) / args.number, flush=True)


def measure(args: argparse.Namespace, env: Dict[str, str]) -> List[str]:
    procs, info = {}, {}
    for variant in VARIANTS:
        cmd = [sys.executable, os.path.abspath(__file__), "--child", variant] + _forward(args)
        log = open(os.path.join(args.logs, f"capture_step.{variant.replace(' ', '_').replace(',', '')}.log"), "w")
        procs[variant] = subprocess.Popen(cmd, cwd=ROOT, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=log, text=True)
    for variant, proc in procs.items():
        words = proc.stdout.readline().split()
        if not words or words[0] != "ready":
            raise RuntimeError(f"{variant}: child failed to start (see {args.logs})")
        info[variant] = (int(words[1]), words[2:])
    times: Dict[str, List[float]] = {v: [] for v in VARIANTS}
    for r in range(args.rounds):
        for variant in VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]:
            procs[variant].stdin.write("go\n")
            procs[variant].stdin.flush()
            times[variant].append(float(procs[variant].stdout.readline()))
    for proc in procs.values():
        proc.stdin.close()
        proc.wait()
    median = {v: statistics.median(t) / 1e6 for v, t in times.items()}
    reference = info["eager patched"][1]
    out = [f"  {'variant':<22} {'ms/step':>8} {'/ no metrics':>12} {'metrics share':>13} {'cudagraph skips':>15}  same"]
    for variant in VARIANTS:
        base = "compiled, no metrics" if variant.startswith("compiled") else "no metrics"
        share = median[variant] / median[base] - 1 if variant != base else 0.0
        values = info[variant][1]
        same = "-" if values == ["-"] else ("yes" if values == reference else "NO")
        out.append(f"  {variant:<22} {median[variant]:8.3f} {median[variant] / median['no metrics']:12.3f} "
                   f"{share:12.1%} {info[variant][0]:>15}  {same}")
    return out


def _forward(args: argparse.Namespace) -> List[str]:
    return ["--device", args.device, "--backend", args.backend, "--batch", str(args.batch), "--classes",
            str(args.classes), "--features", str(args.features), "--width", str(args.width), "--depth",
            str(args.depth), "--number", str(args.number), "--warmup", str(args.warmup)]


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--release", action="append", help="a release from .matrix/ (default: the one on the path)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--backend", default="inductor")
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--features", type=int, default=256)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--depth", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--number", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--logs", default=os.environ.get("TMPDIR", "/tmp"), help="where the children's stderr goes")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args, args.child)
        return 0
    import torch

    for release in args.release or [None]:
        env = dict(os.environ)
        if release is not None:
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (os.path.join(ROOT, ".matrix", release), ROOT, env.get("PYTHONPATH")) if p)
        name = release
        if name is None:
            import torchmetrics

            name = torchmetrics.__version__
        gpu = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
        print(f"torchmetrics {name}, torch {torch.__version__}, {gpu}, backend {args.backend}, batch {args.batch}, "
              f"{args.classes} classes, MLP {args.depth}x{args.width}; {args.rounds} rounds x {args.number} steps",
              flush=True)
        for line in measure(args, env):
            print(line, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
