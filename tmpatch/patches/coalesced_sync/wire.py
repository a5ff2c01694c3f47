"""The wire format of ``coalesced_sync``: the tensors of one sync in two all_gathers.

Knows ``torch.distributed``, nothing of torchmetrics. One exchange is

1. **header**: ``all_gather`` of :data:`HEADER_BYTES` bytes per rank: a magic
   number, the protocol version, the kind of sync (one metric, or a bucket of a
   MetricCollection), the rank and world size as the sender sees them, and the
   byte lengths of its metadata and of its segment (step 2), closed by a second
   magic number and a trailer byte. The size is odd, so it is never the size of
   what an unpatched rank's ``gather_all_tensors`` sends (int64 shapes, or one
   value of 1, 2, 4, 8 or 16 bytes); gloo matches collectives by their order
   and sends bytes: a same-size pairing would pass unseen, a shorter message
   leaves the trailer unset, a longer one is refused by gloo. An unpatched
   rank's first collective of a sync is a ``barrier``, which never pairs with an
   ``all_gather``: both sides wait until the process group's timeout.
2. **segment**: ``all_gather`` of one byte buffer per rank, as long as the
   longest segment: JSON metadata (each block's dtype and shape, each entry's
   owner, key and block, the owners' names, the deferred records' names), then
   every block's bytes (16-byte aligned), then the records' int64 values.

Every rank sees every header and every metadata, so every rank makes the same
decision: go on, or raise :class:`CoalescedSyncError` with the same message.
A later version of the protocol keeps the header's size, its magic numbers,
trailer and version word: ranks of different versions then all stop after step 1.
"""
from __future__ import annotations

import json
import logging
import struct
from dataclasses import dataclass, field
from typing import Any, Dict, List, Sequence, Tuple

log = logging.getLogger("tmpatch")

MAGIC = int.from_bytes(b"tmpatchC", "little")
END_MAGIC = int.from_bytes(b"coalesce", "little")
VERSION = 1
HEADER_WORDS = 16
HEADER_BYTES = HEADER_WORDS * 8 + 1  # odd: see the module docstring
TRAILER = 0xA5
ALIGN = 16

METRIC = 1  #: kind: the states of one metric
COLLECTION = 2  #: kind: the states of the members of a MetricCollection that sync together
_KINDS = {METRIC: "one metric's states", COLLECTION: "a MetricCollection's states"}

_ADVICE = (
    "every rank must run the same sync: apply tmpatch on every rank (TMPATCH=1 in the launcher's "
    "environment reaches every worker) or leave coalesced_sync out on every rank "
    "(tmpatch.apply(exclude='coalesced_sync') / TMPATCH_EXCLUDE=coalesced_sync)"
)


class CoalescedSyncError(RuntimeError):
    """The ranks of a sync disagree (protocol, kind, or the states they hold)."""


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass
class Block:
    """One tensor's bytes in a segment."""

    dtype: Any
    shape: Tuple[int, ...]

    @property
    def nbytes(self) -> int:
        import torch

        numel = 1
        for extent in self.shape:
            numel *= extent
        size = _ITEMSIZE.get(self.dtype)
        if size is None:
            size = _ITEMSIZE[self.dtype] = torch.empty((), dtype=self.dtype).element_size()
        return numel * size


_ITEMSIZE: Dict[Any, int] = {}


@dataclass
class Request:
    """What this rank sends: ``blocks`` (tensors), ``entries`` ``(owner, key, block)``,
    ``records`` ``(owner, name, 0-d int64 tensor)``, ``owners`` (names for messages)."""

    kind: int
    blocks: List[Any] = field(default_factory=list)
    entries: List[Tuple[int, str, int]] = field(default_factory=list)
    records: List[Tuple[int, str, Any]] = field(default_factory=list)
    owners: List[str] = field(default_factory=list)
    release: str = ""


@dataclass
class Result:
    """``values[i][r]``: entry ``i`` of the request as rank ``r`` sent it (a view of the
    received buffer); ``totals[owner]``: record name -> sum over the ranks (0-d int64)."""

    rank: int
    world: int
    values: List[List[Any]]
    totals: Dict[int, Dict[str, Any]]


def _dtype_name(dtype: Any) -> str:
    return str(dtype).rpartition(".")[2]


_WORDS = f"<{HEADER_WORDS}q"


def _header(request: Request, rank: int, world: int, meta_len: int, segment: int) -> bytes:
    words = [MAGIC, VERSION, request.kind, rank, world, meta_len, segment, len(request.entries)]
    words += [0] * (HEADER_WORDS - 1 - len(words)) + [END_MAGIC]
    return struct.pack(_WORDS, *words) + bytes([TRAILER])


