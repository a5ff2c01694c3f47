"""compiled_update: metric updates inside ``torch.compile`` in one graph, with no crash, no
recompile and no graph break.

Defects (every release, not fixed upstream; torchmetrics issue #1780):

* ``Metric._wrap_update``: ``self._update_count += 1`` on every ``update()``. torch.compile
  treats an integer attribute of an ``nn.Module`` as a constant: a traced update guards on
  its value and recompiles at every step, until the recompile limit sends the whole step
  back to eager. While the update itself broke the graph this stayed hidden; once it
  traces cleanly it is the first thing a compiled step meets. Repair (policy
  ``update_count``, default ``device``): a compiled update reads nothing of the count. It
  adds 1, in its graph, to its metric's *tally*, a 0-d integer tensor on the metric's
  device that tmpatch keeps outside the metric (reached through the metric's own
  ``update`` function, which torchmetrics never pickles or copies; it moves with the
  metric's ``_apply``), and says so (``pending.counts = True``, a store of a constant that
  torch.compile replays after the graph). Nothing is guarded, nothing recompiles, and the
  in-place add is captured in a CUDA graph. While the patch is applied
  ``Metric._update_count`` is a data descriptor of tmpatch's: the first read or write of
  any metric's count by host code after compiled updates folds every tally into its
  metric's count (:func:`fold`: one device read per device, a sync on CUDA), so
  ``update_count``, ``update_called``, ``compute()``'s check, ``forward()``, ``reset()``
  and pickles (``Metric.__getstate__``) see the release's count. Eager updates and reads
  run the release's statements (one more Python call each: the descriptor).
  ``torch.jit.script`` leaves the descriptor out (its getter is marked unused): a scripted
  metric holds the count as an integer attribute, as on the release.
* The same updates inside a CUDA graph (``mode="reduce-overhead"``): most updates replace
  their states (``self.tp = self.tp + tp``); a graph's output kept as a state is
  overwritten by its next replay. In compiled code a state an update replaces by a tensor
  of the same shape, dtype and device is written into the tensor it replaced, which stays
  the state (inductor makes the add and the copy one in-place kernel); dynamo takes a
  module's tensors for static inputs, whose in-place updates a CUDA graph captures.
  Eager updates replace their states as the release does.
* ``MetricCollection``: its update asks each metric which of its keyword arguments it
  takes (``Metric._filter_kwargs``, through the update's ``inspect.Signature``, which
  torch 2.5 cannot trace): in compiled code, with none given, the answer is the release's
  empty dict without the signature. ``_compute_groups_create_state_ref`` copies the count of a compute
  group's first metric to the others (``mi._update_count = m0._update_count``, on every
  update from 1.7.0): in compiled code the follower's tally records the leader instead,
  and the fold gives it the leader's count. A collection's first update merges its
  compute groups by comparing states (``deepcopy``, ``allclose``: graph breaks, and a
  different path at the second step): in compiled code a collection whose groups are not
  formed yet updates each metric on its own and forms them at its first eager update
  (same states and results; the release's compiled step formed them in a resumed frame).
* ``torchmetrics.utilities.compute.normalize_logits_if_needed`` (1.6.1+): on the CPU it
  decides with ``if not torch.all((tensor >= 0) * (tensor <= 1))`` (a graph break).
  Repair: when compiling, the same test selects on the device (``torch.where`` of the
  whole tensor, as the release's CUDA branch does, with the CPU branch's condition, so
  a tensor holding NaN is normalised as on the CPU). Eager code is the release's.
* ``_bincount`` reads ``_XLA_AVAILABLE``, a lazy ``RequirementCache``: traced for the
  first time inside torch.compile, its package lookup fails (torch 2.6+:
  ``InternalTorchDynamoError: PackageNotFoundError ... torch_xla``). Repair: the cache
  is filled when the patch is applied (what the release's first ``_bincount`` does), and
  its answer, a bool, stands in for it in ``torchmetrics.utilities.data`` until
  ``revert()`` (its ``__bool__`` also cost two Python calls per ``_bincount``).

Policies (``update_count``): ``device`` (above); ``outside``: the increment runs eagerly
from compiled code (``torch.compiler.disable``: a graph break per update). A metric built
before ``apply()`` keeps the release's update (its count is a guard).

Releases: 0.10.0-1.9.0 (``_wrap_update`` unchanged throughout; four implementations of
``MetricCollection.update`` and of ``_compute_groups_create_state_ref``);
``normalize_logits_if_needed`` 1.6.1+ (two implementations). Results are the release's,
bit for bit, in eager code; ``revert()`` folds what is pending and removes the descriptor.
"""
from __future__ import annotations

