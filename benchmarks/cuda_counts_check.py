"""On a real GPU: the patched counting updates give the release's states, bit for bit, and
their reports the CPU's counts (the ops the lean updates rely on: an out-of-place ``put``
with accumulation and negative indices, table lookups with negative indices, ``histc`` of
float32 for the logits test).

    PYTHONPATH=.matrix/1.9.0:. python benchmarks/cuda_counts_check.py [--device cuda]

Per case: valid classes, the release (unpatched, on the device) against the patched update;
then classes made invalid, the patched update against the release's update on the valid
positions alone (on the CPU) and the report's count. Prints one line per case and
``cuda_counts_check: N passed, N failed``; exit status 1 on a failure. ``--device cpu`` runs
the same comparisons here (the patches' CPU shortcuts off: the device path).
"""
from __future__ import annotations

import argparse
import re
import sys
from typing import Any, Callable, List, Tuple

import torch

import tmpatch

N, C, L, T = 64, 5, 3, 10


def _cases() -> List[Tuple[str, Callable[[], Any], Callable[[torch.Generator], Tuple[Any, Any]], str]]:
    from torchmetrics import classification as cls
    from torchmetrics.nominal import CramersV

    def multiclass(g: torch.Generator) -> Tuple[Any, Any]:
        return torch.randn(N, C, generator=g), torch.randint(0, C, (N,), generator=g)

    def labels(g: torch.Generator) -> Tuple[Any, Any]:
        return torch.randint(0, C, (N,), generator=g), torch.randint(0, C, (N,), generator=g)

    def binary(g: torch.Generator) -> Tuple[Any, Any]:
        return torch.rand(N, generator=g), torch.randint(0, 2, (N,), generator=g)

    def logits(g: torch.Generator) -> Tuple[Any, Any]:
        return torch.randn(N, generator=g) * 3, torch.randint(0, 2, (N,), generator=g)

    def multilabel(g: torch.Generator) -> Tuple[Any, Any]:
        return torch.rand(N, L, generator=g), torch.randint(0, 2, (N, L), generator=g)

    off = dict(validate_args=False)
    return [
        ("MulticlassAccuracy", lambda: cls.MulticlassAccuracy(C, **off), multiclass, "multiclass"),
        ("MulticlassF1Score(ignore_index=0)", lambda: cls.MulticlassF1Score(C, ignore_index=0, **off), multiclass,
         "multiclass"),
        ("MulticlassStatScores(micro)", lambda: cls.MulticlassStatScores(C, average="micro", **off), multiclass,
         "multiclass"),
        ("MulticlassStatScores(micro, ignore_index=0)",
         lambda: cls.MulticlassStatScores(C, average="micro", ignore_index=0, **off), multiclass, "multiclass"),
        ("MulticlassAccuracy(labels)", lambda: cls.MulticlassAccuracy(C, **off), labels, "multiclass"),
        ("MulticlassConfusionMatrix", lambda: cls.MulticlassConfusionMatrix(C, **off), multiclass, "multiclass"),
        ("MulticlassConfusionMatrix(ignore_index=0)", lambda: cls.MulticlassConfusionMatrix(C, ignore_index=0, **off),
         multiclass, "multiclass"),
        ("BinaryConfusionMatrix", lambda: cls.BinaryConfusionMatrix(**off), binary, "binary"),
        ("BinaryConfusionMatrix(logits)", lambda: cls.BinaryConfusionMatrix(**off), logits, "binary"),
        ("BinaryConfusionMatrix(ignore_index=-1)", lambda: cls.BinaryConfusionMatrix(ignore_index=-1, **off), binary,
         "binary"),
        ("MultilabelConfusionMatrix", lambda: cls.MultilabelConfusionMatrix(L, **off), multilabel, "binary"),
        ("BinaryAUROC(thresholds=10)", lambda: cls.BinaryAUROC(thresholds=T, **off), binary, "binary"),
        ("BinaryPrecisionRecallCurve(thresholds=10, ignore_index=-1)",
         lambda: cls.BinaryPrecisionRecallCurve(thresholds=T, ignore_index=-1, **off), binary, "binary"),
        ("MulticlassPrecisionRecallCurve(thresholds=10)",
         lambda: cls.MulticlassPrecisionRecallCurve(C, thresholds=T, **off), multiclass, "multiclass"),
        ("MulticlassPrecisionRecallCurve(thresholds=10, ignore_index=0)",
         lambda: cls.MulticlassPrecisionRecallCurve(C, thresholds=T, ignore_index=0, **off), multiclass,
         "multiclass"),
        ("MultilabelPrecisionRecallCurve(thresholds=10)",
         lambda: cls.MultilabelPrecisionRecallCurve(L, thresholds=T, **off), multilabel, "binary"),
        ("CramersV", lambda: CramersV(num_classes=C), labels, "multiclass"),
    ]


