"""Evidence on its way to the host: a book's pending evidence reduced entry by entry (which
update each count came from is kept), and sent to the host without a sync.

On a CUDA device a book's evidence waits until :data:`LANDING` entries have been noted since
it last left (a counting update notes one or two), then leaves in one flight (:class:`Flight`):
each group of entries stacked, as it is where it holds at most :data:`RAW_BYTES` (counted on
the host: :class:`Rows`; two kernels, the stack and the copy), else reduced on the device to
one count per entry; copied into pinned host memory with ``non_blocking=True``, and a CUDA
event recorded behind the copies. Nothing waits for the device: a later update asks the event
(``query()``, which never waits) and reads the host copies once they have landed
(``updates.py``). A settle point that comes first reads the flight's counts on the device, in
its one read. Evidence in host memory needs no flight: it is read at once
(:func:`read_at_once`). Evidence on other devices waits for a settle point.
"""
from __future__ import annotations

import sys
from typing import Any, Dict, List, Optional, Tuple

from tmpatch.runtime import host
from tmpatch.runtime.deferred.books import AUDIT_TAG, Book, Kind
from tmpatch.runtime.deferred.giving import Tally

#: a book sends its evidence to the host once this many entries were noted since it last did (an
#: update notes one per check it defers): the most updates a report waits for before its copy starts
LANDING = 16


class Watch:
    """The books with something due that the update hook (``updates.py``) has to look at, and the
    books of collected metrics whose report waits for a moment a read can be made
    (``endings.py``); ``on``: there are some (read by every update: an attribute, not a length)."""

    __slots__ = ("on", "books", "orphans")

    def __init__(self) -> None:
        self.on = False
        self.books: "set[Book]" = set()
        self.orphans: List[Book] = []

    def watch(self, book: Book) -> None:
        self.books.add(book)
        self.on = True

    def drop(self, book: Book) -> None:
        self.books.discard(book)
        self.on = bool(self.books or self.orphans)

    def orphan(self, book: Book) -> None:
        if book not in self.orphans:
            self.orphans.append(book)
        self.on = True

    def drop_books(self) -> None:
        """Look at no book after updates (the orphans stay)."""
        self.books.clear()
        self.on = bool(self.orphans)

    def clear(self) -> None:
        self.books.clear()
        del self.orphans[:]
        self.on = False


WATCH = Watch()


# -- evidence, entry by entry -----------------------------------------------------------------------
#: one part of a book's evidence: ``(key, sign, steps, values)``; ``values`` a 1-D tensor (or a list
#: of host ints) with one value per step (the update it came from; None: not known)
Part = Tuple[str, int, List[Optional[int]], Any]


def _stacked(tensors: List[Any]) -> Any:
    """``tensors`` (one dtype, device and shape) as the rows of one 2-D tensor."""
    import torch

    return tensors[0].reshape(1, -1) if len(tensors) == 1 else torch.stack(tensors).reshape(len(tensors), -1)


def reduce_rows(kind: Kind, rows: Any) -> Any:
    """The count of ``kind`` in each row of ``rows``: a 1-D tensor, in one reduction (two or three
    for ``false`` and ``outside``), where ``rows`` lives (the device, or the host copy)."""
    import torch

    name = kind[0]
    if name == "any":
        return rows.any(1)
    if name == "sum":
        return rows.sum(1)
    if name == "false":
        return rows.shape[1] - rows.sum(1)
    low, high = kind[1], kind[2]
    if rows.dtype in (torch.int32, torch.int64) and low < high:
        return (rows.clamp(low, high - 1) != rows).sum(1)
    return ((rows < low) | (rows >= high)).sum(1)


def clean(kind: Kind, rows: Any) -> bool:
    """Whether no row of ``rows`` counts anything for ``kind``: one op on the host copy (the usual
    answer: the per-row counts are then not made)."""
    import torch

    name = kind[0]
    if rows.numel() == 0:
        return True
    if name in ("any", "sum"):
        return not bool(rows.any())
    if name == "false":
        return bool(rows.all())
    low, high = kind[1], kind[2]
    if rows.is_floating_point() or rows.dtype is torch.bool:
        return not bool(((rows < low) | (rows >= high)).any())
    least, most = torch.aminmax(rows)
    return int(least) >= low and int(most) < high


class Rows:
    """Evidence sent to the host as it is, one row per entry, and counted there (``kind``): a
    small group of entries costs a stack and a copy, no reduction on the device."""

    __slots__ = ("kind", "rows")

    def __init__(self, kind: Kind, rows: Any) -> None:
        self.kind = kind
        self.rows = rows

    def reduced(self) -> Any:
        """The counts, one per entry, where the rows are."""
        return reduce_rows(self.kind, self.rows)