def _read_header(raw: bytes, peer: int) -> List[int]:
    words = list(struct.unpack(_WORDS, raw[: HEADER_WORDS * 8]))
    if words[0] != MAGIC or words[-1] != END_MAGIC or raw[-1] != TRAILER:
        raise CoalescedSyncError(
            f"tmpatch coalesced_sync: rank {peer} of the process group did not send a coalesced-sync header "
            f"(it runs another sync: torchmetrics' own, without tmpatch's coalesced_sync); {_ADVICE}"
        )
    return words


def _listing(values: Sequence[Any]) -> str:
    return ", ".join(f"rank {peer}: {value}" for peer, value in enumerate(values))


def _check_headers(headers: List[List[int]], kind: int, world: int) -> None:
    """The same verdict on every rank (every rank sees every header)."""
    versions = [words[1] for words in headers]
    if len(set(versions)) > 1:
        raise CoalescedSyncError(
            "tmpatch coalesced_sync: the ranks speak different versions of the coalesced-sync protocol "
            f"({_listing(versions)}): run the same tmpatch on every rank"
        )
    kinds = [words[2] for words in headers]
    if len(set(kinds)) > 1:
        raise CoalescedSyncError(
            f"tmpatch coalesced_sync: the ranks sync different things ({_listing([_KINDS.get(k, k) for k in kinds])}):"
            " they run different code (tmpatch or torchmetrics releases differ, or a rank calls compute() on a "
            "metric the others do not)"
        )
    seen = [(words[3], words[4]) for words in headers]
    if any(seen[peer] != (peer, world) for peer in range(len(headers))):
        raise CoalescedSyncError(
            "tmpatch coalesced_sync: the ranks see different process groups (rank, size: "
            f"{_listing(seen)}): they sync over different groups"
        )


def _structure(meta: Dict[str, Any]) -> List[Tuple[int, str, str, int]]:
    blocks = meta["b"]
    return [(owner, key, blocks[block][0], len(blocks[block][1])) for owner, key, block in meta["e"]]


def _check_structure(metas: List[Dict[str, Any]]) -> None:
    """Every rank's states against rank 0's: the same verdict on every rank."""
    first, reference = metas[0], _structure(metas[0])
    for peer, meta in enumerate(metas):
        if meta["o"] != first["o"]:
            raise CoalescedSyncError(
                f"tmpatch coalesced_sync: rank {peer} syncs the metrics {meta['o']}, rank 0 {first['o']}"
            )
        theirs = _structure(meta)
        if theirs == reference:
            continue
        index = next(i for i in range(max(len(reference), len(theirs)))
                     if (reference[i] if i < len(reference) else None) != (theirs[i] if i < len(theirs) else None))

        def say(items: List[Tuple[int, str, str, int]], index: int = index) -> str:
            if index >= len(items):
                return "nothing"
            owner, key, dtype, ndim = items[index]
            return f"{first['o'][owner]}.{key} ({dtype}, {ndim} dims)"

        releases = ("" if meta["t"] == first["t"]
                    else f"; rank {peer} runs torchmetrics {meta['t']}, rank 0 {first['t']}")
        raise CoalescedSyncError(
            f"tmpatch coalesced_sync: the ranks hold different states to sync: item {index} is {say(theirs)} on "
            f"rank {peer} but {say(reference)} on rank 0{releases}. {_cause(first, meta, index)}"
        )


def _cause(first: Dict[str, Any], meta: Dict[str, Any], index: int) -> str:
    """Why item ``index`` of two ranks' states differs, as far as the metadata tells, and what to do."""
    def item(one: Dict[str, Any]) -> Any:
        return one["e"][index] if index < len(one["e"]) else None

    def state(entry: List[Any]) -> Tuple[int, str]:
        return entry[0], entry[1].split("[", 1)[0]  # a list state not reduced by cat: "attr[i]"

    pair = (item(first), item(meta))
    if any(entry is not None and one["b"][entry[2]][1] == [0] for one, entry in zip((first, meta), pair)):
        return ("A rank whose list state is empty sends an empty float tensor (torchmetrics 1.4.0+ with torch 2.1+), "
                "which torchmetrics cannot gather together with other ranks' data of another dtype or number of "
                "dimensions (gloo aborts the process there); feed every rank at least one batch, or give the state "
                "the default dtype and one dimension")
    held = [{state(entry) for entry in one["e"]} for one in (first, meta)]
    if any(entry is not None and state(entry) not in held[1 - side] for side, entry in enumerate(pair)):
        return ("A state is sent by one rank only: a rank whose list state is empty sends nothing for it (before "
                "torchmetrics 1.4.0, or a list not reduced by `cat`), and the ranks' collectives would go out of "
                "step; feed every rank at least one batch. Otherwise the ranks run different metric code (classes, "
                "arguments or releases)")
    if any(entry is not None and "[" in entry[1] for entry in pair):
        return ("A list state not reduced by `cat` is gathered element by element: torchmetrics cannot gather lists "
                "of different lengths on different ranks; give it the same length on every rank")
    if pair[0] is not None and pair[1] is not None and pair[0][1] == pair[1][1]:
        return ("torchmetrics gathers a state as data of one dtype and number of dimensions on every rank (it "
                "would reinterpret a same-size dtype silently); give the state the same dtype and number of "
                "dimensions on every rank")
    return "The ranks run different metric code (classes, arguments or releases): run the same code on every rank"


