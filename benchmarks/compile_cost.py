"""Where a compiled patched step's host time goes: dynamo's guards, the compiled graph's call,
the replay of side effects after it, and dynamo's own frame handling, next to the eager step.

    python benchmarks/compile_cost.py --set collection      # release 1.9.0 from .matrix/, CPU, inductor
    python benchmarks/compile_cost.py --model mlp
    python benchmarks/compile_cost.py --set none            # the cross-entropy alone (no metrics)

One process, the step of ``benchmarks/compile_step.py`` (same sets, ``--model``, batch and
classes), ``fullgraph=True``, tmpatch applied; warm (the same step back to back), so the figures
are lower than compile_step's interleaved ones. Per step, the thread's CPU time (median of 7
blocks): the compiled step; the same with ``torch.compiler.set_stance(skip_guard_eval_unsafe=True)``
(the difference: its guards); the compiled graph's call alone, in place (its global wrapped);
the rest (dynamo's frame handling and the replayed stores). Then the guard tree: its nodes, the
nodes under a source that reaches an object of tmpatch's (a name with ``tmpatch`` in it), the
checks run as Python (``LAMBDA_GUARD``), the graph's tensor inputs and the module attribute
stores replayed after the graph (``object_setattr_ignore_descriptor``). torch 2.6+.
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
from typing import Any, Callable, Dict, List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def _per_step(fn: Callable[..., Any], batches: List[Any], steps: int = 300) -> float:
    times = []
    for _ in range(7):
        start = time.thread_time_ns()
        for i in range(steps):
            fn(*batches[i % len(batches)])
        times.append((time.thread_time_ns() - start) / steps / 1e3)
    return statistics.median(times)


def _tree(text: str) -> Dict[str, int]:
    """Nodes of a guard manager's text, those under a source naming tmpatch, its Python checks."""
    nodes = tmpatch = python = 0
    stack: List[str] = []
    for line in text.splitlines():
        match = re.match(r"^([| ]*)\+- (.*)$", line)
        if not match:
            continue
        depth = len(match.group(1)) // 2
        stack = stack[:depth] + [match.group(2).split("#")[0]]
        nodes += 1
        tmpatch += any("tmpatch" in part for part in stack)
        python += "LAMBDA_GUARD" in match.group(2)
    return {"nodes": nodes, "tmpatch": tmpatch, "python": python}


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--set", default="published", choices=("published", "families", "collection", "none"))
    parser.add_argument("--model", default="none", choices=("none", "mlp"))
    parser.add_argument("--release", default="1.9.0", help="a release from .matrix/ (re-runs itself with it)")
    parser.add_argument("--here", action="store_true", help="the torchmetrics on the path")
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--features", type=int, default=64)
    args = parser.parse_args(argv)
    if not args.here:
        import subprocess

        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
            p for p in (os.path.join(ROOT, ".matrix", args.release), ROOT, os.environ.get("PYTHONPATH")) if p))
        return subprocess.call([sys.executable, os.path.abspath(__file__), "--here"] + argv, env=env)

    import warnings

    warnings.filterwarnings("ignore")
    import torch

    torch.set_num_threads(1)
    import tmpatch

    tmpatch.apply()
    import compile_step
    import torch._dynamo
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    torch.manual_seed(0)
    if args.model == "mlp":
        model: Any = torch.nn.Sequential(torch.nn.Linear(args.features, 128), torch.nn.ReLU(),
                                         torch.nn.Linear(128, args.classes)).eval()
    else:
        model = torch.nn.Identity()
    metrics = [] if args.set == "none" else compile_step._metrics(args.set, args.classes)
    features = args.features if args.model == "mlp" else args.classes
    batches = [(torch.randn(args.batch, features), torch.randint(0, args.classes, (args.batch,))) for _ in range(8)]
    if args.set == "collection":  # its compute groups, formed at a first eager update (as compile_step does)
        with torch.no_grad():
            metrics[1].update(model(batches[0][0]), batches[0][1])

    step = compile_step.make_step(model, metrics)

    run = torch.compile(step, fullgraph=True)
    for i in range(50):
        run(*batches[i % len(batches)])
    eager = _per_step(step, batches)
    total = _per_step(run, batches)
    with torch.compiler.set_stance(skip_guard_eval_unsafe=True):
        run(*batches[0])
        unguarded = _per_step(run, batches)
    (entry,) = _debug_get_cache_entry_list(step.__code__)
    scope = step.__globals__
    name = next(key for key in scope if key.startswith("__compiled_fn"))
    graph, spent, inputs = scope[name], [0], [0]

    def timed(*graph_args: Any) -> Any:
        inputs[0] = sum(isinstance(a, torch.Tensor) for a in graph_args)
        start = time.thread_time_ns()
        try:
            return graph(*graph_args)
        finally:
            spent[0] += time.thread_time_ns() - start

    scope[name] = timed
    try:
        _per_step(run, batches, steps=10)
        spent[0] = 0
        _per_step(run, batches)
        call = spent[0] / 7 / 300 / 1e3
    finally:
        scope[name] = graph
    tree = _tree(str(entry.guard_manager))
    import torch._dynamo.utils as dynamo_utils

    replay, replays = dynamo_utils.object_setattr_ignore_descriptor, [0]

    def counted(*store: Any) -> None:
        replays[0] += 1
        replay(*store)

    dynamo_utils.object_setattr_ignore_descriptor = counted
    try:
        run(*batches[0])
    finally:
        dynamo_utils.object_setattr_ignore_descriptor = replay
    print(f"torch {torch.__version__}, set {args.set}, model {args.model}; us per step (thread CPU time, warm)")
    print(f"  eager patched {eager:7.1f}   compiled {total:7.1f} ({total / eager:.2f} of eager)")
    print(f"  guards {total - unguarded:5.1f}   graph call {call:5.1f} (wrapped: +~1)   "
          f"rest (frame, replayed stores) {unguarded - call:5.1f}")
    print(f"  guard tree: {tree['nodes']} nodes, {tree['tmpatch']} under a source reaching tmpatch's objects, "
          f"{tree['python']} Python checks; graph tensor inputs {inputs[0]}; attribute stores replayed "
          f"{replays[0]} (about 0.3 us each)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
