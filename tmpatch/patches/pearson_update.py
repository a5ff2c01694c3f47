"""pearson_update: PearsonCorrCoef and ConcordanceCorrCoef decide their update's branch without reading the device.

Defect: before 1.7.4, ``_pearson_corrcoef_update`` starts with ``cond = num_prior.mean() > 0
or num_obs == 1`` (``n_prior.mean() > 0`` before 1.1.1) and runs ``if cond:`` twice: a
Python ``or`` / ``if`` on a device value, one read on every ``update()`` of
PearsonCorrCoef and ConcordanceCorrCoef. Fixed upstream in 1.7.4 (a new update without
the branch).

Repair: the branch stays the release's; what changes is how its condition is known. The
class ``update`` (wrapped) keeps, for each metric, what it learned of its count state
``n_total``: which tensor it is, its version counter (bumped by every in-place change) and
whether ``n_total.mean() > 0``. When the metric's ``n_total`` is the same tensor at the same
version as the patch left it, the condition is known on the host. Otherwise (the first
update after construction, ``reset()``, ``.to()``, a load or a sync replaced it) the
condition is read once, together with whether the counts are all zero, in one transfer.
After the update the counts are the old ones plus the batch size, so the condition for the
next update follows on the host: counts that had a positive mean keep one; counts that were
all zero have the batch size in every entry. In the steady state no update reads the device;
results are the release's bit for bit (the condition is the release's, by proof or by
reading it). The functional API and metrics updated on counts the patch has not seen read
as the release does.

Releases: 1.0.0-1.7.3 patched (five implementations of ``_pearson_corrcoef_update``, one of
the class ``update``); 1.7.4+ not needed.
"""
from __future__ import annotations

import weakref
from types import ModuleType
from typing import Any, Callable, Dict, Optional, Tuple

from tmpatch.compiled import ContextSlot
from tmpatch.spec import PATCHED, Edit, Label, Patch, Rewrite, Target, UPSTREAM, Variant, since, span


class _Counts:
    """What one update knows of ``n_total.mean() > 0``: before it (``positive``), and after it (``after``)."""

    __slots__ = ("positive", "after")

    def __init__(self, positive: Optional[bool]) -> None:
        self.positive = positive
        self.after: Optional[bool] = None


#: the counts of the update running in this thread / task (set by the class update)
_current = ContextSlot("tmpatch_pearson")  # a ContextVar; a plain slot while torch.compile traces

#: id(metric) -> (the metric and its n_total tensor, weakly; that tensor's version; n_total.mean() > 0). Keyed
#: by id: a Metric's ``==`` builds a CompositionalMetric, so metrics cannot be dictionary keys
_known: Dict[int, Tuple[Any, Any, int, bool]] = {}


def _forget(key: int, metric: "weakref.ref[Any]") -> None:
    entry = _known.get(key)
    if entry is not None and entry[0] is metric:
        del _known[key]


def _version(t: Any) -> Optional[int]:
    try:
        return int(t._version)
    except (AttributeError, RuntimeError):  # e.g. an inference-mode tensor: no version counter
        return None


def build_update(module: ModuleType) -> Callable[..., Any]:
    """``PearsonCorrCoef.update``: the condition known from the last update, learned for the next."""
    import torch

    tensor_type = torch.Tensor

    def update(original: Callable, self: Any, *args: Any, **kwargs: Any) -> Any:
        counts = getattr(self, "n_total", None)
        entry = _known.get(id(self))
        positive = None
        if entry is not None and entry[0]() is self and isinstance(counts, tensor_type) and entry[1]() is counts:
            version = _version(counts)
            positive = entry[3] if version is not None and version == entry[2] else None
        state = _Counts(positive)
        token = _current.set(state)
        try:
            result = original(self, *args, **kwargs)
        finally:
            _current.reset(token)
        counts = getattr(self, "n_total", None)
        version = _version(counts) if isinstance(counts, tensor_type) else None
        if state.after is not None and version is not None:
            if entry is None or entry[0]() is not self:
                metric = weakref.ref(self)
                weakref.finalize(self, _forget, id(self), metric)
            else:
                metric = entry[0]
            _known[id(self)] = (metric, weakref.ref(counts), version, state.after)
        else:
            _known.pop(id(self), None)
        return result

    return update


def _names(module: ModuleType) -> Dict[str, Any]:
    import torch

    int64 = torch.int64

    def prior_positive(num_prior: Any, preds: Any) -> Any:
        """The release's ``num_prior.mean() > 0``: a host bool when the class update knows it (or
        has it read, with whether the counts are all zero, in one transfer), else the release's tensor."""
        state = _current.get()
        if state is None:
            return num_prior.mean() > 0
        zeros = None
        if state.positive is None:  # one read: 2 * (mean > 0) + (all zero)
            code = int(((num_prior.mean() > 0).to(int64) * 2 + (num_prior == 0).all().to(int64)).item())
            state.positive, zeros = code >= 2, bool(code & 1)
        num_obs = preds.shape[0] if preds.dim() else 1
        if state.positive:
            state.after = True  # every count grows by num_obs >= 0: the mean stays positive
        elif zeros:
            state.after = num_obs > 0  # every count is num_obs
        return state.positive

    return {"_tmpatch_prior_positive": prior_positive}


def _edit(prior: str, obs: Optional[str]) -> Rewrite:
    tail = f" or {obs} == 1" if obs else ""
    return Rewrite((Edit(f"cond = {prior}.mean() > 0{tail}", f"cond = _tmpatch_prior_positive({prior}, preds){tail}"),),
                   _names)


_FUNCTIONAL = "torchmetrics.functional.regression.pearson"

PATCH = Patch(
    name="pearson_update",
    summary="PearsonCorrCoef and ConcordanceCorrCoef read num_prior.mean() > 0 on each update() (before 1.7.4); "
            "the condition is known on the host from the previous update",
    known=since("1.0.0"),
    upstream="fixed upstream in 1.7.4 (an update without the branch)",
    labels=(
        Label(UPSTREAM, "Pearson/Concordance read num_prior.mean() > 0 to choose the update's formulas (fixed upstream "
              "in 1.7.4); the pearson_update patch knows it on the host after the first update of a state",
              function="_pearson_corrcoef_update", op="aten._local_scalar_dense", patch="pearson_update"),
        Label(PATCHED, "pearson_update: the one read of a count state the patch has not seen yet (first update after "
              "construction, reset, a move, a load or a sync)", function="prior_positive"),
    ),
    targets=(
        Target(module=_FUNCTIONAL, qualname="_pearson_corrcoef_update", variants=(
            Variant(span("1.0.0", "1.1.0"), "41180abb19e18973", _edit("n_prior", None)),
            Variant(span("1.1.1", "1.1.2"), "8f2b1c4c75615d9f", _edit("n_prior", "n_obs")),
            Variant(span("1.2.0", "1.3.1"), "c5aedc06ba88923d", _edit("num_prior", "num_obs")),
            Variant(span("1.3.2", "1.5.2"), "0b2a947df1194fe3", _edit("num_prior", "num_obs")),  # dtype of the means
            Variant(span("1.6.0", "1.7.3"), "919ed8b6ba7b5084", _edit("num_prior", "num_obs")),  # annotations
            Variant(span("1.7.4", "1.9.0"), "545b85c1bdb96f65"),  # no branch
        )),
        Target(module="torchmetrics.regression.pearson", qualname="PearsonCorrCoef.update", variants=(
            Variant(span("1.0.0", "1.7.3"), "8d020a8637c87962", build_update),
            Variant(span("1.7.4", "1.9.0"), "6ba256c072d72b0e"),
        )),
    ),
)
