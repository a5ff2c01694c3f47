"""Real syncs of PearsonCorrCoef and ConcordanceCorrCoef on a GPU, unpatched and patched,
through a metric's life: built, moved with ``.to()``, updated, reset, updated, used with
``forward()``, copied on the device (``clone()``) and updated.

    python benchmarks/pearson_reads.py            # needs a CUDA GPU (torch.cuda.set_sync_debug_mode)

Each step's syncs are counted with ``torch.cuda.set_sync_debug_mode("warn")``. The patch
(``pearson_update``, torchmetrics before 1.7.4) should leave none in the updates, one in the
first update after a copy made on the device, and the reads of ``compute()`` inside
``forward()``. Writes nothing but stdout.
"""
from __future__ import annotations

import warnings
from typing import Any, Callable, List, Tuple

import torch

SYNC_MESSAGE = "synchronizing CUDA operation"


def _syncs(step: Callable[[], Any]) -> int:
    torch.cuda.synchronize()
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    return sum(1 for w in caught if SYNC_MESSAGE in str(w.message))


def _life(cls: type) -> List[Tuple[str, int]]:
    batch = [(torch.rand(32, device="cuda"), torch.rand(32, device="cuda")) for _ in range(3)]
    metric = cls().to("cuda")
    rows = []
    for i in range(3):
        rows.append((f"update {i + 1}", _syncs(lambda i=i: metric.update(*batch[i]))))
    rows.append(("reset", _syncs(metric.reset)))
    for i in range(2):
        rows.append((f"update {i + 1} after reset", _syncs(lambda i=i: metric.update(*batch[i]))))
    for i in range(3):
        rows.append((f"forward {i + 1}", _syncs(lambda i=i: metric(*batch[i]))))
    copy = metric.clone()
    rows.append(("update of a clone", _syncs(lambda: copy.update(*batch[0]))))
    rows.append(("next update of the clone", _syncs(lambda: copy.update(*batch[1]))))
    return rows


def main() -> int:
    import torchmetrics
    from torchmetrics.regression import ConcordanceCorrCoef, PearsonCorrCoef

    import tmpatch

    if not torch.cuda.is_available():
        print("pearson_reads: needs a CUDA GPU")
        return 0
    print(f"pearson_reads: torch {torch.__version__}, torchmetrics {torchmetrics.__version__}, "
          f"{torch.cuda.get_device_name()}; syncs per step (set_sync_debug_mode)")
    for cls in (PearsonCorrCoef, ConcordanceCorrCoef):
        tmpatch.revert()
        before = _life(cls)
        states = tmpatch.apply(["pearson_update"])
        after = _life(cls)
        tmpatch.revert()
        state = next(row.state for row in states if row.name == "pearson_update")
        print(f"\n{cls.__name__} (pearson_update: {state})")
        print(f"  {'step':28s} unpatched  patched")
        for (name, u), (_, p) in zip(before, after):
            print(f"  {name:28s} {u:9d} {p:8d}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
