"""The update being recorded, the deferred report, the device tables and ``_bincount``
with fixed-size bins.

A counting metric's ``update()`` (``metrics.py``) opens an :class:`Update` for the
release's code below it to see. The edits of the release's code-making statements
(``updates.py``) make the release's codes, those the release removed (ignored positions) and
those outside the count's ``minlength`` bins past them, note what would make the release raise
(the records below, in its words), and say how far the codes reach (:attr:`Update.space`);
``_bincount`` then counts them into fixed bins on the input's device without reading anything
back.
"""
from __future__ import annotations

from types import ModuleType
from typing import Any, Callable, List, Optional, Tuple

from tmpatch.patches import _constants
from tmpatch.runtime import deferred, policies
from tmpatch.runtime.compiled import ContextSlot, compiling
from tmpatch.spec import gated

#: the release's errors: ``torch.bincount`` of a negative code, ``one_hot`` of a class out of range
NEGATIVE = "bincount only supports 1-d non-negative integral inputs."
ONE_HOT_NEGATIVE = "Class values must be non-negative."
ONE_HOT_LARGE = "Class values must be smaller than num_classes."

_NOTE = ("tmpatch bincount: {count} value(s) seen by update() of {name}{where} since the last report {what}; "
         "reported at {point} instead of in update(). Unlike without tmpatch, the other values of those updates "
         "were counted into the metric's states: reset() discards them. TMPATCH_BINCOUNT=eager raises it in "
         "update(), as without tmpatch")


def _name(top: Any, found: List[Tuple[Any, int]]) -> str:
    inner = sorted({type(metric).__name__ for metric, _ in found if metric is not top})
    return type(top).__name__ + (f" ({', '.join(inner)} inside)" if inner else "")


def _size(metric: Any) -> str:
    """The shape the release's update reshapes its count to (its message names it)."""
    attributes = metric.__dict__
    thresholds = getattr(metric, "thresholds", None)
    steps = [int(thresholds.numel())] if thresholds is not None and hasattr(thresholds, "numel") else []
    if type(attributes.get("num_labels")) is int:
        dims = steps + [attributes["num_labels"], 2, 2]
    elif type(attributes.get("num_classes")) is int:
        n = attributes["num_classes"]
        dims = steps + [n, 2, 2] if steps else [n, n]
    else:
        dims = steps + [2, 2]
    return ", ".join(str(d) for d in dims)


def _reporter(message: Callable[[Any, List[Tuple[Any, int]]], str], what: str) -> Callable[..., None]:
    def report(top: Any, found: List[Tuple[Any, int]], all_ranks: bool) -> None:
        count = sum(n for _, n in found)
        where = " on some rank" if all_ranks else ""
        raise deferred.error_as_release(RuntimeError, message(top, found), _NOTE.format(
            count=count, name=_name(top, found), where=where, what=what, point=deferred.point()))

    return report


def _bins_message(top: Any, found: List[Tuple[Any, int]]) -> str:
    metric = found[0][0]
    bins = 1
    for d in _size(metric).split(", "):
        bins *= int(d)
    # the release names the count's length, its largest code + 1: not known without a read
    return f"shape '[{_size(metric)}]' is invalid for input of size larger than {bins}"


#: codes that make the release's ``torch.bincount`` raise (negative ones)
RECORD = deferred.Record("bincount", _reporter(
    lambda top, found: NEGATIVE, "were negative codes (from `target` or label `preds` below 0)"))
#: codes past the count's bins: the release's ``reshape`` of the longer count raises
BINS = deferred.Record("bincount_bins", _reporter(
    _bins_message, "were codes past the count's bins (from `target` or label `preds` of num_classes or more)"))
#: classes that make the release's ``one_hot`` raise (the multiclass curves' target)
CLASSES_NEGATIVE = deferred.Record("bincount_one_hot_negative", _reporter(
    lambda top, found: ONE_HOT_NEGATIVE, "were negative classes of `target`, left out of the counts"))
CLASSES_LARGE = deferred.Record("bincount_one_hot", _reporter(
    lambda top, found: ONE_HOT_LARGE, "were classes of `target` of num_classes or more, left out of the counts"))