#: a group of entries of at most this many bytes goes to the host as it is (:class:`Rows`), larger
#: ones reduced on the device first (their copy, and the host's count of it, would cost more)
RAW_BYTES = 64 << 10


def take(book: Book, raw_bytes: int = 0) -> List[Part]:
    """Empty the book's counts and pending evidence into parts (the caller holds :data:`LOCK`;
    compiled updates' counts are folded into the counts first by the caller, where it wants them):
    each group of entries reduced one by one on its device, or, where it holds at most
    ``raw_bytes``, stacked as it is (:class:`Rows`)."""
    parts: List[Part] = [(key, 1, [None], value.reshape(1)) for key, value in book.counts.items()]
    pending, steps = book.pending, book.steps
    book.counts, book.pending, book.steps, book.pinned, book.noted = {}, [], [], 0, 0
    book.marked = book.traced_marked
    if len(steps) < len(pending):
        steps = steps + [None] * (len(pending) - len(steps))
    if pending:
        single = _single(pending, raw_bytes)  # the usual flight: one check, one kind of tensor
        if single is not None:
            key, sign, kind, rows = single
            parts.append((key, sign, steps, Rows(kind, rows) if raw_bytes else reduce_rows(kind, rows)))
            return parts
    groups: Dict[Tuple[Any, ...], Tuple[List[Any], List[Optional[int]]]] = {}
    for (key, evidence, kind, sign), step in zip(pending, steps):
        if type(evidence) is int:  # a count already on the host
            parts.append((key, sign, [step], [evidence]))
            continue
        # one device per book (a metric moved between updates: the stack below says so)
        group = groups.get((key, kind, sign, evidence.dtype, evidence.shape))
        if group is None:
            group = groups[(key, kind, sign, evidence.dtype, evidence.shape)] = ([], [])
        group[0].append(evidence)
        group[1].append(step)
    for (key, kind, sign, _, _), (tensors, stamps) in groups.items():
        try:
            rows = _stacked(tensors)
        except RuntimeError:  # on several devices: each entry alone, where it is
            for tensor, step in zip(tensors, stamps):
                parts.append((key, sign, [step], reduce_rows(kind, tensor.reshape(1, -1))))
            continue
        small = rows.numel() * rows.element_size() <= raw_bytes
        parts.append((key, sign, stamps, Rows(kind, rows) if small else reduce_rows(kind, rows)))
    return parts


def _single(pending: List[Tuple[str, Any, Kind, int]], raw_bytes: int) -> Optional[Tuple[str, int, Kind, Any]]:
    """``(key, sign, kind, rows)`` where every entry is a tensor of one check, dtype and shape (a
    stack of them holds at most ``raw_bytes``, unless that is 0): no grouping; None otherwise."""
    key, first, kind, sign = pending[0]
    if type(first) is int:
        return None
    dtype = first.dtype
    for entry in pending:
        if entry[0] != key or entry[2] is not kind or entry[3] != sign or type(entry[1]) is int \
                or entry[1].dtype is not dtype:
            return None
    if raw_bytes and len(pending) * first.numel() * first.element_size() > raw_bytes:
        return None
    try:
        return key, sign, kind, _stacked([entry[1] for entry in pending])
    except RuntimeError:  # shapes or devices that differ: grouped
        return None


def reduced(parts: List[Part]) -> List[Any]:
    """The parts' values, counted where they are (1-D tensors, or host lists)."""
    return [values.reduced() if isinstance(values, Rows) else values for _, _, _, values in parts]


def read(values: List[Any]) -> List[List[int]]:
    """The values of 1-D tensors (and host lists), in one device read where they share a device
    (each tensor carries :data:`AUDIT_TAG`: the sync audit reads a record as "nothing to report")."""
    out: List[Optional[List[int]]] = [list(v) if isinstance(v, list) else None for v in values]
    tensors = [v for v in values if not isinstance(v, list)]
    if not tensors:
        return out  # type: ignore[return-value]  # no tensors: every item is a list
    import torch

    if len({t.device for t in tensors}) == 1:
        flat = tensors[0] if len(tensors) == 1 else torch.cat([t.reshape(-1).long() for t in tensors])
        setattr(flat, AUDIT_TAG, True)
        numbers = flat.tolist()  # the one read
        chunks, start = [], 0
        for t in tensors:
            chunks.append(numbers[start:start + t.numel()])
            start += t.numel()
    else:
        chunks = []
        for t in tensors:
            setattr(t, AUDIT_TAG, True)
            chunks.append(t.tolist())
    found = iter(chunks)
    return [v if v is not None else next(found) for v in out]