import logging
import weakref
from types import ModuleType
from typing import Any, Callable, Dict, List, Optional

from tmpatch.runtime import compiled, policies
from tmpatch.runtime.compiled import compiling, pending
from tmpatch.spec import LEAVE, Edit, Patch, Rewrite, Setting, Target, Together, Variant, since, span

log = logging.getLogger("tmpatch")

#: the attribute of a metric that holds its update count (the release's)
COUNT = "_update_count"

#: the attribute of a metric's wrapped ``update`` that holds its tally
TALLY = "_tmpatch_tally"


class Tally:
    """The update count compiled updates of one metric leave on its device: ``counter``, a 0-d
    int64 tensor they add 1 to in the graph (:func:`fold` adds it to the count and zeroes it);
    ``leader``, the tally of the metric whose count this one's takes at the fold (a compute
    group's first metric; a store torch.compile replays)."""

    __slots__ = ("ref", "counter", "leader", "__weakref__")

    def __init__(self, metric: Any, counter: Any) -> None:
        self.ref = weakref.ref(metric)
        self.counter = counter
        self.leader: Optional["Tally"] = None


class _Live:
    """``on`` while the patch is applied (the count descriptor in place): compiled updates of
    metrics built while it was may leave their count in their tally. ``store_in_graph``: dynamo
    traces a store into a module's ``__dict__`` (torch 2.6+; 2.5 does not: a graph break)."""

    __slots__ = ("on", "store_in_graph")

    def __init__(self) -> None:
        self.on = False
        self.store_in_graph = False


_live = _Live()


def live() -> bool:
    """Whether the patch is applied (compiled updates of metrics built since count on the device)."""
    return _live.on


#: every tally (held by its metric's ``update``), for :func:`fold`
_tallies: "weakref.WeakSet[Tally]" = weakref.WeakSet()


#: ``torch._dynamo.mark_static_address`` once torch._dynamo is imported
_static: List[Callable[[Any], None]] = []


def _bind_static(dynamo: Any) -> None:
    mark = getattr(dynamo, "mark_static_address", None)
    if mark is not None and not _static:
        _static.append(mark)
        for tally in list(_tallies):
            mark(tally.counter)


def _mark(counter: Any) -> None:
    """A counter is a static input of compiled graphs (its address is kept: a CUDA graph may
    add to it in place; a mutated input that is not static makes inductor skip the graph)."""
    if _static:
        _static[0](counter)


def tally_of(metric: Any) -> Optional[Tally]:
    """The metric's tally, through its own ``update`` (no table: a lookup in one is a guard on
    the whole table for torch.compile); None for a metric built before ``apply()``."""
    namespace = getattr(metric, "__dict__", None)
    update = namespace.get("update") if namespace is not None else None
    return getattr(update, TALLY, None)


def mirror(original: Any, twin: Any) -> Optional[tuple]:
    """``(original's tally, twin's)`` when both have one: a copy that takes over its original's
    own functions (the audit's) must count into its own tally (``None`` otherwise)."""
    mine, theirs = tally_of(original), tally_of(twin)
    return None if mine is None or theirs is None or mine is theirs else (mine, theirs)


def fold() -> None:
    """Add every tally's counter to its metric's count (a follower takes its leader's) and zero
    them: one device read per device (every tally: which ones compiled updates added to is not
    known on the host, and a store per update to say so would cost each compiled step). Host
    code only."""
    pending.counts = False
    tallies = [tally for tally in list(_tallies) if tally.ref() is not None]
    if not tallies:
        return
    import torch

    groups: Dict[Any, List[Tally]] = {}
    for tally in tallies:
        groups.setdefault(tally.counter.device, []).append(tally)
    added: Dict[int, int] = {}
    for device, group in groups.items():
        counters = [tally.counter for tally in group]
        try:
            values = torch.stack(counters).tolist()
        except Exception as exc:  # noqa: BLE001 - tensors without values (the audit's simulated CUDA, meta)
            log.debug("tmpatch: update counts on %s not read (%s: %s)", device, type(exc).__name__, exc)
            continue
        for tally, value in zip(group, values):
            added[id(tally)] = int(value)
        torch._foreach_zero_(counters)
    followers = []
    for tally in tallies:
        metric = tally.ref()
        if metric is None:
            continue
        if tally.leader is not None:
            followers.append((metric, tally))
        elif added.get(id(tally)):
            state = metric.__dict__
            state[COUNT] = state.get(COUNT, 0) + added[id(tally)]
    for metric, tally in followers:
        leader, tally.leader = tally.leader, None
        source = leader.ref() if leader is not None else None
        if source is not None:
            metric.__dict__[COUNT] = source.__dict__.get(COUNT, 0)