def _states(metric: Any) -> List[Any]:
    return [getattr(metric, name) for name in metric._defaults]


def _built(patched: bool, make: Callable[[], Any], device: str) -> Any:
    tmpatch.revert()
    if patched:
        tmpatch.apply()
    return make().to(device)


def _same(got: Any, want: Any) -> bool:
    got, want = got.cpu(), want.cpu()
    return got.dtype == want.dtype and got.shape == want.shape and bool(torch.equal(got, want))


def _reported(metric: Any) -> int:
    try:
        metric.compute()
    except RuntimeError as exc:
        found = re.search(r"tmpatch bincount: (\d+) value", str(exc))
        if found:
            return int(found.group(1))
        raise
    return 0


def check(name: str, make: Callable[[], Any], inputs: Callable[[torch.Generator], Tuple[Any, Any]], kind: str,
          device: str) -> Tuple[bool, str]:
    g = torch.Generator().manual_seed(0)
    preds, target = inputs(g)
    reference, patched = _built(False, make, device), _built(True, make, device)
    reference.update(preds.to(device), target.to(device))
    patched.update(preds.to(device), target.to(device))
    if not all(_same(a, b) for a, b in zip(_states(patched), _states(reference))):
        return False, "valid classes: states differ from the release's"
    bad = target.clone()
    flat = bad.view(-1)
    wrong = [-1, C, C + 7, -5] if kind == "multiclass" else [2, -1, 3, 7]
    positions = list(range(1, flat.numel(), max(1, flat.numel() // 7)))[:len(wrong)]
    for at, value in zip(positions, wrong):
        flat[at] = value
    ignore = getattr(patched, "ignore_index", None)
    keep = (bad >= 0) & (bad < (C if kind == "multiclass" else 2))
    expected = _built(False, make, "cpu")
    if keep.dim() == 1:
        expected.update(preds[keep], bad[keep])
    else:  # multilabel: the invalid entries' rows cannot be dropped alone; compare the report only
        expected = None
    counted = int((~keep & (bad != ignore)).sum()) if ignore is not None else int((~keep).sum())
    patched = _built(True, make, device)
    patched.update(preds.to(device), bad.to(device))
    if expected is not None and not all(_same(a, b) for a, b in zip(_states(patched), _states(expected))):
        return False, "invalid classes: states differ from the release's on the valid positions"
    reported = _reported(patched)
    if reported != counted:
        return False, f"invalid classes: {reported} reported, {counted} expected"
    return True, f"states equal, {reported} invalid value(s) reported"


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args(argv)
    if args.device == "cpu":
        sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.abspath(__file__)))
        import overhead

        overhead.device_path()
    import torchmetrics

    print(f"cuda_counts_check: torch {torch.__version__}, torchmetrics {torchmetrics.__version__}, {args.device}")
    passed = failed = 0
    for name, make, inputs, kind in _cases():
        try:
            ok, note = check(name, make, inputs, kind, args.device)
        except Exception as exc:  # noqa: BLE001 - a case that breaks is a failure, listed
            ok, note = False, f"{type(exc).__name__}: {str(exc)[:120]}"
        passed, failed = passed + ok, failed + (not ok)
        print(f"  {'ok  ' if ok else 'FAIL'} {name}: {note}")
    tmpatch.revert()
    print(f"cuda_counts_check: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
