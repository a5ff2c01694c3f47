"""edge_distances: HausdorffDistance measures its edge distances with fixed shapes.

Defect: for every sample and class of an ``update()``, HausdorffDistance's
``edge_surface_distance`` reads the device: ``check_if_binarized`` (``if not
torch.all(x.bool() == x): raise``) for both masks and again in ``binary_erosion``,
``mask_edges``' ``if not or_val.any()``, ``surface_distance``'s ``torch.any`` of each
mask, ``distance_transform``'s ``torch.where`` (its point lists) and the boolean index
``dis[preds]`` that returns the distances at the edge pixels; ``binary_erosion`` also
copies its structuring element from the host. Seven syncs or more per sample and class
(28 for 2 samples of 2 classes). Not fixed upstream (1.9.0 included).

Repair, in the update of a HausdorffDistance with a deferred-report book (the class
``update`` is marked; the caller, the release's ``hausdorff_distance``, takes the
maximum of what ``edge_surface_distance`` returns):

* ``edge_surface_distance`` takes the edges from the release's ``mask_edges`` and
  returns, in place of the distances at the edge pixels, a vector of one entry per pixel:
  the release's distance at an edge pixel, 0 elsewhere (inf at the other mask's edges
  where a mask has none, as the release returns). Distances are >= 0, so its maximum is
  the release's, bit for bit. Each pixel's distance to the nearest edge pixel of the other
  mask is the minimum of the release's expression (its dtypes: ``(s0 * rows) ** 2 + (s1 *
  cols) ** 2``, ``sqrt``, ...) over rows, then over columns: the expression only grows with
  each term, so the minimum is the same value (memory ``h * w * (h + w)`` per mask, where
  the release's is edge points times other points);
* ``check_if_binarized`` is counted on the device and the release's ``ValueError`` (its
  message first, tmpatch's note after it) raised once, from a later update, the next
  ``compute()`` or settle point;
* ``mask_edges``' ``if not or_val.any()`` is not taken: empty masks then have no edge
  pixels, the same distances;
* a sample and class where both masks are empty: the release's ``max()`` of an empty tensor
  raises ``RuntimeError``; counted and raised (torch's message first) once, as above (that
  distance is 0 in the states: deliberate difference, ``reset()`` discards it).

On the CPU, where the reads cost nothing, the class ``update`` runs the release's update
unmarked: its checks, errors and arithmetic as they are.
* ``binary_erosion``'s structuring element is filled on the device (every caller).

The release's code runs outside a marked update (the functional API, metrics built before
``apply()``), for 3-D masks, non-square images (the release's ``distance_transform`` strides
rows by the height), spacings other than ``None`` or a list of two Python numbers, and a
default dtype other than float32. ``surface_distance``, ``distance_transform`` and
``hausdorff_distance`` are fingerprinted (their code decides what the repair reproduces)
and left as they are.

Policy ``checks`` (``TMPATCH_CHECKS``): ``eager`` leaves the update unmarked, so the release's
code runs, its error raised in ``update()`` with its syncs.

Releases: 1.5.0-1.9.0, where HausdorffDistance exists (two implementations of each
function, differing in annotations; three of ``hausdorff_distance``).
"""
from __future__ import annotations

from types import ModuleType
from typing import Any, Callable, Dict, List, Optional, Tuple

from tmpatch.runtime import deferred, host
from tmpatch.runtime.compiled import compiling
from tmpatch.runtime.deferred.marking import Marker
from tmpatch.runtime.device_tensors import to_device
from tmpatch.spec import PATCHED, Decline, Edit, Label, Patch, Rewrite, Target, Together, Variant, gated, since, span

_NOTE = ("reported at {point} instead of in update(). Unlike without tmpatch, those batches were added to the "
         "metric's states: reset() discards them. TMPATCH_CHECKS=eager raises it in update(), as without tmpatch")