def decode(layout: List[Tuple[str, int, List[Optional[int]]]], values: List[List[int]]) -> Tally:
    """What the parts say, per record key: the count (signs applied), and the first update whose
    count is not zero where every counted value's update is known."""
    per_step: Dict[str, Dict[Optional[int], int]] = {}
    for (key, sign, steps), numbers in zip(layout, values):
        into = per_step.setdefault(key, {})
        for step, number in zip(steps, numbers):
            into[step] = into.get(step, 0) + sign * int(number)
    out: Tally = {}
    for key, counts in per_step.items():
        total = sum(counts.values())
        if total:
            known = [step for step, n in counts.items() if n and step is not None]
            out[key] = (total, min(known) if known else None, bool(counts.get(None)))
    return out


# -- flights: evidence on its way to the host -----------------------------------------------------
class _Landed:
    """The event of a copy the host made itself: done."""

    @staticmethod
    def query() -> bool:
        return True


class _Never:
    """The event of a copy on simulated CUDA (the sync audit): never done; a settle point reads
    the evidence on the device instead."""

    @staticmethod
    def query() -> bool:
        return False


LANDED, NEVER = _Landed(), _Never()


def simulated(tensor: Any) -> bool:
    """Whether ``tensor`` is simulated (one of torch's fake tensors, as the sync audit makes): it
    has no values, and a copy of it to the host holds none."""
    fake = sys.modules.get("torch._subclasses.fake_tensor")
    kind = getattr(fake, "FakeTensor", None)
    return kind is not None and isinstance(tensor, kind)


def new_event(device: Any) -> Any:
    """An event, recorded now on ``device``'s current stream, whose ``query()`` says (without
    waiting) whether the work queued before it, the copy to the host, is done. The test suite
    replaces it to say when a copy lands."""
    import torch

    if device.type != "cuda":
        return LANDED  # the host made the copy itself
    if not torch.cuda.is_available():
        return NEVER  # simulated CUDA
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return event


Segment = List[Tuple[str, int, List[Optional[int]]]]


class Flight:
    """A book's evidence on its way to the host: what each copy holds (``segments``: the parts laid
    end to end in a vector, or one part's :class:`Rows`, counted on the host), the device tensors
    (``dev``: read by a settle point that comes before the copies land), the host copies, the event
    behind them, and the parts whose values were on the host already (``known``)."""

    __slots__ = ("segments", "dev", "host", "event", "known")

    def __init__(self, segments: List[Tuple[Segment, Optional[Kind]]], dev: List[Any], host_copies: List[Any],
                 event: Any, known: List[Tuple[Tuple[str, int, List[Optional[int]]], List[int]]]) -> None:
        self.segments = segments
        self.dev = dev
        self.host = host_copies
        self.event = event
        self.known = known

    def landed(self) -> Optional[Tally]:
        """What the flight says, once its copies have landed (else None); reads host memory only."""
        if not self.event.query():
            return None
        try:
            if not self.known and all(clean(kind, copy) if kind is not None else not bool(copy.any())
                                      for (_, kind), copy in zip(self.segments, self.host)):
                return {}  # the usual flight: nothing to report
            numbers = [(reduce_rows(kind, copy) if kind is not None else copy).tolist()
                       for (_, kind), copy in zip(self.segments, self.host)]
        except Exception:  # noqa: BLE001 - a host copy without values (simulated CUDA): never lands
            self.event = NEVER
            return None
        return self.tally(numbers)

    def device_values(self) -> List[Any]:
        """The counts on the device, one 1-D tensor per copy (for a settle point's read)."""
        return [reduce_rows(kind, dev) if kind is not None else dev for (_, kind), dev in zip(self.segments, self.dev)]

    def tally(self, numbers: List[List[Any]]) -> Tally:
        """What the flight says, given the counts of each copy (read from the host copies, or by a
        settle point from :meth:`device_values`)."""
        layout, values = [part for part, _ in self.known], [list(n) for _, n in self.known]
        for (segment, _), counts in zip(self.segments, numbers):
            start = 0
            for key, sign, steps in segment:
                layout.append((key, sign, steps))
                values.append(counts[start:start + len(steps)])
                start += len(steps)
        return decode(layout, values)


def holds(book: Book) -> bool:
    """Whether the book holds anything to report (no read)."""
    return bool(book.marked or book.counts or book.synced or book.flight is not None)