@compiled.inline_only
def _read(obj: Any) -> Any:
    if pending.counts:
        fold()
    try:
        return obj.__dict__[COUNT]
    except KeyError:
        raise AttributeError(COUNT) from None


@compiled.inline_only
def _write(obj: Any, value: Any) -> None:
    if pending.counts:
        fold()
    obj.__dict__[COUNT] = value


#: a read or write of the count in compiled code runs eagerly (a graph break: the fold reads the
#: device, and the value is then no constant to guard on)
_READ, _WRITE = compiled.Outside(_read), compiled.Outside(_write)


# neither is a frame of its own for dynamo (compiled.inline_only): the release reads and writes the
# count with no frame, in eager code that a compiled step's graph breaks leave (a metric's update past
# a data-dependent break): compiled there, a read would be a graph break and a write a graph per metric
@compiled.inline_only
def _get(obj: Any) -> Any:
    return _READ(obj) if compiling() else _read(obj)


@compiled.inline_only
def _set(obj: Any, value: Any) -> None:
    if not compiling():
        _write(obj, value)
    elif _live.store_in_graph:  # the value written replaces what compiled updates left pending: zeroed
        tally = tally_of(obj)
        if tally is not None:
            tally.counter.zero_()
            tally.leader = None
        obj.__dict__[COUNT] = value
    else:
        _WRITE(obj, value)


def _delete(obj: Any) -> None:
    try:
        del obj.__dict__[COUNT]
    except KeyError:
        raise AttributeError(COUNT) from None


class CountSlot(property):
    """``Metric._update_count`` while the patch is applied: the instance's own value (in its
    ``__dict__``, where the release keeps it), once what compiled updates left pending is
    folded in (:func:`fold`; a write folds first too, so a pending count is not added to the
    value written). In compiled code (``forward()`` reads and writes the count) a read runs
    eagerly: a graph break, where the release's read was a guard (a recompile per step); a
    write is a store in the graph that also zeroes the tally (torch 2.6+; eager on 2.5).
    Stores as a plain store does while nothing is pending (``compiled.PLAIN_SLOT``). A
    property: torch 2.5's dynamo takes another kind of data descriptor for its value."""

    _tmpatch_plain_slot = True


_SLOT = CountSlot(_get, _set, _delete, "the update count (compiled updates' folded in)")


def _increment(metric: Any) -> None:
    metric._update_count += 1


#: the increment, run eagerly from compiled code (a graph break: nothing to guard on)
_OUTSIDE = compiled.Outside(_increment)


def _count(metric: Any) -> None:
    """The release's ``self._update_count += 1``, in compiled code (policy ``update_count``)."""
    policy = policies.current.get("update_count", "device")
    tally = tally_of(metric) if policy == "device" and _live.on else None
    if tally is not None:
        tally.counter.add_(1)
        pending.counts = True
    else:
        _OUTSIDE(metric)


def _follow(follower: Any, leader: Any) -> None:
    """``follower._update_count = leader._update_count``, in compiled code."""
    mine, theirs = tally_of(follower), tally_of(leader)
    if (policies.current.get("update_count", "device") == "device" and mine is not None and theirs is not None
            and _live.on):
        mine.leader = theirs
        pending.counts = True
    else:
        follower._update_count = leader._update_count