def _count(found: List[Tuple[Any, int]], top: Any, all_ranks: bool) -> str:
    names = sorted({type(metric).__name__ for metric, _ in found if metric is not top})
    name = type(top).__name__ + (f" ({', '.join(names)} inside)" if names else "")
    return f"{sum(n for _, n in found)} update(s) of {name}{' on some rank' if all_ranks else ''}"


def _binarized(top: Any, found: List[Tuple[Any, int]], all_ranks: bool) -> None:
    raise deferred.error_as_release(ValueError, "Input x should be binarized", (
        f"tmpatch edge_distances: {_count(found, top, all_ranks)} since the last report had masks with values "
        f"other than 0 and 1; {_NOTE.format(point=deferred.point())}"))


def _empty(top: Any, found: List[Tuple[Any, int]], all_ranks: bool) -> None:
    import torch

    try:
        torch.empty(0).max()  # the release's error: torch's own message
        message = "max() of an empty tensor"
    except RuntimeError as exc:
        message = str(exc)
    raise deferred.error_as_release(RuntimeError, message, (
        f"tmpatch edge_distances: {_count(found, top, all_ranks)} since the last report had a sample and class "
        "with both masks empty, where the release takes the maximum of no distances; "
        f"{_NOTE.format(point=deferred.point())}"))


BINARIZED = deferred.Record("edge_distances:binarized", _binarized)
EMPTY = deferred.Record("edge_distances:empty", _empty)

class _Update:
    """One marked update: whether any check failed / any pair was empty (device bools, or None)."""

    __slots__ = ("binarized", "empty")

    def __init__(self) -> None:
        self.binarized: Any = None
        self.empty: Any = None


#: the marked update running in this thread / task (class ``update`` below)
MARK = Marker("tmpatch_edge_distances", EMPTY)


def build_update(module: ModuleType) -> Callable[..., Any]:
    """``HausdorffDistance.update``: the release's update, marked on a device; what it found is counted once
    per update. On the CPU (``preds`` there), where its reads cost nothing, the release's update unmarked."""
    import torch

    recorded, slot, Tensor = MARK.waits, MARK.slot, torch.Tensor

    def update(original: Callable, self: Any, *args: Any, **kwargs: Any) -> Any:
        preds = args[0] if args else kwargs.get("preds")
        if not recorded(self) or (isinstance(preds, Tensor) and host.on_host(preds) and not compiling()):
            return original(self, *args, **kwargs)
        state = _Update()
        token = slot.set(state)
        try:
            result = original(self, *args, **kwargs)
        finally:
            slot.reset(token)
        for record, found in ((BINARIZED, state.binarized), (EMPTY, state.empty)):
            if found is not None:
                record.add(self, found)
        return result

    return update


def _either(old: Any, new: Any) -> Any:
    return new if old is None else old | new


def build_check(module: ModuleType) -> Callable[..., Any]:
    """``check_if_binarized``: in a marked update on a device, counted for later instead of read."""
    import torch

    @gated(MARK.slot)
    def check(original: Callable, x: Any) -> Any:
        state = MARK.get()
        if state is None or not isinstance(x, torch.Tensor) or (host.on_host(x) and not compiling()):
            return original(x)  # on the CPU a read costs nothing: the release's check raises
        state.binarized = _either(state.binarized, (x.bool() == x).all().logical_not())
        return None

    return check


def _unchanged(module: ModuleType) -> Callable[..., Any]:
    """A fingerprinted function the repair relies on, left as it is (its layer costs no call)."""

    @gated(MARK.slot)
    def call(original: Callable, *args: Any, **kwargs: Any) -> Any:
        return original(*args, **kwargs)

    return call


def _names(module: ModuleType) -> Dict[str, Any]:
    def nothing(or_val: Any) -> Any:
        """The release's ``not or_val.any()``; in a marked update False (empty masks: no edge pixels)."""
        return False if MARK.get() is not None else not or_val.any()

    return {"_tmpatch_nothing": nothing, "_tmpatch_to_device": to_device}


