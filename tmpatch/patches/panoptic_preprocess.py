"""panoptic_preprocess: panoptic quality's input preprocessing without host copies or reads.

Defect: ``_prepocess_inputs`` (PanopticQuality, ModifiedPanopticQuality; twice per
``update()``, for ``preds`` and ``target``) makes host constants into device tensors and
reads the device:

* ``_isin(arr, values)`` compares with ``arr.new(values)``: the ``things`` and the
  ``stuffs`` category lists copied to the device, four copies per update;
* ``out[~(mask_things | mask_stuffs)] = out.new(void_color)``: the void color copied, and a
  boolean-mask assignment of a tensor (a data-dependent size);
* with ``allow_unknown_preds_category=False`` (the default), ``if ... not
  torch.all(mask_things | mask_stuffs): raise ValueError("Unknown categories found: ...")``
  reads the device.

Not fixed upstream (1.9.0 included).

Repair (edits of those statements, :mod:`tmpatch.engine.rewrite`; the rest is the release's code):

* ``_isin`` of an integer tensor with Python int categories tests membership on the device
  without the list: a range test per run of consecutive ids (up to four runs), else a
  lookup table over the ids' span filled run by run; the same booleans as the release's
  equality test;
* the void color is put with ``torch.where(unknown[..., None], void, out)`` (the color made
  with fills), the same tensor as the release's assignment;
* in the update of a metric with a deferred-report book (built while ``deferred_reports`` is
  applied; the class ``update``'s call is marked), the unknown-category check is counted on
  the device and the release's ``ValueError`` ("Unknown categories found", without the list of
  ids, which a device read would give; tmpatch's note after it) raised once at the next
  ``compute()`` (or a later update, or the next settle point). On the CPU, where the read costs
  nothing, the release's check runs as it is: its error, ids listed, from that update.

Deliberate difference (on a device only): a batch with unknown ``preds`` categories is kept in the states, its
unknown pixels counted as void (as with ``allow_unknown_preds_category=True``); upstream,
``update()`` raised before adding it. The report says so; ``reset()`` discards it. The
segment matching that follows (``torch.unique``, ``.tolist()``, host-side dictionaries) is
other syncs, not this patch's. On the CPU, for float inputs, ids outside the input's dtype
and metrics built before ``apply()``, the release's statements run.

Policy ``checks`` (``TMPATCH_CHECKS``): ``eager`` leaves the update unmarked, so the release's
code runs, its error raised in ``update()`` with its syncs.

Releases: 1.0.0-1.9.0 (two implementations of ``_isin``, three of ``_prepocess_inputs``
with the same statements, one of each class ``update``).
"""
from __future__ import annotations

import contextlib
import textwrap
from types import ModuleType
from typing import Any, Dict, Iterator, List, Tuple

from tmpatch.runtime import deferred, host
from tmpatch.runtime.compiled import ContextSlot, compiling
from tmpatch.runtime.deferred.marking import waits
from tmpatch.runtime.device_tensors import device_tensor
from tmpatch.spec import PATCHED, Decline, Edit, Label, Patch, Rewrite, Target, Together, Variant, since, span

#: the most runs of consecutive ids tested one by one; more use a lookup table
MAX_RUNS = 4


def _report(top: Any, found: List[Tuple[Any, int]], all_ranks: bool) -> None:
    count = sum(n for _, n in found)
    names = sorted({type(metric).__name__ for metric, _ in found if metric is not top})
    name = type(top).__name__ + (f" ({', '.join(names)} inside)" if names else "")
    where = " on some rank" if all_ranks else ""
    raise deferred.error_as_release(ValueError, "Unknown categories found", (
        f"tmpatch panoptic_preprocess: {count} update(s) of {name}{where} since the last "
        f"report had `preds` with category ids in neither `things` nor `stuffs` (not listed: a device read); "
        f"reported at {deferred.point()} instead of in update(). Unlike without tmpatch, those batches were added "
        "to the metric's states, the unknown pixels counted as void, as with allow_unknown_preds_category=True: "
        "reset() discards them. TMPATCH_CHECKS=eager raises it in update(), as without tmpatch"))


#: updates whose preds held unknown categories, reported at compute
RECORD = deferred.Record("panoptic_preprocess", _report)

#: the metric whose preds are being preprocessed in this thread / task, if it records
_current = ContextSlot("tmpatch_panoptic")  # a ContextVar; a plain slot while torch.compile traces