def _hold(metric: Any) -> Optional[List[Any]]:
    """The metric's states before a compiled update, ``(name, value)``; None when the patch is
    reverted, or for a metric holding other metrics (a wrapper: its states may be theirs, e.g.
    Running's window slots start as its base metric's default tensor, one object for all). ``_modules``
    is read from ``__dict__``, where torch's ``Module.__setattr__`` reads it: one way to reach it, so
    torch.compile does not add a guard that the two ways find the same dict (a Python check per call)."""
    if not _live.on or metric.__dict__.get("_modules"):
        return None
    return [(name, getattr(metric, name)) for name in metric._defaults]


def _keep(metric: Any, held: Optional[List[Any]]) -> None:
    """After a compiled update: a state it replaced by a new tensor of the same shape, dtype and
    device (``self.tp = self.tp + tp``) is written into the tensor it replaced, which stays the
    state (the graph's own output is not kept: a CUDA graph's next replay would overwrite it).
    A state now pointing at another existing tensor (a compute group's reference), or one
    tensor held as two states, is left. (No ``torch.Tensor`` here: each new way to reach an
    object is one more guard per call.)"""
    if held is None:
        return
    olds = [old for _, old in held]
    for name, old in held:
        new = getattr(metric, name)
        if isinstance(old, list) or isinstance(new, list) or new is old or any(new is other for other in olds):
            continue
        if sum(1 for other in olds if other is old) > 1:  # one tensor for two states: not the metric's own
            continue
        if new.shape == old.shape and new.dtype == old.dtype and new.device == old.device:
            old.copy_(new)
            setattr(metric, name, old)


def _update_names(module: ModuleType) -> Dict[str, Any]:
    import torch

    zeros, long = torch.zeros, torch.long

    def attach(metric: Any, update: Any) -> None:
        """Give the metric (built now, or unpickled) its tally, held by its wrapped ``update``."""
        tally = Tally(metric, zeros((), dtype=long))
        _mark(tally.counter)
        setattr(update, TALLY, tally)
        _tallies.add(tally)

    return {"_tmpatch_compiling": compiling, "_tmpatch_count": _count, "_tmpatch_attach": attach,
            "_tmpatch_hold": _hold, "_tmpatch_keep": _keep}


UPDATE_COUNT = Rewrite(
    (Edit("self._update_count += 1\n",
          "if _tmpatch_compiling():\n    _tmpatch_count(self)\nelse:\n    self._update_count += 1\n"),
     Edit("update(*args, **kwargs)\n",
          "if _tmpatch_compiling():\n"
          "    _tmpatch_held = _tmpatch_hold(self)\n"
          "    update(*args, **kwargs)\n"
          "    _tmpatch_keep(self, _tmpatch_held)\n"
          "else:\n"
          "    update(*args, **kwargs)\n"),
     Edit("return wrapped_func\n", "_tmpatch_attach(self, wrapped_func)\nreturn wrapped_func\n")),
    _update_names,
)


def _collection_names(module: ModuleType) -> Dict[str, Any]:
    return {"_tmpatch_compiling": compiling, "_tmpatch_follow": _follow}


#: ``_compute_groups_create_state_ref``: the followers' counts, in compiled code
FOLLOW = Rewrite(
    (Edit("mi._update_count = deepcopy(m0._update_count) if copy else m0._update_count\n",
          "if _tmpatch_compiling():\n"
          "    _tmpatch_follow(mi, m0)\n"
          "else:\n"
          "    mi._update_count = deepcopy(m0._update_count) if copy else m0._update_count\n"),),
    _collection_names,
)
#: 0.10-0.11 spell the same statement with ``setattr``
FOLLOW_0 = Rewrite(
    (Edit('setattr(mi, "_update_count", deepcopy(m0._update_count) if copy else m0._update_count)\n',
          "if _tmpatch_compiling():\n"
          "    _tmpatch_follow(mi, m0)\n"
          "else:\n"
          '    setattr(mi, "_update_count", deepcopy(m0._update_count) if copy else m0._update_count)\n'),),
    _collection_names,
)

#: ``Metric._filter_kwargs`` (a collection passes each metric its keyword arguments): with none, every
#: path of the release's returns an empty dict; in compiled code that is said without reading the update's
#: ``inspect.Signature`` (torch 2.5 cannot trace ``Signature.parameters``: a graph break per metric)
NO_KWARGS = Rewrite(
    (Edit("_params = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)\n",
          "if not kwargs and _tmpatch_compiling():\n"
          "    return {}\n"
          "_params = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)\n"),),
    lambda module: {"_tmpatch_compiling": compiling},
)

