"""Kernels launched per ``update()`` on CUDA, unpatched and patched, for every panel row: a proxy,
on a machine without a GPU, for the host time that paces a launch-bound GPU step.

    PYTHONPATH=.matrix/1.9.0:. python benchmarks/kernel_counts.py
    PYTHONPATH=.matrix/1.9.0:. python benchmarks/kernel_counts.py --gpu-times benchmarks/gpu/calibration-1.9.0.txt
    PYTHONPATH=.matrix/1.9.0:. python benchmarks/kernel_counts.py --updates 64   # the mean over 64 updates

Each row's calls run twice on simulated CUDA tensors (tmpatch.audit's simulation; the first
run warms up), and the ATen ops of the second run that would launch work on the device are
counted: every op whose result lies on the device, or that reads a device tensor (a copy to
the host), less views and metadata (``view``, ``expand``, ``select``, ``prim.device``...) and
allocations (``empty``: memory from the caching allocator, nothing launched). A 0-d tensor
made on the device for an operand counts: ``torch.where(mask, x, 0.0)`` makes its
``scalar_tensor`` on the mask's device, a fill kernel on a GPU (a Python scalar of ``x + 1.0``
is wrapped on the host, passed to the kernel as an argument: no op of its own). A read of a
device value into Python (``.item()``, ``if t:``: ``_local_scalar_dense``) counts once, for the
copy to the host it launches, as ``.cpu()`` and a non-blocking copy to pinned memory do; the
host's wait that follows (the sync) is not counted. So do the copies an op makes inside
itself, each once beside its kernel: what the audit finds a sync of an op that is not itself
a read or a copy (CUDA ``bincount`` reads its input's range back to size its output,
``nonzero`` its count, a CPU index is copied to the device: the key ``aten.bincount (its
copies to or from the host)``). Other than that an op is counted once however many kernels it
launches on a real GPU (``bincount``: two reductions, a fill and the count; an out-of-place
``put``: a copy and the count). On an H200 with torch 2.11 the real time per
``update()`` (launch-bound: small inputs) grew with the kernel count: ``--gpu-times`` reads a
calibration report (``python -m tmpatch.audit.calibrate``) and prints its patched/unpatched
ratio beside the count's. ``--updates N``: the mean over N calls, which counts what a patched
update does only every so often (a deferred report's evidence sent to the host every
``tmpatch.runtime.deferred.landing.LANDING`` entries, in a stack, a reduction and a copy).
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import os
import re
import statistics
import sys
from typing import Any, Dict, Iterator, List, Optional, Tuple
from unittest import mock

import torch
from torch.utils._python_dispatch import TorchDispatchMode

#: ops that launch nothing on the device: views, metadata, allocations
NOT_KERNELS = frozenset({
    "prim.device", "aten.view", "aten._unsafe_view", "aten.expand", "aten.select", "aten.slice",
    "aten.unsqueeze", "aten.squeeze", "aten.t", "aten.permute", "aten.transpose", "aten.alias",
    "aten.detach", "aten.as_strided", "aten.reshape", "aten.diagonal",
    "aten.lift_fresh", "aten.unbind", "aten.split", "aten.split_with_sizes", "aten.chunk", "aten.flatten",
    "aten.sym_size", "aten.sym_stride", "aten.sym_numel", "aten.sym_storage_offset", "aten.is_pinned",
    # allocations: memory from the caching allocator, no kernel
    "aten.empty", "aten.empty_like", "aten.empty_strided", "aten.new_empty", "aten.new_empty_strided",
})


class _Kernels(TorchDispatchMode):
    """Counts the ops that launch device work: a CUDA tensor among their results or arguments,
    the op not one of :data:`NOT_KERNELS`."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = str(func.overloadpacket)
        leaves = torch.utils._pytree.tree_flatten((args, kwargs or {}, out))[0]
        if name not in NOT_KERNELS and any(isinstance(t, torch.Tensor) and t.device.type == "cuda" for t in leaves):
            self.ops[name] += 1
            inside = _copies_inside(func, args, kwargs or {})
            if inside:
                self.ops[name + INSIDE] += inside
        return out


#: the key of the copies between host and device that an op makes inside (``aten.bincount`` + INSIDE)
INSIDE = " (its copies to or from the host)"


def _copies_inside(func: Any, args: Any, kwargs: Any) -> int:
    """The copies between host and device that ``func`` makes inside itself, besides its own
    kernel: what the audit finds a sync of an op that is not itself a read or a copy (CUDA
    ``bincount`` reads min and max back, ``nonzero`` its count, a CPU index is copied over)."""
    from tmpatch.audit.oracle import classify

    packet = func.overloadpacket
    if packet in classify._READS or packet in classify._COPIES or packet in classify._LIFTS:
        return 0  # the op is the read or the copy: counted once, as the op
    try:
        return sum(1 for kind, _ in classify.classify_all(func, args, kwargs) if kind.is_sync)
    except Exception:  # noqa: BLE001 - an op the audit cannot read: its kernel alone
        return 0


