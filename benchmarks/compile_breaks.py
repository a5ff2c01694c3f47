"""Graph breaks and recompiles of a compiled step that calls ``metric.update``, unpatched and patched.

    python benchmarks/compile_breaks.py                       # releases 1.0.0 1.4.0 1.6.1 1.9.0 from .matrix/
    python benchmarks/compile_breaks.py --release 1.6.1 --metric MeanMetric --reasons
    python benchmarks/compile_breaks.py --here                # the torchmetrics on the path
    /work/venvs/t251/bin/python benchmarks/compile_breaks.py --release 1.6.1   # another torch

As a new user would try it: CPU, ``torch.compile(step, backend="eager")`` where
``step`` calls ``metric.update(...)`` on a global metric (``validate_args=False``),
``--steps`` steps (default 6) with fresh inputs of one shape. Counted with
``torch._dynamo.utils.counters``: the figure in parentheses is the sum of its
graph-break counter over the run (dynamo counts a break once per frame it restarts, so
one break inside nested calls counts 2-4 times); ``sites`` are the distinct places
(file:line) where the first step breaks, from ``torch._dynamo.explain`` on a fresh
metric (it does not count a call to a ``torch._dynamo.disable``-d function: ``+count``
marks the one compiled_update makes on purpose under ``TMPATCH_UPDATE_COUNT=outside``,
where the update count is raised; by default it is added on the device, in the graph);
``recompiles`` the frames compiled after the first step.
``same``: the states after the run equal those of eager updates (NaN equal to NaN).
Unpatched and patched (``tmpatch.apply()`` before the metrics are built) run in separate
child processes. Writes stdout only; compile_breaks.txt holds the last recorded run.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Any, Dict, List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RELEASES = ("1.0.0", "1.4.0", "1.6.1", "1.9.0")
METRICS = (
    "MeanMetric", "SumMetric", "MaxMetric", "MinMetric", "CatMetric",
    "MulticlassAccuracy", "MulticlassF1Score", "BinaryAccuracy", "BinaryStatScores", "MultilabelF1Score",
    "BinaryConfusionMatrix", "MulticlassConfusionMatrix", "MultilabelConfusionMatrix",
    "BinaryAUROC", "MulticlassPrecisionRecallCurve", "MultilabelPrecisionRecallCurve",
)
N, C, L = 16, 5, 4


def _updater(metric: Any) -> Any:
    """``metric.update`` in a plain function (a closure over this metric only), for torch.compile."""

    def step(*args: Any) -> None:
        metric.update(*args)

    return step


def _child(names: List[str], patched: bool, steps: int) -> None:
    import warnings

    warnings.filterwarnings("ignore")
    import logging

    logging.getLogger("torch._dynamo").setLevel(logging.ERROR)
    import torch

    if patched:
        import tmpatch

        tmpatch.apply()
    import torch._dynamo
    import torchmetrics
    from torch._dynamo.utils import counters
    from torchmetrics import classification

    def build(name: str) -> Any:
        if hasattr(torchmetrics.aggregation, name):
            return getattr(torchmetrics.aggregation, name)(), lambda g: (torch.rand(N, generator=g),)
        kwargs: Dict[str, Any] = {"validate_args": False}
        if "AUROC" in name or "Curve" in name:
            kwargs["thresholds"] = 20
        cls = getattr(classification, name)
        if name.startswith("Multiclass"):
            return cls(num_classes=C, **kwargs), lambda g: (torch.rand(N, C, generator=g),
                                                           torch.randint(0, C, (N,), generator=g))
        if name.startswith("Multilabel"):
            return cls(num_labels=L, **kwargs), lambda g: (torch.rand(N, L, generator=g),
                                                          torch.randint(0, 2, (N, L), generator=g))
        return cls(**kwargs), lambda g: (torch.rand(N, generator=g), torch.randint(0, 2, (N,), generator=g))

    def same(a: Any, b: Any) -> bool:
        if isinstance(a, (list, tuple)):
            return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
        if a.is_floating_point():
            return torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0))
        return torch.equal(a, b)

    for name in names:
        torch._dynamo.reset()
        counters.clear()
        metric, inputs = build(name)
        reference, _ = build(name)
        g = torch.Generator().manual_seed(0)
        batches = [inputs(g) for _ in range(steps)]

        compiled = torch.compile(_updater(metric), backend="eager")
        row: Dict[str, Any] = {"metric": name}
        try:
            compiled(*batches[0])
            first = counters["frames"]["ok"]
            for batch in batches[1:]:
                compiled(*batch)
            for batch in batches:
                reference.update(*batch)
            row.update(breaks=sum(counters["graph_break"].values()), recompiles=counters["frames"]["ok"] - first,
                       same=all(same(getattr(metric, k), getattr(reference, k)) for k in metric._defaults),
                       reasons=sorted({r.splitlines()[0][:90] for r in counters["graph_break"]}),
                       own=any("_increment" in r for r in counters["graph_break"]))
            fresh, _ = build(name)
            torch._dynamo.reset()
            explained = torch._dynamo.explain(_updater(fresh))(*batches[0])
            row["sites"] = sorted({f"{os.path.basename(b.user_stack[-1].filename)}:{b.user_stack[-1].lineno}"
                                   for b in explained.break_reasons if b.user_stack})
        except Exception as exc:  # noqa: BLE001 - the outcome to report
            row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:90] if str(exc) else ''}"
        print(json.dumps(row), flush=True)


def _rows(env: Dict[str, str], names: List[str], patched: bool, steps: int) -> Dict[str, Dict[str, Any]]:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "patched" if patched else "unpatched",
           "--steps", str(steps)] + [arg for name in names for arg in ("--metric", name)]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    rows = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            row = json.loads(line)
            rows[row["metric"]] = row
    return rows


def _cell(row: Dict[str, Any]) -> str:
    if row is None:
        return "(no result)"
    if "error" in row:
        return "CRASH " + row["error"][:34]
    own = row.get("own", False)
    return (f"{len(row.get('sites', ())):>2} sites{' +count' if own else ''} ({row['breaks']:>2}), "
            f"{row['recompiles']} recompiles{'' if row['same'] else ', DIFFERS'}")


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--release", action="append", help="a release from .matrix/ (repeatable)")
    parser.add_argument("--here", action="store_true", help="the torchmetrics on the path")
    parser.add_argument("--metric", action="append", help="a metric class name (repeatable)")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--reasons", action="store_true", help="list the patched break reasons")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    names = args.metric or list(METRICS)
    if args.child:
        _child(names, args.child == "patched", args.steps)
        return 0
    import torch

    releases = [None] if args.here else (args.release or list(RELEASES))
    for release in releases:
        env = dict(os.environ, OMP_NUM_THREADS="1")
        if release is not None:
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (os.path.join(ROOT, ".matrix", release), ROOT, os.environ.get("PYTHONPATH")) if p)
        unpatched, patched = _rows(env, names, False, args.steps), _rows(env, names, True, args.steps)
        print(f"torch {torch.__version__}, torchmetrics {release or 'on the path'}, CPU, backend eager, "
              f"{args.steps} steps")
        print(f"  {'metric':<32} {'unpatched':<40} patched")
        totals = [0, 0]
        for name in names:
            u, p = unpatched.get(name), patched.get(name)
            for i, row in enumerate((u, p)):
                totals[i] += len(row.get("sites", ())) if row else 0
            print(f"  {name:<32} {_cell(u):<40} {_cell(p)}")
            if args.reasons:
                for label, row in (("unpatched", u), ("patched", p)):
                    for site in (row or {}).get("sites", ()):
                        print(f"      {label} break at {site}")
                    for reason in (row or {}).get("reasons", ()):
                        print(f"      {label} reason: {reason}")
        print(f"  {'break sites (crashed rows: 0)':<32} {totals[0]:<40} {totals[1]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