#: ``MetricCollection.update``: no merge of compute groups in compiled code
NO_MERGE = Rewrite(
    (Edit("if self._enable_compute_groups:\n    ...\n",
          "if self._enable_compute_groups and not _tmpatch_compiling():\n    __tmpatch_body__\n"),),
    lambda module: {"_tmpatch_compiling": compiling},
)


def _build_getstate(module: ModuleType) -> Callable[..., Any]:
    def __getstate__(original: Callable[..., Any], self: Any) -> Any:
        """The release's, with the count folded first (it reads ``__dict__``, not the descriptor)."""
        if pending.counts:
            fold()
        return original(self)

    return __getstate__


def _build_apply(module: ModuleType) -> Callable[..., Any]:
    import torch

    Tensor, long = torch.Tensor, torch.long

    def _apply(original: Callable[..., Any], self: Any, *args: Any, **kwargs: Any) -> Any:
        """The release's; then the tally's counter goes where the states went (through the same
        ``fn``, so that a simulated device stays one; an ``fn`` that casts: to the device)."""
        result = original(self, *args, **kwargs)
        tally = tally_of(self)
        if tally is not None:
            fn = args[0] if args else kwargs.get("fn")
            counter = tally.counter
            moved = fn(counter) if callable(fn) else counter
            if not (isinstance(moved, Tensor) and moved.dtype == long and moved.dim() == 0):
                moved = counter.to(getattr(self, "device", counter.device))
            if moved is not counter:
                _mark(moved)
            tally.counter = moved
        return result

    return _apply


_CPU_CHECK = (
    "if not torch.all((tensor >= 0) * (tensor <= 1)):\n"
    "    tensor = tensor.sigmoid() if normalization == \"sigmoid\" else torch.softmax(tensor, dim=1)\n"
)


def _normalize_names(module: ModuleType) -> Dict[str, Any]:
    import torch

    where, softmax = torch.where, torch.softmax

    def normalized(tensor: Any, normalization: Any) -> Any:
        """The CPU branch's choice, made on the device: all in [0, 1] (NaN is not) keeps the tensor."""
        inside = ((tensor >= 0) & (tensor <= 1)).all()
        return where(inside, tensor, tensor.sigmoid() if normalization == "sigmoid" else softmax(tensor, dim=1))

    return {"_tmpatch_compiling": compiled.compiling, "_tmpatch_normalized": normalized}


NORMALIZE = Rewrite(
    (Edit(_CPU_CHECK,
          "if _tmpatch_compiling() and tensor.is_floating_point():\n"
          "    tensor = _tmpatch_normalized(tensor, normalization)\n"
          "el" + _CPU_CHECK),),
    _normalize_names,
)


def _count_slot(module: ModuleType) -> Any:
    """``Metric._update_count`` while the patch is applied: the count's descriptor (the release
    keeps the count on each instance only; a class attribute of that name is left alone).

    TorchScript compiles every property of a module's class that it is not told to leave
    (``__jit_unused_properties__``, or a getter marked ``torch.jit.unused``): the descriptor's
    getter is marked, so ``torch.jit.script(metric)`` sees the count as the release's scripted
    metric does, an integer attribute of the instance (the getter is tmpatch's own function:
    nothing of the release is marked)."""
    if COUNT in vars(module.Metric):
        return LEAVE
    import torch

    torch.jit.unused(_get)
    return _SLOT


def _xla_answer(module: ModuleType) -> Any:
    """``_XLA_AVAILABLE``'s lazy cache filled (one package lookup, as the first ``_bincount``
    does): its answer, a bool, stands in ``torchmetrics.utilities.data`` in its place while the
    patch is applied. The cache's ``__bool__`` is two Python calls on every ``_bincount`` (every
    counting update), and a bool is what dynamo reads best."""
    flag = vars(module).get("_XLA_AVAILABLE")
    if flag is None or isinstance(flag, bool):
        return LEAVE
    try:
        return bool(flag)
    except Exception:  # noqa: BLE001 - the release's own lookup; it will run (and fail) as before
        return LEAVE


def _after_apply() -> None:
    """Count compiled updates on the device from now on (the descriptor is a setting)."""
    _live.on = True
    import torch

    _live.store_in_graph = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 6)
    compiled.when_dynamo(_bind_static)


