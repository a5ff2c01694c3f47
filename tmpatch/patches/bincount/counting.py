"""The update being recorded, the deferred report, and ``_bincount`` with fixed-size bins.

A counting metric's ``update()`` (``metrics.py``) opens an :class:`Update` for the
release's code below it to see; the formatter edits and update wrappers leave ignored
and invalid positions in place but out of every count, and ``_bincount`` counts into
``minlength`` bins on the input's device without reading anything back.
"""
from __future__ import annotations

from types import ModuleType
from typing import Any, Callable, List, Optional, Tuple

from tmpatch import deferred, settings
from tmpatch.compiled import ContextSlot, compiling
from tmpatch.spec import gated

MESSAGE = (
    "tmpatch bincount: {count} value(s) seen by update() since the last compute() of {name} were not valid "
    "classes ({what}) and were left out of the counts. Without tmpatch, update() would have raised, or counted "
    "them in the wrong cells. Check `target` and label `preds`: classes in [0, num_classes) for multiclass "
    "metrics, 0 or 1 for binary and multilabel ones (values equal to `ignore_index` excepted). "
    "TMPATCH_BINCOUNT=eager gives the release's behaviour in update()."
)


def _report(top: Any, found: List[Tuple[Any, int]], all_ranks: bool) -> None:
    count = sum(n for _, n in found)
    names = sorted({type(metric).__name__ for metric, _ in found})
    name = type(top).__name__ + (f" ({', '.join(n for n in names if n != type(top).__name__)} inside)"
                                 if any(n != type(top).__name__ for n in names) else "")
    where = "over all ranks" if all_ranks else "on this rank"
    raise RuntimeError(MESSAGE.format(count=count, name=name, what=where))


#: values outside the valid classes, counted during updates, reported at compute
RECORD = deferred.Record("bincount", _report)


class Update:
    """What the release's code inside one recorded ``update()`` needs to know."""

    __slots__ = ("metric", "ignored", "drop", "vouch", "counted")

    def __init__(self, metric: Any) -> None:
        self.metric = metric
        self.ignored: Any = None  # positions the formatter would have removed (ignore_index)
        self.drop: Any = None  # positions already reported invalid, to leave out
        self.vouch = False  # the next _bincount input is negative exactly where positions are left out
        self.counted = False  # _bincount ran (the vectorised path, not a loop)

    def bad(self, mask: Any) -> None:
        """Report the positions of ``mask`` (True: invalid, not ignored) at compute."""
        RECORD.add(self.metric, mask.sum())


#: the recorded update running in this thread / task, if any (a ContextVar; a plain slot in compiled code)
current = ContextSlot("tmpatch_bincount")


def recorded() -> Optional[Update]:
    """The recorded update the caller runs in, if any."""
    return current.get()


def active() -> bool:
    """Whether the bincount policy defers reports (``TMPATCH_BINCOUNT``)."""
    return settings.policy.get("bincount", "deferred") == "deferred"


def build_bincount(module: ModuleType) -> Callable[..., Any]:
    """``_bincount`` (every release): inside a recorded update, count into ``minlength``
    int64 bins on the input's device (``scatter_add_``; on the CPU ``torch.bincount``,
    which reads nothing back there). Values outside ``[0, minlength)`` are left out: where
    the caller vouched for them they are positions it left out, else they are reported.
    Elsewhere (functional API, compute-time callers, metrics built before ``apply()``,
    no ``minlength``) the release's own ``_bincount`` runs."""
    import torch

    zeros, where, int64, bincount = torch.zeros, torch.where, torch.int64, torch.bincount
    integral = frozenset({torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64})

    @gated(current)
    def _bincount(original: Callable, x: Any, minlength: Optional[int] = None) -> Any:
        update = recorded()
        if (update is None or type(minlength) is not int or minlength <= 0 or x.dtype not in integral
                or x.dim() != 1):
            return original(x, minlength=minlength)
        vouched, update.vouch, update.counted = update.vouch, False, True
        if x.device.type == "cpu" and x.numel() and not compiling():
            try:  # in range: torch.bincount is the count (and deterministic on the CPU)
                out = bincount(x, minlength=minlength)
            except RuntimeError:  # a negative value
                out = None
            if out is not None and out.shape[0] == minlength:
                return out
        inside = (x >= 0) & (x < minlength)
        out = zeros(minlength, dtype=int64, device=x.device).scatter_add_(0, where(inside, x, 0).long(),
                                                                           inside.long())
        if not vouched and x.numel():
            update.bad(~inside)
        return out

    return _bincount
