"""What a simulated run knows of integer values: the range they come from.

Simulated tensors have no values, so a size that depends on them is the largest it can be
(:mod:`tmpatch.audit.oracle.continuation`): ``torch.unique`` keeps every element. That is wrong
where the values come from a known range, and a release's input check then fails on
them (``len(torch.unique(target)) > num_classes``). A storage of the simulation therefore
has a range ``[low, high)`` when every value in it is an integer in that range, from:

* ``torch.randint``/``randint_like``/``random_`` (their range), ``arange``, ``full``,
  ``zeros``, ``ones``, ``fill_``, ``zero_`` (their values);
* a copy of real host data (``torch.tensor([...], device="cuda")``, ``x.to("cuda")`` of a
  real CPU tensor): the data's own minimum and maximum;
* indices: ``argmax``/``argmin``, the indices of ``max``/``min``/``sort``/``topk`` along a
  dimension, ``argsort``;
* ops whose values are some of their inputs' (copies, selections, ``cat``, ``where``,
  ``unique`` ...), when the range of each input is known; a view shares its base's storage.

A write into a storage widens its range by what is written, or forgets it when that is
not known: the range always holds every value. ``unique`` of a tensor with a range keeps
at most as many elements as the range has integers (booleans: 2).
"""
from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import _disable_current_modes

log = logging.getLogger("tmpatch")
aten = torch.ops.aten

Bounds = Tuple[int, int]

#: storage (``_cdata``) -> (a weak reference to it, the range of the values in it)
_RANGES: Dict[int, Tuple[Any, Bounds]] = {}


def _ops(*names: str) -> frozenset:
    return frozenset(getattr(aten, name) for name in names if hasattr(aten, name))


#: new tensors whose values are some of their first argument's
_SELECTIONS = _ops("_to_copy", "clone", "index", "index_select", "gather", "masked_select", "take", "repeat",
                   "flip", "roll", "lift_fresh_copy", "_unique", "_unique2", "unique_dim", "unique_consecutive",
                   "unique_dim_consecutive", "amax", "amin", "max", "min", "sort", "topk", "kthvalue", "median",
                   "mode", "narrow_copy", "expand_copy", "permute_copy", "view_copy", "_reshape_copy", "msort")
#: several tensors in their first argument (a list)
_JOINS = _ops("cat", "stack", "hstack", "vstack", "concat", "concatenate")
#: indices along a dimension: (op, index of the output that holds them or None for the output itself)
_INDICES: Dict[Any, Optional[int]] = {
    **{op: None for op in _ops("argmax", "argmin", "argsort")},
    **{op: 1 for op in _ops("max", "min", "sort", "topk", "kthvalue", "median", "mode")},
}


def _integral(dtype: torch.dtype) -> bool:
    return dtype is torch.bool or not (dtype.is_floating_point or dtype.is_complex)


def _fits(bounds: Bounds, dtype: torch.dtype) -> bool:
    """Whether every integer in ``bounds`` is a value of ``dtype`` (a cast keeps them)."""
    if dtype is torch.bool:
        return 0 <= bounds[0] and bounds[1] <= 2
    if dtype.is_floating_point:
        return max(abs(bounds[0]), abs(bounds[1])) <= round(2 / torch.finfo(dtype).eps)  # integers exact
    if dtype.is_complex:
        return False
    info = torch.iinfo(dtype)
    return info.min <= bounds[0] and bounds[1] - 1 <= info.max


def get(t: Any) -> Optional[Bounds]:
    """The range of ``t``'s values, if known."""
    if not isinstance(t, torch.Tensor):
        return None
    if isinstance(t, FakeTensor):
        try:
            entry = _RANGES.get(t.untyped_storage()._cdata)
        except Exception:  # noqa: BLE001 - a tensor without storage: unknown
            return None
        return entry[1] if entry is not None and not entry[0].expired() else None
    return _real(t)


def _real(t: torch.Tensor) -> Optional[Bounds]:
    """The range of a real host tensor's values (integers only)."""
    if t.device.type != "cpu" or not _integral(t.dtype) or t.numel() == 0:
        return None
    with _disable_current_modes():
        return int(t.min()), int(t.max()) + 1