def _pieces(request: Request, meta_bytes: bytes, device: Any) -> Tuple[List[Any], int]:
    """The uint8 tensors whose concatenation is this rank's segment (16-byte aligned
    blocks), and the segment's length."""
    import torch

    zeros = torch.zeros(ALIGN, dtype=torch.uint8, device=device)
    pieces = [torch.frombuffer(bytearray(meta_bytes), dtype=torch.uint8).to(device)]
    length = len(meta_bytes)
    tensors = [block.detach().resolve_conj().resolve_neg() for block in request.blocks]
    if request.records:  # one int64 vector, after the last block
        tensors.append(torch.stack([torch.as_tensor(value).detach().reshape(()).to(device=device, dtype=torch.int64)
                                    for _, _, value in request.records]))
    for tensor in tensors:
        if length % ALIGN:
            pieces.append(zeros[: ALIGN - length % ALIGN])
            length = _align(length)
        flat = tensor.reshape(-1).view(torch.uint8)
        pieces.append(flat)
        length += flat.numel()
    return pieces, _align(length)


def exchange(request: Request, group: Any, device: Any) -> Result:
    """Send ``request`` to every rank of ``group`` and receive theirs: two all_gathers."""
    import torch
    import torch.distributed as dist

    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    meta = {
        "o": list(request.owners),
        "t": request.release,
        "b": [[_dtype_name(t.dtype), list(t.shape)] for t in request.blocks],
        "e": [list(entry) for entry in request.entries],
        "r": [[owner, name] for owner, name, _ in request.records],
    }
    meta_bytes = json.dumps(meta, separators=(",", ":")).encode("utf-8")
    with torch.no_grad():
        pieces, segment = _pieces(request, meta_bytes, device)
        header = torch.frombuffer(bytearray(_header(request, rank, world, len(meta_bytes), segment)),
                                  dtype=torch.uint8).to(device)
        heard = torch.zeros((world, HEADER_BYTES), dtype=torch.uint8, device=device)
        _gather(dist, list(heard.unbind(0)), header, group, "header")
        raws = heard.cpu().numpy()
        headers = [_read_header(raws[peer].tobytes(), peer) for peer in range(world)]
        _check_headers(headers, request.kind, world)

        longest = max(words[6] for words in headers)
        pieces.append(torch.zeros(longest - sum(p.numel() for p in pieces), dtype=torch.uint8, device=device))
        buffer = torch.cat(pieces)
        received = torch.empty((world, longest), dtype=torch.uint8, device=device)
        _gather(dist, list(received.unbind(0)), buffer, group, "segment")
    lengths = [words[5] for words in headers]
    heads = received[:, : max(lengths)].cpu().numpy()
    metas = [meta if peer == rank else json.loads(heads[peer, : lengths[peer]].tobytes().decode("utf-8"))
             for peer in range(world)]
    _check_structure(metas)
    return _unpack(request, metas, lengths, received, rank, world)


def _unpack(
    request: Request, metas: List[Dict[str, Any]], meta_lengths: List[int], received: Any, rank: int, world: int
) -> Result:
    import torch

    values: List[List[Any]] = [[None] * world for _ in request.entries]
    totals: Dict[int, Dict[str, Any]] = {}
    for peer, meta in enumerate(metas):
        buf = received[peer]
        offset = _align(meta_lengths[peer])
        views = []
        for dtype_name, shape in meta["b"]:
            block = Block(getattr(torch, dtype_name), tuple(shape))
            views.append(buf[offset:offset + block.nbytes].view(block.dtype).view(block.shape))
            offset = _align(offset + block.nbytes)
        for index, (_, _, block_index) in enumerate(meta["e"]):
            values[index][peer] = views[block_index]
        for index, (owner, name) in enumerate(meta["r"]):
            value = buf[offset + 8 * index: offset + 8 * index + 8].view(torch.int64)[0]
            owned = totals.setdefault(owner, {})
            owned[name] = value.clone() if name not in owned else owned[name] + value
    return Result(rank, world, values, totals)


def _gather(dist: Any, outputs: Sequence[Any], tensor: Any, group: Any, what: str) -> None:
    try:
        dist.all_gather(list(outputs), tensor, group=group)
    except Exception as exc:
        note = (f"tmpatch coalesced_sync: the {what} all_gather failed. If the ranks run different syncs (one "
                f"without coalesced_sync), they wait for each other until the process group's timeout; {_ADVICE}")
        log.error("%s (%s)", note, exc)
        if hasattr(exc, "add_note"):
            exc.add_note(note)
        raise