_NOTHING = "if not or_val.any():\n    p, t = torch.zeros_like(preds), torch.zeros_like(target)\n    return p, t, p, t"
MASK_EDGES = Rewrite((Edit(_NOTHING, _NOTHING.replace("not or_val.any()", "_tmpatch_nothing(or_val)")),), _names)
_STRUCTURE = "structure = generate_binary_structure(image.ndim - 2, 1).int().to(image.device)"
EROSION = Rewrite((Edit(f"if structure is None:\n    {_STRUCTURE}",
                        "if structure is None:\n    structure = _tmpatch_to_device("
                        "generate_binary_structure(image.ndim - 2, 1).int(), torch.int32, image.device)"),), _names)


def build_distances(module: ModuleType) -> Callable[..., Any]:
    """``edge_surface_distance``: in a marked update, one distance per pixel (the caller takes the maximum)."""
    import torch

    float32, inf = torch.float32, float("inf")
    metrics = ("euclidean", "chessboard", "taxicab")

    def terms(n: int, scale: Any, metric: str, device: Any) -> Any:
        """The release's term for every pair of positions along one axis: ``(s * |a - b|) ** 2`` or ``s * |a - b|``."""
        ticks = torch.arange(n, device=device)
        steps = (ticks.view(-1, 1) - ticks.view(1, -1)).abs()  # int64, as the release's point differences
        return (scale * steps) ** 2 if metric == "euclidean" else scale * steps

    def combine(rows: Any, cols: Any, metric: str) -> Any:
        if metric == "euclidean":
            return (rows + cols).sqrt()
        if metric == "chessboard":
            return torch.max(rows, cols).float()
        return (rows + cols).float()

    def nearest(edges: Any, sampling: List[Any], metric: str) -> Any:
        """``(2, h, w)`` edge masks -> per mask and pixel the release's distance to its nearest edge pixel
        (inf: none)."""
        _, h, w = edges.shape
        rows, cols = terms(h, sampling[0], metric, edges.device), terms(w, sampling[1], metric, edges.device)
        # per column: the least row term over that column's edge pixels (a column without any is masked below)
        column = torch.where(edges.unsqueeze(1), rows.view(1, h, h, 1), rows.max()).amin(dim=2)  # (2, h, w)
        present = edges.any(dim=1)  # (2, w): columns with an edge pixel
        candidates = combine(column.unsqueeze(2), cols.view(1, 1, w, w), metric)  # (2, h, w, w')
        return torch.where(present.view(2, 1, 1, w), candidates, inf).amin(dim=3)

    def one_way(to: Any, of: Any, to_any: Any, of_any: Any, nearest_of: Any) -> Any:
        """The release's ``surface_distance(to, of)`` as one entry per pixel (0 where it has none)."""
        zero = torch.zeros((), dtype=float32, device=to.device)
        return torch.where(to_any, torch.where(to, nearest_of, zero), torch.where(of, inf, zero)).reshape(-1)

    def usable(preds: Any, sampling: Any, metric: Any) -> Optional[List[Any]]:
        if (not isinstance(preds, torch.Tensor) or preds.dim() != 2 or preds.shape[0] != preds.shape[1]
                or metric not in metrics or torch.get_default_dtype() is not float32):
            return None
        if sampling is None:
            return [1, 1]
        if (type(sampling) is list and len(sampling) == 2
                and all(type(s) in (int, float) for s in sampling)):
            return sampling
        return None

    @gated(MARK.slot)
    def distances(original: Callable, preds: Any, target: Any, distance_metric: Any = "euclidean",
                  spacing: Any = None, symmetric: bool = False) -> Any:
        state = MARK.get()
        sampling = usable(preds, spacing, distance_metric) if state is not None else None
        if sampling is None:
            return original(preds, target, distance_metric=distance_metric, spacing=spacing, symmetric=symmetric)
        output = module.mask_edges(preds, target)
        edges = torch.stack([output[0].bool(), output[1].bool()])  # the release's edge masks: square, padded by one
        found = edges.flatten(1).any(dim=1)
        state.empty = _either(state.empty, ~(found[0] | found[1]))
        near = nearest(edges, sampling, distance_metric)
        p, t = edges[0], edges[1]
        forward = one_way(p, t, found[0], found[1], near[1])
        if symmetric:
            return forward, one_way(t, p, found[1], found[0], near[0])
        return forward

    return distances


