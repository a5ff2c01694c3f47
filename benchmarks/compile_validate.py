"""The published case's compiled step with the metrics' input validation on (``validate_args=True``, the
default) and off: graphs, graph breaks and recompiles, with and without tmpatch, on this torch.

    python benchmarks/compile_validate.py                 # release 1.9.0 from .matrix/, backend eager
    python benchmarks/compile_validate.py --here          # the torchmetrics on the path

The step is ``benchmarks/compile_step.py``'s (``make_step``): the cross-entropy of 64 logits, MeanMetric
of the loss and multiclass Accuracy, Precision, Recall and F1 (10 classes), given the logits, or their
argmax (``labels``: integer class predictions, which the release's validation checks value by value).
Each variant runs in its own child process: ``torch.compile(step, backend=...)`` (and once more with
``fullgraph=True``, where a graph break is an error), the first step, then ``--steps`` more on 8
batches. Counted with dynamo's counters: the graph breaks and graphs of the first step, the graphs
compiled after it (``later``), the frames compiled again after it (``recompiles``: a guard failed, from
dynamo's ``recompiles`` log; a frame first compiled at a later step is no recompile), and whether
``fullgraph=True`` compiles. Writes stdout only; compile_validate.txt holds the recorded runs.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from typing import Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
VARIANTS = [(validate, labels, patched) for labels in (False, True) for validate in (True, False)
            for patched in (False, True)]


class _Labels:
    """A metric updated with the argmax of the logits it is given (integer class predictions)."""

    def __init__(self, metric: object) -> None:
        self.metric = metric

    def update(self, logits: object, target: object) -> None:
        self.metric.update(logits.argmax(dim=1), target)  # type: ignore[attr-defined]


def _count_recompiles(torch: object) -> List[str]:
    """The functions dynamo compiles again (a guard failed), as its ``recompiles`` log names them (on
    stderr too), appended to the list returned."""
    import logging

    seen: List[str] = []

    class Count(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            message = record.getMessage()
            if message.lstrip().startswith("Recompiling function"):
                seen.append(message.split("\n")[0])

    torch._logging.set_logs(recompiles=True)  # type: ignore[attr-defined]
    for name in list(logging.root.manager.loggerDict):
        if name.endswith(".__recompiles"):
            logging.getLogger(name).addHandler(Count())
    return seen


def child(validate: bool, labels: bool, patched: bool, backend: str, steps: int) -> Dict[str, object]:
    import warnings

    warnings.filterwarnings("ignore")
    import torch

    torch.set_num_threads(1)
    if patched:
        import tmpatch

        tmpatch.apply()
    import torch._dynamo
    from torch._dynamo.utils import counters

    recompiles = _count_recompiles(torch)
    from torchmetrics import MeanMetric
    from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score, MulticlassPrecision, MulticlassRecall

    sys.path.insert(0, HERE)
    from compile_step import make_step

    out: Dict[str, object] = {}
    for fullgraph in (False, True):
        torch._dynamo.reset()
        counters.clear()
        torch.manual_seed(0)
        metrics = [MeanMetric()] + [cls(num_classes=10, validate_args=validate) for cls in (
            MulticlassAccuracy, MulticlassPrecision, MulticlassRecall, MulticlassF1Score)]
        batches = [(torch.randn(64, 10), torch.randint(0, 10, (64,))) for _ in range(8)]
        if labels:  # class predictions instead of logits, into the classification metrics (the loss takes logits)
            metrics = metrics[:1] + [_Labels(metric) for metric in metrics[1:]]
        with torch.no_grad():  # the release's first compiled _bincount crashes on torch 2.6+ without it
            for metric in metrics[1:]:
                metric.update(*batches[0])
        run = torch.compile(make_step(torch.nn.Identity(), metrics), backend=backend, fullgraph=fullgraph)
        try:
            run(*batches[0])
        except Exception as exc:  # noqa: BLE001 - fullgraph=True and a break: what is measured
            out["fullgraph"] = f"fails ({type(exc).__name__})"
            continue
        if fullgraph:
            out["fullgraph"] = "compiles"
            continue
        breaks, graphs = sum(counters["graph_break"].values()), counters["stats"]["unique_graphs"]
        first = len(recompiles)
        for i in range(steps):
            run(*batches[i % len(batches)])
        out.update(breaks=breaks, graphs=graphs, later=counters["stats"]["unique_graphs"] - graphs,
                   recompiles=len(recompiles) - first,
                   reasons=sorted({r.splitlines()[0][:70] for r in counters["graph_break"]}))
    return out


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--release", default="1.9.0", help="a release from .matrix/")
    parser.add_argument("--here", action="store_true", help="the torchmetrics on the path")
    parser.add_argument("--backend", default="eager")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        validate, labels, patched = json.loads(args.child)
        print(json.dumps(child(validate, labels, patched, args.backend, args.steps)))
        return 0
    import torch

    env = dict(os.environ, OMP_NUM_THREADS="1")
    if not args.here:
        if not os.path.isdir(os.path.join(ROOT, ".matrix", args.release)):
            parser.error(f".matrix/{args.release} is not installed (tools/matrix.py -r {args.release} installs it)")
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (os.path.join(ROOT, ".matrix", args.release), ROOT, env.get("PYTHONPATH")) if p)
    version = subprocess.run([sys.executable, "-c", "import torchmetrics; print(torchmetrics.__version__)"], env=env,
                             capture_output=True, text=True, check=True).stdout.strip()
    print(f"torchmetrics {version}, torch {torch.__version__}, Python {sys.version.split()[0]}, backend "
          f"{args.backend}, published step (10 classes, batch 64), first step + {args.steps}")
    print(f"  {'preds':<7}  {'validate_args':<13}  {'tmpatch':<9}  {'breaks':>6}  {'graphs':>6}  {'later':>5}  "
          f"{'recompiles':>10}  {'fullgraph=True':<20}  break reasons")
    for validate, labels, patched in VARIANTS:
        head = f"  {'labels' if labels else 'logits':<7}  {str(validate):<13}  {'patched' if patched else 'release':<9}"
        done = subprocess.run([sys.executable, __file__, "--child", json.dumps([validate, labels, patched]),
                               "--backend", args.backend, "--steps", str(args.steps)], env=env, capture_output=True,
                              text=True)
        if done.returncode:
            print(f"{head}  failed: {done.stderr.strip().splitlines()[-1:]}")
            continue
        found = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"{head}  {found.get('breaks', '-'):>6}  {found.get('graphs', '-'):>6}  {found.get('later', '-'):>5}  "
              f"{found.get('recompiles', '-'):>10}  {found['fullgraph']:<20}  "
              f"{' | '.join(found.get('reasons', [])) or '-'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