class Update:
    """What the release's code inside one recorded ``update()`` needs to know."""

    __slots__ = ("metric", "labels", "keep", "skip", "drop", "space", "vouch", "counted")

    def __init__(self, metric: Any, labels: bool = False) -> None:
        self.metric = metric
        #: ``preds`` were scores of ``num_classes`` classes: the formatter's argmax labels are classes
        self.labels = labels
        self.keep: Any = None  # the formatter's kept positions (ignore_index); the others' target is -1
        self.skip: Any = None  # positions to leave out unreported (nominal: rows holding a NaN)
        self.drop: Any = None  # rows already reported invalid, to leave out (the micro curve's one-hot)
        #: the next _bincount's codes lie in [-space, space): those outside [0, minlength) are left out
        self.space = 0
        self.vouch = False  # the next _bincount input is negative exactly where positions are left out
        self.counted = False  # _bincount ran (the vectorised path, not a loop)

    def note(self, evidence: Any, kind: deferred.Kind, sign: int = 1, record: Any = None) -> None:
        """Count ``kind`` in ``evidence`` (a tensor made in this update) into ``record``'s report
        (:data:`RECORD` by default), later."""
        (record or RECORD).note(self.metric, evidence, kind, sign)

    def classes(self, target: Any, n: int, keep: Any) -> Any:
        """``target`` (int64) clamped to ``[-1, n]``, its classes out of range (which make the
        release's ``one_hot`` raise) reported in ``one_hot``'s words, the removed ones (``keep``
        False, their target -1) unreported."""
        clamped = target.clamp(-1, n)
        self.note(clamped, deferred.outside(0, n + 1), record=CLASSES_NEGATIVE)
        if keep is not None:
            self.note(keep, deferred.FALSE, -1, record=CLASSES_NEGATIVE)
        self.note(clamped, deferred.outside(-1, n), record=CLASSES_LARGE)
        return clamped

    def taken(self) -> Tuple[Any, Any]:
        """The formatter's kept positions and the skipped ones, each None where there are none
        (both taken: they concern the next codes alone)."""
        keep, skip, self.keep, self.skip = self.keep, self.skip, None, None
        return keep, skip


#: the release's ``_bincount`` counts with a mesh (or a loop) on every device, torch_xla installed
#: (``_XLA_AVAILABLE``): codes outside the bins are dropped there without an error
_MESH = [False]


def raises(x: Any) -> bool:
    """Whether the release's ``_bincount`` of ``x`` is ``torch.bincount`` (which raises on a negative
    code, and whose longer count makes the release's ``reshape`` raise), not its mesh (deterministic
    mode, torch_xla installed, MPS), which drops codes outside the bins without an error."""
    if _DETERMINISTIC[0] is None:
        import torch

        _DETERMINISTIC[0] = torch.are_deterministic_algorithms_enabled
    return not (_DETERMINISTIC[0]() or _MESH[0] or x.is_mps)


#: ``torch.are_deterministic_algorithms_enabled``, bound when first needed (no torch import here)
_DETERMINISTIC: List[Any] = [None]


#: int32 and int64 -> the most classes ``clamp`` can bound there (filled when the patch is built: a
#: first fill inside compiled code would be a guard that fails at the next step, a recompile; torch
#: 2.0's dtypes have no ``itemsize``)
_WIDE: dict = {}


def fill_wide() -> None:
    """Fill :data:`_WIDE` (once)."""
    if not _WIDE:
        import torch

        _WIDE.update({torch.int32: 2 ** 31, torch.int64: 2 ** 63})


def _wide_int(dtype: Any) -> bool:
    """int32 or int64: ``clamp`` takes any class count of ours there (int8/16 and uint8 would
    overflow on a large one)."""
    if not _WIDE:
        fill_wide()
    return dtype in _WIDE


def outside(x: Any, count: int) -> Any:
    """Where ``x`` is not a class of ``[0, count)`` (NaN included): for int32/int64 tensors
    ``clamp`` and ``!=`` (two kernels; on a launch-bound GPU each costs host time)."""
    if _wide_int(x.dtype) and 1 <= count <= _WIDE[x.dtype]:
        return x.clamp(0, count - 1) != x
    if x.dtype.is_floating_point:
        return ~((x >= 0) & (x < count))
    return (x < 0) | (x >= count)


def not_binary(x: Any) -> Any:
    """Where ``x`` is neither 0 nor 1 (``clamp`` and ``!=`` for int32/int64 tensors)."""
    if _wide_int(x.dtype):
        return x.clamp(0, 1) != x
    return (x != 0) & (x != 1)


#: the recorded update running in this thread / task, if any (a ContextVar; a plain slot in compiled code)
current = ContextSlot("tmpatch_bincount")


def recorded() -> Optional[Update]:
    """The recorded update the caller runs in, if any."""
    return current.get()


def active() -> bool:
    """Whether the bincount policy defers reports (``TMPATCH_BINCOUNT``)."""
    return policies.current.get("bincount", "deferred") == "deferred"