def _after_revert() -> None:
    """Fold what compiled updates left pending: the descriptor, a setting, goes after this."""
    _live.on = False
    if pending.counts:
        fold()


PATCH = Patch(
    name="compiled_update",
    summary="inside torch.compile, Metric's update count recompiles every step, a collection's first update "
            "breaks the graph, the CPU logits check breaks it and _bincount's lazy XLA check crashes (torch 2.6+)",
    known=since("0.10.0"),
    upstream="torchmetrics #1780 (update count guards); not fixed upstream",
    changes="compiled updates count on the metric's device, folded into the count at its next host read (a sync "
            "on CUDA); a collection forms its compute groups at its first eager update",
    after_apply=_after_apply,
    after_revert=_after_revert,
    settings=(
        Setting("torchmetrics.metric", f"Metric.{COUNT}", _count_slot),
        Setting("torchmetrics.utilities.data", "_XLA_AVAILABLE", _xla_answer),
    ),
    together=(Together("one repair of a compiled update: the count's tally and descriptor, the collection's count "
                       "copy, the keyword filter and the logits test; without one of them a compiled step still "
                       "recompiles or breaks its graph"),),
    targets=(
        Target(
            module="torchmetrics.metric",
            qualname="Metric._wrap_update",
            variants=(Variant(span("0.10.0", "1.9.0"), "204d7412e16fe670", UPDATE_COUNT),),
        ),
        Target(
            module="torchmetrics.metric",
            qualname="Metric.__getstate__",
            variants=(
                Variant(span("0.10.0", "0.11.4"), "9996a30245e5558b", _build_getstate),
                Variant(span("1.0.0", "1.5.2"), "af232a93d4f8018a", _build_getstate),
                Variant(span("1.6.0", "1.9.0"), "ed346df0a94f210f", _build_getstate),
            ),
        ),
        Target(
            module="torchmetrics.metric",
            qualname="Metric._apply",
            variants=(
                Variant(span("0.10.0", "0.11.3"), "dac6762c6713e022", _build_apply),
                Variant(span("0.11.4"), "d8c08b77a3493a58", _build_apply),
                Variant(span("1.0.0", "1.2.1"), "230dda1bf62c7927", _build_apply),
                Variant(span("1.3.0.post0", "1.9.0"), "232b818f8abf487b", _build_apply),
            ),
        ),
        Target(
            module="torchmetrics.metric",
            qualname="Metric._filter_kwargs",
            variants=(
                Variant(span("0.10.0", "0.11.4"), "c7d8611b3ae04ecd", NO_KWARGS),
                Variant(span("1.0.0", "1.5.2"), "8eeebeee99f6e51d", NO_KWARGS),
                Variant(span("1.6.0", "1.9.0"), "587021cd14091524", NO_KWARGS),
            ),
        ),
        Target(
            module="torchmetrics.collections",
            qualname="MetricCollection.update",
            variants=(
                Variant(span("0.10.0", "0.11.4"), "623d912da2295f63", NO_MERGE),
                Variant(span("1.0.0", "1.4.0.post0"), "4bb11e4417bcb30d", NO_MERGE),
                Variant(span("1.4.1", "1.6.2"), "2e891af966219964", NO_MERGE),
                Variant(span("1.7.0", "1.9.0"), "d6262ad6780cffac", NO_MERGE),
            ),
        ),
        Target(
            module="torchmetrics.collections",
            qualname="MetricCollection._compute_groups_create_state_ref",
            variants=(
                Variant(span("0.10.0", "0.11.4"), "d25db2f4847fe50c", FOLLOW_0),
                Variant(span("1.0.0", "1.9.0"), "89013ba3893e690e", FOLLOW),  # but 1.2.1-1.4.0 and 1.6.2
                Variant(span("1.2.1", "1.4.0.post0"), "863390adb97bcf70", FOLLOW),
                Variant(span("1.6.2"), "576c9c809ed9590a", FOLLOW),
            ),
        ),
        Target(
            module="torchmetrics.utilities.compute",
            qualname="normalize_logits_if_needed",
            variants=(
                Variant(span("1.6.1", "1.8.0"), "c17f98a03d640c3a", NORMALIZE),
                Variant(span("1.8.1", "1.9.0"), "9d1392c3b6f01613", NORMALIZE),
            ),
            present=since("1.6.1"),
        ),
    ),
)