#: the metric whose class update runs the segment matching on the inputs it preprocessed (every
#: category known or void, every stuff's instance 0); read by panoptic_matching
MATCHING = ContextSlot("tmpatch_panoptic_matching")


@contextlib.contextmanager
def _checking(metric: Any) -> Iterator[None]:
    """Mark the preprocessing of ``metric``'s preds (when its checks can wait for compute: a book,
    and policy ``checks`` ``deferred``)."""
    if not waits(RECORD, metric):
        yield
        return
    token = _current.set(metric)
    try:
        yield
    finally:
        _current.reset(token)


def _runs(values: List[int]) -> List[Tuple[int, int]]:
    """Sorted runs ``(first, last)`` of consecutive ints."""
    runs: List[Tuple[int, int]] = []
    for value in sorted(set(values)):
        if runs and value == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], value)
        else:
            runs.append((value, value))
    return runs


def _names(module: ModuleType) -> Dict[str, Any]:
    import torch

    integral = {t: torch.iinfo(t) for t in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)}
    zeros, where = torch.zeros, torch.where

    def on_device(t: Any) -> bool:
        return not (host.on_host(t) and not compiling())

    def isin(arr: Any, values: Any) -> Any:
        """The release's ``(arr[..., None] == arr.new(values)).any(-1)``, without the list on the device;
        None where the release's statement must run."""
        info = integral.get(arr.dtype)
        items = list(values) if isinstance(values, (list, tuple)) else None
        if (not on_device(arr) or info is None or items is None
                or not all(type(v) is int and info.min <= v <= info.max for v in items)):
            return None
        if not items:
            return zeros(arr.shape, dtype=torch.bool, device=arr.device)
        runs = _runs(items)
        if len(runs) <= MAX_RUNS:
            found = None
            for first, last in runs:
                part = arr == first if first == last else (arr >= first) & (arr <= last)
                found = part if found is None else found | part
            return found
        low, high = runs[0][0], runs[-1][1]
        table = zeros(high - low + 1, dtype=torch.bool, device=arr.device)
        for first, last in runs:
            table[first - low:last - low + 1] = True  # a fill of a slice
        inside = (arr >= low) & (arr <= high)
        return table[(arr.long() - low).clamp(0, high - low)] & inside

    def unknown(known: Any) -> bool:
        """The release's ``not torch.all(known)``; in a marked update on a device, counted for later instead
        (False)."""
        metric = _current.get()
        if metric is None or not on_device(known):  # on the CPU a read costs nothing: the release's check raises
            return not torch.all(known)
        RECORD.add(metric, ~known.all())
        return False

    def void_filled(out: Any, unknown_mask: Any, void_color: Any) -> Any:
        """The release's ``out[unknown_mask] = out.new(void_color)`` as a new tensor, or None."""
        if (not on_device(out) or not isinstance(void_color, (tuple, list)) or out.dim() != unknown_mask.dim() + 1
                or out.shape[-1] != len(void_color)):
            return None
        void = device_tensor(list(void_color), dtype=out.dtype, device=out.device)
        return where(unknown_mask.unsqueeze(-1), void, out)

    def matching(metric: Any, update: Any) -> Any:
        """``update`` (the release's ``_panoptic_quality_update``), called with ``metric``'s update marked."""
        def call(*args: Any, **kwargs: Any) -> Any:
            token = MATCHING.set(metric)
            try:
                return update(*args, **kwargs)
            finally:
                MATCHING.reset(token)

        return call

    return {"_tmpatch_isin": isin, "_tmpatch_unknown": unknown, "_tmpatch_void_filled": void_filled,
            "_tmpatch_checking": _checking, "_tmpatch_matching": matching}


_ISIN = "return (arr[..., None] == arr.new(values)).any(-1)"
ISIN = Rewrite((Edit(_ISIN, "_tmpatch_found = _tmpatch_isin(arr, values)\n"
                            "if _tmpatch_found is not None:\n    return _tmpatch_found\n" + _ISIN),), _names)

_CHECK = ("if not allow_unknown_category and not torch.all(mask_things | mask_stuffs):\n"
          "    raise ValueError(f\"Unknown categories found: {out[~(mask_things | mask_stuffs)]}\")")