def count_row(row: Any, patched: bool, updates: int = 1) -> Optional[collections.Counter]:
    """The kernels of one row's second ``update()`` (None: the row cannot run here); with
    ``updates`` > 1, of that many calls after the first (divide by ``updates`` for the mean)."""
    import tmpatch
    from tmpatch.audit.modes import deterministic
    from tmpatch.audit.oracle.sim import simulated_cuda

    tmpatch.revert()
    if patched:
        tmpatch.apply()
    try:
        calls = row.build()
        with deterministic(row.deterministic), simulated_cuda(row.device) as sim, _landing_at_once(updates > 1):
            moved = [(sim.put(t) if isinstance(t, torch.nn.Module) else t, sim.put(a), sim.put(k)) for t, a, k in calls]

            def run() -> None:
                for target, args, kwargs in moved:
                    (target.update if isinstance(target, torch.nn.Module) else target)(*args, **kwargs)

            run()
            with _Kernels() as counter:
                for _ in range(updates):
                    run()
        return counter.ops
    except Exception as exc:  # noqa: BLE001 - a row that cannot run is listed as such
        print(f"  {row.name}: {type(exc).__name__}: {str(exc)[:80]}", file=sys.stderr)
        return None
    finally:
        tmpatch.revert()


@contextlib.contextmanager
def _landing_at_once(on: bool) -> Iterator[None]:
    """Over many updates: each copy of a deferred report's evidence to the host lands before the next
    update (a GPU that keeps up), so that a flight leaves every ``LANDING`` entries, as it would there
    (on simulated CUDA a copy never lands: the next flight would wait, and the evidence pile up)."""
    landing = None
    if on:
        try:
            from tmpatch.runtime.deferred import landing
        except ImportError:  # a tmpatch without flights
            landing = None
    if landing is None:
        yield
        return
    with mock.patch.object(landing.Flight, "landed", lambda flight: {}):  # landed, and a simulated copy says nothing
        yield


def gpu_times(path: str) -> Dict[str, float]:
    """Row -> patched/unpatched real time per update() from a calibration report."""
    found: Dict[str, float] = {}
    pattern = re.compile(r"^  (.+?)\s+([\d.]+) ms ->\s+([\d.]+) ms\s+\(([\d.]+)\)$")
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            match = pattern.match(line.rstrip("\n"))
            if match:
                found[match.group(1).strip()] = float(match.group(3)) / float(match.group(2))
    return found


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--gpu-times", metavar="FILE", help="a calibration report with real times per update()")
    parser.add_argument("--row", action="append", help="only rows whose name contains this (repeatable)")
    parser.add_argument("--updates", type=int, default=1, metavar="N",
                        help="the mean over N calls after the first (with N > 1 each copy of a deferred report's "
                             "evidence to the host lands before the next call, as on a GPU that keeps up)")
    args = parser.parse_args(argv)

    import torchmetrics

    import tmpatch
    from tmpatch.audit.panel.rows import ROWS, _resolve

    times = gpu_times(args.gpu_times) if args.gpu_times else {}
    which = "second call" if args.updates == 1 else f"mean of calls 2 to {args.updates + 1}"
    print(f"kernel_counts: torch {torch.__version__}, torchmetrics {torchmetrics.__version__}; kernels per update() "
          f"({which}) on simulated CUDA; tmpatch from {os.path.dirname(os.path.dirname(tmpatch.__file__))}")
    head = f"{'row':<62} {'unpatched':>9} {'patched':>8} {'ratio':>6}" + (f" {'GPU time ratio':>15}" if times else "")
    print("\n" + head)
    pairs: List[Tuple[float, float]] = []
    for row in ROWS:
        if args.row and not any(part.lower() in row.name.lower() for part in args.row):
            continue
        try:
            for name in row.requires:
                _resolve(name)
        except (ImportError, AttributeError):
            continue
        before, after = count_row(row, False, args.updates), count_row(row, True, args.updates)
        if before is None or after is None:
            continue
        u, p = sum(before.values()) / args.updates, sum(after.values()) / args.updates
        ratio = p / u if u else float("nan")
        cells = f"{u:>9g} {p:>8g}" if args.updates == 1 else f"{u:>9.2f} {p:>8.2f}"
        line = f"{row.name[:62]:<62} {cells} {ratio:>6.2f}"
        if row.name in times:
            line += f" {times[row.name]:>15.2f}"
            if u:
                pairs.append((ratio, times[row.name]))
        print(line)
    if len(pairs) >= 3:
        xs, ys = [x for x, _ in pairs], [y for _, y in pairs]
        print(f"\nrows with a GPU time: {len(pairs)}; correlation of the two ratios: "
              f"{statistics.correlation(xs, ys):.2f}" if hasattr(statistics, "correlation") else "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
