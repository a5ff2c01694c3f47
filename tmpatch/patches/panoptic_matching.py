"""panoptic_matching: panoptic quality's segment matching on the device.

Defect: ``_panoptic_quality_update_sample`` (PanopticQuality, ModifiedPanopticQuality;
once per sample of every ``update()``) matches segments on the host: ``torch.unique`` of
the colours and of the colour pairs (a read of each result's size), ``.tolist()`` of them
into dictionaries, each candidate pair's IoU read into an ``if``, each unmatched
segment's void share read into an ``if``, and one element update per count. On CUDA
that is a dozen syncs for the smallest sample and more with every segment. Not fixed
upstream (1.9.0 included).

Repair: in the class ``update`` (marked by ``panoptic_preprocess``, whose preprocessing
makes every category known or void and every stuff's instance 0) the same four tensors
are computed on the device with fixed shapes: colours and colour pairs ranked by stable
sorts (the release's lexicographic order), areas counted per rank, the release's IoU
(the same int64 areas, the same float32 quotient), matches, false negatives and false
positives selected by the release's conditions and added per category. The counts are
integers. The IoU sums are the release's bit for bit because every sum is exact in
double: a matched IoU is a float32 in (0.5, 1] (a multiple of 2**-24), so any order of up
to 2**29 of them gives the exact sum; a modified-metric stuff has one colour, so at most
one IoU per category and sample.

The same path runs on the CPU, where it is also faster than the release's host loop
from small samples on (benchmarks/families.txt). The release's function runs outside a
marked update (the functional API; inputs not preprocessed could hold
unknown categories, where the release raises), for float colours, empty samples, more
than 2**29 points, a default dtype other than float32 (the IoU dtype), and under
``torch.use_deterministic_algorithms(True)`` (index_add_ of CUDA tensors).

Releases: 1.0.0-1.9.0 (three implementations of ``_panoptic_quality_update_sample``
with the same algorithm: names and annotations differ).
"""
from __future__ import annotations

from types import ModuleType
from typing import Any, Callable, Dict, Tuple

from tmpatch.patches.panoptic_preprocess import MATCHING
from tmpatch.runtime.device_tensors import device_tensor
from tmpatch.spec import PATCHED, Decline, Label, Patch, Target, Variant, since, span

#: the most points of one sample on the device path (each matched IoU sum stays exact in double)
MAX_POINTS = 2 ** 29

#: category tables kept per (categories, modified stuffs, device); cleared when this many
_TABLES_KEPT = 16
_tables: Dict[Tuple[Any, ...], Tuple[Any, Any, Any]] = {}


