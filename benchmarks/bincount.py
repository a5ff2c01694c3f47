"""Host time and peak memory of ``_bincount(x, minlength)``: upstream paths vs tmpatch's.

    PYTHONPATH=/tmp/tm/1.9.0:. python benchmarks/bincount.py > benchmarks/bincount.txt

CPU only (this benchmark's machine has no GPU). Rows: ``torch.bincount`` (upstream's
default path; on CUDA it adds two device reads), upstream's deterministic mesh
(N x minlength int64: skipped above 2**28 elements, i.e. 2 GiB) and tmpatch's
``scatter_add_`` path (run inside a metric's update, as in training). Memory: peak
bytes allocated by the call, measured with the CPU allocator's profiler.
"""
from __future__ import annotations

import statistics
import sys
import time

import torch
from torchmetrics.classification import MulticlassStatScores
from torchmetrics.utilities import data

import tmpatch
from tmpatch.patches import bincount as patch

MESH_LIMIT = 2**28


def _timed(fn, repeat: int) -> float:
    fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _peak(fn) -> int:
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = [e for e in prof.events() if e.cpu_memory_usage > 0]
    return sum(e.cpu_memory_usage for e in events if e.cpu_parent is None) if events else 0


def main() -> None:
    torch.set_num_threads(1)
    original = data._bincount
    tmpatch.apply(["bincount"])
    metric = MulticlassStatScores(num_classes=3, validate_args=False)

    def patched(x: torch.Tensor, n: int) -> torch.Tensor:
        token = patch._current.set(metric)
        try:
            return data._bincount(x, minlength=n)
        finally:
            patch._current.reset(token)

    def mesh(x: torch.Tensor, n: int) -> torch.Tensor:
        torch.use_deterministic_algorithms(True)
        try:
            return original(x, minlength=n)
        finally:
            torch.use_deterministic_algorithms(False)

    sys.stdout.write(f"torch {torch.__version__}, 1 CPU thread; median host time, peak bytes allocated by the call\n")
    sys.stdout.write(f"{'N':>9} {'minlength':>9} | {'torch.bincount':>22} | {'upstream mesh':>22} | {'tmpatch':>22}\n")
    for size in (10**3, 10**4, 10**5, 10**6):
        for minlength in (10, 10**3, 10**4, 10**6):
            x = torch.randint(0, minlength, (size,))
            repeat = 20 if size * 1 <= 10**5 else 5
            cells = []
            for name, fn in (("bincount", lambda x=x, minlength=minlength: torch.bincount(x, minlength=minlength)),
                             ("mesh", lambda x=x, minlength=minlength: mesh(x, minlength)),
                             ("tmpatch", lambda x=x, minlength=minlength: patched(x, minlength))):
                if name == "mesh" and size * minlength > MESH_LIMIT:
                    cells.append(f"{'skipped (> 2 GiB)':>22}")
                    continue
                seconds = _timed(fn, 3 if name == "mesh" and size * minlength > 10**7 else repeat)
                cells.append(f"{seconds * 1e3:9.3f} ms {_peak(fn) / 2**20:7.2f} MiB")
            assert torch.equal(patched(x, minlength), torch.bincount(x, minlength=minlength))
            sys.stdout.write(f"{size:>9} {minlength:>9} | " + " | ".join(cells) + "\n")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