def _set(t: Any, bounds: Optional[Bounds]) -> None:
    if not isinstance(t, FakeTensor):
        return
    try:
        storage = t.untyped_storage()
        if bounds is None or not _fits(bounds, t.dtype):
            _RANGES.pop(storage._cdata, None)
        else:  # the weak reference keeps the storage's address its own while the entry lives
            _RANGES[storage._cdata] = (StorageWeakRef(storage), bounds)
    except Exception:  # noqa: BLE001 - no storage to hold it: nothing known
        pass


def forget() -> None:
    """Drop every range (a simulation has ended: its tensors are not to be used again)."""
    _RANGES.clear()


def _union(values: Sequence[Any]) -> Optional[Bounds]:
    """The range of values drawn from all of ``values`` (tensors with a range, or Python integers)."""
    found: List[Bounds] = []
    for value in values:
        if isinstance(value, bool) or isinstance(value, int):
            found.append((int(value), int(value) + 1))
        elif isinstance(value, float) and value.is_integer():
            found.append((int(value), int(value) + 1))
        else:
            bounds = get(value)
            if bounds is None:
                return None
            found.append(bounds)
    if not found:
        return None
    return min(b[0] for b in found), max(b[1] for b in found)


def distinct(t: torch.Tensor) -> Optional[int]:
    """How many distinct values ``t`` can hold, if fewer than it may have elements."""
    if t.dtype is torch.bool:
        return 2
    bounds = get(t)
    return None if bounds is None else max(bounds[1] - bounds[0], 0)


def _arg(args: Sequence[Any], kwargs: Dict[str, Any], i: int, name: str, default: Any = None) -> Any:
    return args[i] if len(args) > i else kwargs.get(name, default)


def _made(func: Any, args: Sequence[Any], kwargs: Dict[str, Any]) -> Optional[Bounds]:
    """The range of a factory's output (None: not a factory it knows)."""
    packet, name = func.overloadpacket, func._overloadname
    if packet is aten.randint:
        low, high = (args[0], args[1]) if name.startswith("low") else (0, args[0])
        return int(low), int(high)
    if packet is getattr(aten, "randint_like", None) and len(args) > 1:
        low, high = (args[1], args[2]) if len(args) > 2 else (0, args[1])
        return (int(low), int(high)) if isinstance(low, int) and isinstance(high, int) else None
    if packet is aten.arange:
        numbers = [a for a in args if isinstance(a, (int, float))]
        start, end, step = (0, numbers[0], 1) if len(numbers) == 1 else (
            (numbers[0], numbers[1], 1) if len(numbers) == 2 else tuple(numbers[:3]))
        if not all(isinstance(v, int) for v in (start, end, step)) or step == 0:
            return None
        values = range(int(start), int(end), int(step))  # ints (checked above): int() is for the type checker
        return (min(values), max(values) + 1) if len(values) else None
    if packet in (aten.full, aten.full_like):
        return _union([args[1]])
    if packet in (aten.zeros, aten.zeros_like, aten.new_zeros):
        return 0, 1
    if packet in (aten.ones, aten.ones_like, aten.new_ones):
        return 1, 2
    if packet is aten.new_full:
        return _union([args[2]])
    if packet is aten.scalar_tensor:
        return _union([args[0]])
    return None


def _out(out: Any, index: Optional[int]) -> Any:
    if index is None:
        return out
    return out[index] if isinstance(out, (tuple, list)) and len(out) > index else None


def _dim_size(x: torch.Tensor, args: Sequence[Any], kwargs: Dict[str, Any], packet: Any) -> Optional[int]:
    dim = _arg(args, kwargs, 1, "dim")
    if packet is aten.topk or packet is aten.kthvalue:
        dim = _arg(args, kwargs, 2, "dim", -1)
    if packet is aten.sort or packet is aten.argsort:
        dim = _arg(args, kwargs, 1, "dim", -1)
        dim = dim if isinstance(dim, int) else -1
    if dim is None or not isinstance(dim, int):
        return x.numel() if packet in (aten.argmax, aten.argmin) else None
    return x.shape[dim] if x.dim() else 1