def gather_traced(book: Book) -> None:
    """Fold what compiled updates added to the book's traced counts into its counts."""
    if book.traced_marked:
        book.traced_marked = False
        for key, value in list(book.traced.items()):
            old = book.counts.get(key)
            book.counts[key] = value.clone() if old is None else old + value
            value.zero_()


#: devices whose evidence can fly to the host without a sync (others wait for a settle point)
FLYING = frozenset({"cuda", "cpu"})


def device_of(book: Book) -> Any:
    """The device of the book's evidence (None: all of it is on the host already, as ints)."""
    for _, evidence, _, _ in book.pending:
        if type(evidence) is not int:
            return evidence.device
    for value in book.counts.values():
        return value.device
    return None


def read_at_once(tensor: Any) -> bool:
    """Whether evidence in ``tensor`` is read at once (host memory: no sync). The test suite
    replaces it, with :func:`new_event`, to play a device's timing on the CPU."""
    return host.on_host(tensor)


def on_host(book: Book) -> bool:
    """Whether the book's evidence is in host memory (read at once)."""
    for _, evidence, _, _ in book.pending:
        if type(evidence) is not int:
            return read_at_once(evidence)
    for value in book.counts.values():
        return read_at_once(value)
    return True


def _to_host(dev: Any) -> Any:
    """A copy of ``dev`` in host memory that nothing waits for (pinned, ``non_blocking``)."""
    import torch

    if dev.device.type == "cuda":
        copy = torch.empty(dev.shape, dtype=dev.dtype, pin_memory=True)
        copy.copy_(dev, non_blocking=True)
        return copy
    return dev.clone()  # the device path of the test suite on the CPU (tmpatch.runtime.host)


def launch(book: Book) -> None:
    """Send the book's counts and pending evidence to the host without waiting: a small group of
    entries as it is (a stack and a copy), the rest reduced and laid end to end in one vector (the
    caller holds :data:`LOCK`)."""
    import torch

    parts = take(book, RAW_BYTES)
    known = [((key, sign, steps), values) for key, sign, steps, values in parts if isinstance(values, list)]
    segments: List[Tuple[Segment, Optional[Kind]]] = []
    dev: List[Any] = []
    vector = [(key, sign, steps, values) for key, sign, steps, values in parts
              if not isinstance(values, (list, Rows))]
    if vector:
        tensors = [values for _, _, _, values in vector]
        segments.append(([(key, sign, steps) for key, sign, steps, _ in vector], None))
        dev.append(tensors[0] if len(tensors) == 1 else torch.cat([t.long() for t in tensors]))
    for key, sign, steps, values in parts:
        if isinstance(values, Rows):
            segments.append(([(key, sign, steps)], values.kind))
            dev.append(values.rows)
    if not dev:
        book.flight = Flight([], [], [], LANDED, known)
        return
    copies = [_to_host(tensor) for tensor in dev]
    event = NEVER if simulated(dev[0]) else new_event(dev[0].device)  # a simulated copy holds nothing to read
    book.flight = Flight(segments, dev, copies, event, known)


def recall(book: Book) -> None:
    """Fold a flight that has not been reported back into the book's counts, on the device (a
    coalesced sync sums them over the ranks)."""
    flight, book.flight = book.flight, None
    if flight is None:
        return
    import torch

    counts = book.counts
    device = flight.dev[0].device if flight.dev else getattr(book.ref(), "device", None)
    amounts: Dict[str, Any] = {}
    tally = flight.landed()
    if tally is None:  # still on its way: the same sums, on the device
        for (segment, _), values in zip(flight.segments, flight.device_values()):
            start = 0
            for key, sign, steps in segment:
                piece = values[start:start + len(steps)].long().sum()
                start += len(steps)
                amounts[key] = amounts.get(key, 0) + (piece if sign > 0 else -piece)
        for (key, sign, _), numbers in flight.known:
            amounts[key] = amounts.get(key, 0) + sign * sum(numbers)
    else:
        amounts = {key: total for key, (total, _, _) in tally.items()}
    for key, amount in amounts.items():
        if not isinstance(amount, torch.Tensor):
            amount = torch.full((), int(amount), dtype=torch.long, device=device)
        old = counts.get(key)
        counts[key] = amount if old is None else old + amount.to(old.device)


__all__ = ["FLYING", "Flight", "LANDED", "LANDING", "NEVER", "Part", "RAW_BYTES", "Rows", "Segment", "WATCH", "Watch",
           "clean", "decode", "device_of", "gather_traced", "holds", "launch", "new_event", "on_host", "read",
           "read_at_once", "recall", "reduce_rows", "reduced", "simulated", "take"]