def build_sample(module: ModuleType) -> Callable[..., Any]:
    """``_panoptic_quality_update_sample``: in a marked update, the matching on the device."""
    import torch

    integral = frozenset({torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64})
    int64, float32, double, bool_ = torch.int64, torch.float32, torch.double, torch.bool
    zeros, ones, arange, sort, where = torch.zeros, torch.ones, torch.arange, torch.sort, torch.where

    def filled(values: Any, dtype: Any, device: Any) -> Any:
        out = torch.empty(len(values), dtype=dtype, device=device)
        for i, value in enumerate(values):
            out[i].fill_(value)  # a fill kernel: no host copy
        return out

    def table(categories: Dict[int, int], modified: Any, device: Any) -> Tuple[Any, Any, Any]:
        """Sorted category ids, their continuous ids, and whether each is a modified stuff."""
        key = (tuple(sorted(categories.items())), frozenset(modified), str(device))
        found = _tables.get(key)
        if found is None:
            ids = sorted(categories)
            found = (filled(ids, int64, device), filled([categories[i] for i in ids], int64, device),
                     filled([i in modified for i in ids], bool_, device))
            if len(_tables) >= _TABLES_KEPT:
                _tables.clear()
            _tables[key] = found
        return found

    def counted(index: Any, amounts: Any, length: int) -> Any:
        """``amounts`` (bools or ints) summed per ``index`` into ``length`` int64 slots."""
        return zeros(length, dtype=int64, device=index.device).index_add_(0, index, amounts.to(int64))

    def runs(differs: Any, n: int) -> Tuple[Any, Any]:
        """Of a sorted sequence (``differs``: each element against the one before): each element's run, each
        run's length."""
        new = ones(n, dtype=bool_, device=differs.device)
        new[1:] = differs
        run = new.cumsum(0) - 1
        return run, counted(run, torch.ones_like(run), n)

    def ranked(colors: Any, n: int) -> Tuple[Any, Any, Any, Any]:
        """Per point its colour's rank (lexicographic, dense); per rank its area and colour; the number of ranks."""
        order = sort(colors[:, 1], stable=True).indices
        order = order[sort(colors[order, 0], stable=True).indices]
        ordered = colors[order]
        run, area = runs((ordered[1:] != ordered[:-1]).any(1), n)
        rank = torch.empty_like(run).scatter_(0, order, run)
        color = colors.new_zeros((n, 2)).index_copy_(0, run, ordered)  # repeated ranks copy equal rows
        return rank, area, color, run[-1] + 1

    def lookup(cats: Any, ids: Any, conts: Any, mods: Any) -> Tuple[Any, Any]:
        """Continuous id and modified stuff of each category (an unknown one: not modified)."""
        cats = cats.to(int64).contiguous()
        at = torch.searchsorted(ids, cats).clamp_(max=ids.numel() - 1)
        return conts[at], mods[at] & (ids[at] == cats)

    def matched(preds: Any, target: Any, categories: Dict[int, int], void: Any, modified: Any) -> Tuple[Any, ...]:
        n, device = preds.shape[0], preds.device
        ids, conts, mods = table(categories, modified, device)
        size = len(categories)
        void = device_tensor(list(void), dtype=preds.dtype, device=device)
        p_rank, p_area, p_color, p_count = ranked(preds, n)
        t_rank, t_area, t_color, t_count = ranked(target, n)
        # colour pairs, ranked by (pred rank, target rank): the release's order of its pair dictionary
        keys, _ = sort(p_rank * n + t_rank)
        run, inter = runs(keys[1:] != keys[:-1], n)
        pair = zeros(n, dtype=int64, device=device).index_copy_(0, run, keys)
        positions = arange(n, device=device)
        p, t = pair // n, pair % n
        # per rank: the points of that colour whose other side is void (the release's .get(..., 0))
        p_void_point, t_void_point = (preds == void).all(1), (target == void).all(1)
        p_void, t_void = counted(p_rank, t_void_point, n), counted(t_rank, p_void_point, n)
        pair_color, target_color = p_color[p], t_color[t]
        cont, mod = lookup(target_color[:, 0], ids, conts, mods)
        candidate = ((positions < run[-1] + 1) & ~(target_color == void).all(1)
                     & (pair_color[:, 0] == target_color[:, 0]))
        union = p_area[p] - p_void[p] + t_area[t] - t_void[t] - inter
        iou = inter / union
        match = candidate & ~mod & (iou > 0.5)
        hit = match | (candidate & mod & (iou > 0))
        iou_sum = zeros(size, dtype=double, device=device).index_add_(0, cont, where(hit, iou, 0).to(double))
        true_positives = counted(cont, match, size)
        counts = []
        for rank_count, color, area, void_area, side in ((t_count, t_color, t_area, t_void, t),
                                                         (p_count, p_color, p_area, p_void, p)):
            taken = counted(side, match, n) > 0
            side_cont, side_mod = lookup(color[:, 0], ids, conts, mods)
            present = positions < rank_count
            unmatched = present & ~(color == void).all(1) & ~taken & (void_area / area <= 0.5) & ~side_mod
            counts.append(counted(side_cont, unmatched, size))
            if side is t:  # each target colour of a modified stuff is one "true positive"
                true_positives += counted(side_cont, present & side_mod, size)
        false_negatives, false_positives = counts
        to = torch.int
        return iou_sum, true_positives.to(to), false_positives.to(to), false_negatives.to(to)

    def sample(original: Callable, flatten_preds: Any, flatten_target: Any, cat_id_to_continuous_id: Any,
               void_color: Any, stuffs_modified_metric: Any = None) -> Any:
        metric = MATCHING.get()
        modified = stuffs_modified_metric or set()
        if (metric is None or not isinstance(flatten_preds, torch.Tensor)
                or not isinstance(flatten_target, torch.Tensor)
                or flatten_preds.dtype not in integral or flatten_target.dtype != flatten_preds.dtype
                or flatten_preds.dim() != 2 or flatten_preds.shape[-1] != 2
                or flatten_preds.shape != flatten_target.shape or flatten_preds.device != flatten_target.device
                or not 0 < flatten_preds.shape[0] <= MAX_POINTS
                or not isinstance(cat_id_to_continuous_id, dict) or not cat_id_to_continuous_id
                or not all(type(k) is int and type(v) is int for k, v in cat_id_to_continuous_id.items())
                or not isinstance(void_color, tuple) or len(void_color) != 2
                or not all(type(v) is int for v in void_color)
                or not set(modified) <= set(getattr(metric, "stuffs", ()))  # preprocessed: one colour each
                or torch.get_default_dtype() is not float32 or torch.are_deterministic_algorithms_enabled()):
            return original(flatten_preds, flatten_target, cat_id_to_continuous_id, void_color,
                            stuffs_modified_metric=stuffs_modified_metric)
        return matched(flatten_preds, flatten_target, cat_id_to_continuous_id, void_color, modified)

    return sample


PATCH = Patch(
    name="panoptic_matching",
    summary="PanopticQuality and ModifiedPanopticQuality match segments on the host (torch.unique, tolist, an if "
            "per pair and per segment) for every sample of each update(); matched on the device",
    known=since("0.10.0"),
    declines=(Decline(span("0.10.0", "0.11.4"), "nothing to repair: PanopticQuality came in 1.0.0", needed=False),),
    upstream="not fixed upstream (host dictionaries in _panoptic_quality_update_sample)",
    requires=("panoptic_preprocess",),
    labels=(
        Label(PATCHED, "panoptic quality matches segments on the host (unique colours, tolist, an if per pair and "
              "segment); the panoptic_matching patch matches them on the device",
              file="functional/detection/_panoptic_quality_common.py",
              function="_panoptic_quality_update_sample|_get_color_areas|_to_tuple|_nested_tuple|_calculate_iou"
                       "|_filter_false_negatives|_filter_false_positives"),
    ),
    targets=(
        Target(module="torchmetrics.functional.detection._panoptic_quality_common",
               qualname="_panoptic_quality_update_sample", variants=(
                   Variant(span("1.0.0", "1.1.2"), "2568ab5c5d8273d5", build_sample),
                   Variant(span("1.2.0", "1.5.2"), "c3c6cacb8d3721bb", build_sample),  # names
                   Variant(span("1.6.0", "1.9.0"), "47d9c3357dbeea16", build_sample),  # annotations
               )),
    ),
)