def _written(func: Any, args: Sequence[Any], kwargs: Dict[str, Any]) -> Optional[Bounds]:
    """The range of what an in-place op writes (None: unknown)."""
    packet = func.overloadpacket
    if packet is aten.copy_:
        return get(args[1])
    if packet is aten.fill_:
        return _union([args[1]])
    if packet is aten.zero_:
        return 0, 1
    if packet is aten.random_:
        numbers = [a for a in args[1:] if isinstance(a, int)]
        if len(numbers) == 2:
            return numbers[0], numbers[1]
        if len(numbers) == 1:
            return 0, numbers[0]
        return None
    if packet is aten.masked_fill_:
        return _union([args[2]])
    if packet in (aten.index_put_, getattr(aten, "_index_put_impl_", None)):
        return _union([args[2]])
    if packet in (aten.scatter_,):
        return _union([args[3]]) if len(args) > 3 else _union([kwargs.get("src", kwargs.get("value"))])
    return None


def note(func: Any, args: Sequence[Any], kwargs: Dict[str, Any], out: Any) -> None:
    """Carry the ranges of a simulated op's inputs to its outputs (and forget what it overwrote)."""
    try:
        _note(func, args, kwargs, out)
    except Exception as exc:  # noqa: BLE001 - a range is an extra: never stop the run for it
        log.debug("tmpatch.audit: no value range for %s (%s)", func, exc)


#: in-place ops whose write replaces every element it touches with known values
_OVERWRITES = _ops("copy_", "fill_", "zero_", "random_")


#: op -> (position, name) of each argument it writes into (ops seen so far)
_WRITES: Dict[Any, Tuple[Tuple[int, str], ...]] = {}


def _writes(func: Any) -> Tuple[Tuple[int, str], ...]:
    found = _WRITES.get(func)
    if found is None:
        found = _WRITES[func] = tuple((i, a.name) for i, a in enumerate(func._schema.arguments)
                                      if a.alias_info is not None and a.alias_info.is_write)
    return found


def _note(func: Any, args: Sequence[Any], kwargs: Dict[str, Any], out: Any) -> None:
    packet = func.overloadpacket
    written = False
    for i, name in _writes(func):
        target = args[i] if i < len(args) else kwargs.get(name)
        for t in target if isinstance(target, (list, tuple)) else (target,):
            if isinstance(t, FakeTensor):
                _set(t, _after_write(get(t), _written(func, args, kwargs), packet, t))
                written = True
    if written or not isinstance(out, (torch.Tensor, tuple, list)):
        return
    made = _made(func, args, kwargs)
    if made is not None:
        _set(out, made)
        return
    if packet in _INDICES and args and isinstance(args[0], torch.Tensor):
        size = _dim_size(args[0], args, kwargs, packet)
        if size is not None:
            _set(_out(out, _INDICES[packet]), (0, max(size, 1)))
    if packet in (aten._to_copy, aten.lift_fresh, aten.lift_fresh_copy) and args and \
            isinstance(args[0], torch.Tensor) and not isinstance(args[0], FakeTensor):
        _set(out, _real(args[0]))
    elif packet in (aten.max, aten.min) and len(args) > 1 and isinstance(args[1], torch.Tensor):
        _set(out, _union([args[0], args[1]]))  # elementwise max/min of two tensors
    elif packet in _SELECTIONS and args:
        _set(_out(out, 0) if isinstance(out, (tuple, list)) else out, get(args[0]))
    elif packet in _JOINS and args:
        _set(out, _union(list(args[0])))
    elif packet is aten.where and len(args) == 3:
        _set(out, _union([args[1], args[2]]))
    elif packet is aten.masked_fill and len(args) == 3:
        _set(out, _union([args[0], args[2]]))


def _after_write(before: Optional[Bounds], new: Optional[Bounds], packet: Any, t: torch.Tensor) -> Optional[Bounds]:
    """The range of a storage after a write of values in ``new`` through ``t``."""
    if new is None:
        return None
    if before is not None:
        return min(before[0], new[0]), max(before[1], new[1])
    whole = t.is_contiguous() and t.numel() * t.element_size() == t.untyped_storage().nbytes()
    return new if whole and packet in _OVERWRITES else None