_UTILS = "torchmetrics.functional.segmentation.utils"
_HERE = since("1.5.0")


def _pair(qualname: str, old: str, new: str, build: Any) -> Target:
    return Target(module=_UTILS, qualname=qualname, present=_HERE, shared=True, variants=(  # utils older than 1.5.0
        Variant(span("1.5.0", "1.5.2"), old, build),
        Variant(span("1.6.0", "1.9.0"), new, build),  # annotations
    ))


PATCH = Patch(
    name="edge_distances",
    summary="HausdorffDistance reads each mask's binarized check and emptiness, and selects its edge distances "
            "through boolean masks, for every sample and class of each update(); measured with fixed shapes",
    known=since("0.10.0"),
    declines=(Decline(span("0.10.0", "0.11.4"),
                      "nothing to repair: the segmentation distance metrics came in 1.5.0",
                      needed=False),),
    upstream="not fixed upstream (torch.any, torch.where and dis[preds] in surface_distance, per sample and class)",
    changes="on a GPU a non-binary mask, or a sample and class with both masks empty, raises the release's error "
            "once (from a later update(), or compute()), the batch in the states "
            "(upstream and on the CPU: raised in that update())",
    requires=("deferred_reports",),
    labels=(
        Label(PATCHED, "HausdorffDistance checks and measures the edges of each sample and class with device reads "
              "and boolean masks; the edge_distances patch measures them with fixed shapes",
              file="functional/segmentation/utils.py",
              function="check_if_binarized|mask_edges|binary_erosion|surface_distance|distance_transform"),
    ),
    together=(Together("the marked update measures the edges with all of them (their code decides what the measure "
                       "reproduces)", targets=("check_if_binarized", "mask_edges", "edge_surface_distance",
                                               "surface_distance", "distance_transform", "hausdorff_distance",
                                               "HausdorffDistance.update")),),
    targets=(
        Target(module=_UTILS, qualname="check_if_binarized", present=_HERE, shared=True,
               variants=(Variant(span("1.5.0", "1.9.0"), "15c248413522d448", build_check),)),
        _pair("mask_edges", "17cd7029da1ed761", "8c6331949fc8ef02", MASK_EDGES),
        _pair("binary_erosion", "8876aa629e0ebeb6", "f5f32e0274fa717c", EROSION),
        _pair("edge_surface_distance", "8ce3838fcb2e4c2a", "411e42ffe775990d", build_distances),
        _pair("surface_distance", "e12b21cf1e212131", "b2caddb295061f36", _unchanged),
        _pair("distance_transform", "8aa3579f79654943", "f2566511b8705e37", _unchanged),
        Target(module="torchmetrics.functional.segmentation.hausdorff_distance", qualname="hausdorff_distance",
               present=_HERE, variants=(
                   Variant(span("1.5.0", "1.5.2"), "1917862724daaf5d", _unchanged),
                   Variant(span("1.6.0", "1.7.4"), "f66ac92d6d503d1a", _unchanged),  # annotations
                   Variant(span("1.8.0", "1.8.1"), "4234830d67839827", _unchanged),  # input_format "mixed"
                   Variant(span("1.8.2", "1.9.0"), "8737f8a5bc548429", _unchanged),  # _segmentation_inputs_format
               )),
        Target(module="torchmetrics.segmentation.hausdorff_distance", qualname="HausdorffDistance.update",
               present=_HERE, variants=(Variant(span("1.5.0", "1.9.0"), "6295d8b6b80d0b30", build_update),)),
    ),
)