# -- device tables: made once per device (in compiled code: in the graph) ------------------
def table(name: str, args: Tuple[Any, ...], device: Any, make: Callable[[], Any]) -> Any:
    """The constant ``name(args)`` on ``device`` (``make()`` builds it), never written into."""
    if compiling():
        return make()
    return _constants.cached(("bincount", name) + args + (device,), make)


def counter(space: int, device: Any) -> Tuple[Any, Any]:
    """``space`` int64 zeros, what a count starts from (copied by ``put``, never changed), and
    a 0-d int64 one, every position's weight (expanded to the codes' length, a view)."""
    import torch

    return table("counter", (space,), device, lambda: (torch.zeros(space, dtype=torch.int64, device=device),
                                                      torch.ones((), dtype=torch.int64, device=device)))


def build_bincount(module: ModuleType) -> Callable[..., Any]:
    """``_bincount`` (every release): inside a recorded update, count into ``minlength``
    int64 bins on the input's device. Codes made by an edited statement lie in
    ``[-space, space)``: an out-of-place ``put`` with accumulation adds each one at its
    index (a negative one wraps to the end), and the first ``minlength`` bins are the
    count, in one op, with no read (deterministic mode on CUDA, compiled code and other
    devices: ``scatter_add_`` of the codes taken modulo ``space``). Other callers' values
    outside ``[0, minlength)`` are left out: where the caller vouched (every value in range
    or negative) the negative ones are positions it left out, else they are reported where the
    release's ``torch.bincount`` would raise on them (:func:`raises`).
    Elsewhere (functional API, compute-time callers, metrics built before ``apply()``,
    no ``minlength``) the release's own ``_bincount`` runs."""
    import torch

    fill_wide()
    _MESH[0] = bool(getattr(module, "_XLA_AVAILABLE", False))
    where, int64, int32, bincount, put = torch.where, torch.int64, torch.int32, torch.bincount, torch.put
    new_zeros = torch.zeros
    deterministic = getattr(torch._C, "_get_deterministic_algorithms", torch.are_deterministic_algorithms_enabled)
    _DETERMINISTIC[0] = torch.are_deterministic_algorithms_enabled
    integral = frozenset({torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64})

    @gated(current)
    def _bincount(original: Callable, x: Any, minlength: Optional[int] = None) -> Any:
        update = recorded()
        if (update is None or type(minlength) is not int or minlength <= 0 or x.dtype not in integral
                or x.dim() != 1):
            return original(x, minlength=minlength)
        space, vouched, update.space, update.vouch, update.counted = update.space, update.vouch, 0, False, True
        if space and x.dtype is int64:  # codes of an edited statement: in [-space, space)
            if (x.is_cpu or (x.is_cuda and not deterministic())) and not compiling():
                # put_ accumulates (atomics on CUDA, serially on the CPU) and wraps negative indices
                start, one = counter(space, x.device)
                return put(start, x, one.expand(x.numel()), accumulate=True)[:minlength]
            # compiled: int32 bins, as below; deterministic mode on CUDA and other devices: int64
            kind = int32 if compiling() else int64
            out = new_zeros(space, dtype=kind, device=x.device)
            out.scatter_add_(0, x.remainder(space), torch.ones_like(x, dtype=kind))
            return out[:minlength] if kind is int64 else out[:minlength].long()
        if x.is_cpu and x.numel() and not compiling():
            try:  # in range: torch.bincount is the count (and deterministic on the CPU)
                counted = bincount(x, minlength=minlength)
            except RuntimeError:  # a negative value
                counted = None
            if counted is not None and counted.shape[0] == minlength:
                return counted
        # compiled: int32 bins (exact: one update counts far fewer than 2**31 values), which inductor
        # adds to in its own kernel; int64 scatters are a separate, unfused call of ATen's
        kind = int32 if compiling() else int64
        out = new_zeros(minlength, dtype=kind, device=x.device)
        if vouched:  # every value is in range or negative (a position left out): two kernels fewer.
            # The upper clamp only keeps a caller's defect in bounds (a CUDA scatter out of bounds
            # would end the process's CUDA context); every caller's codes stay below minlength
            out.scatter_add_(0, x.clamp(0, minlength - 1).long(), (x >= 0).to(kind))
            return out if kind is int64 else out.long()
        inside = (x >= 0) & (x < minlength)
        out.scatter_add_(0, where(inside, x, 0).long(), inside.to(kind))
        if x.numel() and raises(x):  # what the release's torch.bincount (and reshape) would raise on
            update.note(x < 0, deferred.SUM)
            update.note(x >= minlength, deferred.SUM, record=BINS)
        return out if kind is int64 else out.long()

    return _bincount