_VOID = "out[~(mask_things | mask_stuffs)] = out.new(void_color)"
PREPROCESS = Rewrite((
    Edit(_CHECK, _CHECK.replace("not torch.all(mask_things | mask_stuffs)",
                                "_tmpatch_unknown(mask_things | mask_stuffs)")),
    Edit(_VOID, "_tmpatch_filled = _tmpatch_void_filled(out, ~(mask_things | mask_stuffs), void_color)\n"
                f"if _tmpatch_filled is not None:\n    out = _tmpatch_filled\nelse:\n{textwrap.indent(_VOID, '    ')}"),
), _names)

_PREDS = ("flatten_preds = _prepocess_inputs(\n"
          "    self.things, self.stuffs, preds, self.void_color, self.allow_unknown_preds_category\n)")
_MATCH = ("iou_sum, true_positives, false_positives, false_negatives = _panoptic_quality_update(\n"
          "    flatten_preds, flatten_target, self.cat_id_to_continuous_id, self.void_color{}\n)")


def _update(modified: str) -> Rewrite:
    """The class update's edits: its preds' preprocessing checked, its segment matching marked."""
    match = _MATCH.format(modified)
    return Rewrite((Edit(_PREDS, f"with _tmpatch_checking(self):\n{textwrap.indent(_PREDS, '    ')}"),
                    Edit(match, match.replace("= _panoptic_quality_update(",
                                              "= _tmpatch_matching(self, _panoptic_quality_update)("))), _names)


UPDATE = _update("")
MODIFIED_UPDATE = _update(", modified_metric_stuffs=self.stuffs")

_COMMON = "torchmetrics.functional.detection._panoptic_quality_common"
_CLASSES = "torchmetrics.detection.panoptic_qualities"

PATCH = Patch(
    name="panoptic_preprocess",
    summary="PanopticQuality and ModifiedPanopticQuality copy the category lists and void color to the device and "
            "read the unknown-category check on each update(); "
            "tested and put on the device, check reported later, once",
    known=since("0.10.0"),
    declines=(Decline(span("0.10.0", "0.11.4"), "nothing to repair: PanopticQuality came in 1.0.0", needed=False),),
    upstream="not fixed upstream (_isin with arr.new(values), out.new(void_color) in _prepocess_inputs)",
    changes="on a GPU unknown preds categories (allow_unknown_preds_category=False) raise the release's ValueError "
            "once (from a later update(), or compute()), the batch counted with those pixels void "
            "(upstream and on the CPU: raised in that update())",
    requires=("deferred_reports",),
    labels=(
        Label(PATCHED, "panoptic quality copies its category lists to the device (_isin: arr.new(values)); the "
              "panoptic_preprocess patch tests membership on the device", function="_isin"),
        Label(PATCHED, "panoptic quality copies the void color and assigns it through a mask, and reads the "
              "unknown-category check; the panoptic_preprocess patch puts it with torch.where and defers the check",
              function="_prepocess_inputs"),
    ),
    together=(Together("the update marks the unknown-category check, which _prepocess_inputs defers in a marked "
                       "update", targets=("PanopticQuality.update", "ModifiedPanopticQuality.update"),
                       on=("_prepocess_inputs",)),),
    targets=(
        Target(module=_COMMON, qualname="_isin", variants=(
            Variant(span("1.0.0", "1.5.2"), "1ae655e1feaa3679", ISIN),
            Variant(span("1.6.0", "1.9.0"), "15ffb81ea0a84d34", ISIN),  # annotation only
        )),
        Target(module=_COMMON, qualname="_prepocess_inputs", variants=(
            Variant(span("1.0.0", "1.3.1"), "c5b27b8a0a7c8918", PREPROCESS),
            Variant(span("1.3.2", "1.5.2"), "7226b497148f60dc", PREPROCESS),  # message formatting
            Variant(span("1.6.0", "1.9.0"), "0b30ef136aef78ae", PREPROCESS),  # annotations
        )),
        Target(module=_CLASSES, qualname="PanopticQuality.update",
               variants=(Variant(span("1.0.0", "1.9.0"), "12de836dc8b28080", UPDATE),)),
        Target(module=_CLASSES, qualname="ModifiedPanopticQuality.update",
               variants=(Variant(span("1.0.0", "1.9.0"), "746fffe2eb104a0b", MODIFIED_UPDATE),)),
    ),
)
