"""pearson_update: PearsonCorrCoef and ConcordanceCorrCoef decide their update's branch without reading the device.

Defect: before 1.7.4, ``_pearson_corrcoef_update`` starts with ``cond = num_prior.mean() > 0
or num_obs == 1`` (``n_prior.mean() > 0`` before 1.1.1) and runs ``if cond:`` twice: a
Python ``or`` / ``if`` on a device value, one read on every ``update()`` of
PearsonCorrCoef and ConcordanceCorrCoef. Fixed upstream in 1.7.4 (a new update without
the branch).

Repair: the branch stays the release's; what changes is how its condition is known. The
patch keeps, for each metric, what it knows of its count state ``n_total`` (and of that
state's registered default): which tensor it is, its version counter (bumped by every
in-place change), whether ``n_total.mean() > 0`` and whether every count is zero. When the
metric's ``n_total`` is the same tensor at the same version, the condition is known on the
host. It is learned without a read:

* at construction (``PearsonCorrCoef.__init__``): the release registers zeros;
* across ``Module._apply`` with a function that moves or casts values unchanged (``.to()``,
  ``.cuda()``, ``.cpu()``, ``.float()``, ...; ``spec.VALUE_MOVE``): zeros stay zeros. Counts
  on the CPU before the move (a copy or a load made there) are read from their bytes, free;
* at ``reset()``: the counts become a copy of the default, zeros while the default is
  the one known;
* in ``forward()``: the states it saves before the batch's own update (copies, from 1.4.0:
  ``Metric._copy_state_dict``) and puts back after it are the counts known (the last three
  count tensors of a metric are remembered);
* after each update: the counts are the old ones plus the batch size, so counts with a
  positive mean keep one, and all-zero counts hold the batch size everywhere.

Otherwise (a load, a merge, a sync or a copy on the device, a move by another function) the
first update reads the condition once, with whether the counts are all zero, in one transfer. Results
are the release's bit for bit (the condition is the release's, by proof or by reading it).
The functional API reads as the release does.

Releases: 0.10.0-0.11.4 not needed (an update without the branch: no read); 1.0.0-1.7.3
patched (five implementations of ``_pearson_corrcoef_update``, one of the class ``update``
and of its ``__init__``, two of ``Metric._apply``, ``Metric.reset`` and
``Metric._copy_state_dict``); 1.7.4+ not needed.
"""
from __future__ import annotations

from tmpatch.patches.pearson_update.knowledge import CLASS_MODULE
from tmpatch.patches.pearson_update.wrappers import (
    build_apply,
    build_copy_state,
    build_init,
    build_reset,
    build_update,
    edit,
)
from tmpatch.spec import PATCHED, UPSTREAM, Decline, Label, Patch, Target, Together, Variant, since, span

__all__ = ["PATCH"]

_FUNCTIONAL = "torchmetrics.functional.regression.pearson"
_METRIC = "torchmetrics.metric"

PATCH = Patch(
    name="pearson_update",
    summary="PearsonCorrCoef and ConcordanceCorrCoef read num_prior.mean() > 0 on each update() (before 1.7.4); "
            "the condition is known on the host (from construction, reset, moves and the previous update)",
    known=since("0.10.0"),
    declines=(Decline(span("0.10.0", "0.11.4"), "nothing to repair: the update of 0.10-0.11 has no branch on the "
                      "counts (no read; the branch came in 1.0.0)", needed=False),),
    upstream="fixed upstream in 1.7.4 (an update without the branch)",
    labels=(
        Label(UPSTREAM, "Pearson/Concordance read num_prior.mean() > 0 to choose the update's formulas (fixed upstream "
              "in 1.7.4); the pearson_update patch knows it on the host after the first update of a state",
              function="_pearson_corrcoef_update", op="aten._local_scalar_dense", patch="pearson_update"),
        Label(PATCHED, "pearson_update: the one read of a count state the patch does not know (first update after "
              "a load, a merge, a sync, a copy or a move by a function other than .to()/.cuda()/...)",
              function="prior_positive"),
    ),
    together=(Together("what the update knows of its counts is learned in the others"),),
    targets=(
        Target(module=_FUNCTIONAL, qualname="_pearson_corrcoef_update", variants=(
            Variant(span("1.0.0", "1.1.0"), "41180abb19e18973", edit("n_prior", None)),
            Variant(span("1.1.1", "1.1.2"), "8f2b1c4c75615d9f", edit("n_prior", "n_obs")),
            Variant(span("1.2.0", "1.3.1"), "c5aedc06ba88923d", edit("num_prior", "num_obs")),
            Variant(span("1.3.2", "1.5.2"), "0b2a947df1194fe3", edit("num_prior", "num_obs")),  # dtype of the means
            Variant(span("1.6.0", "1.7.3"), "919ed8b6ba7b5084", edit("num_prior", "num_obs")),  # annotations
            Variant(span("1.7.4", "1.9.0"), "545b85c1bdb96f65"),  # no branch
        )),
        Target(module=CLASS_MODULE, qualname="PearsonCorrCoef.update", variants=(
            Variant(span("1.0.0", "1.7.3"), "8d020a8637c87962", build_update),
            Variant(span("1.7.4", "1.9.0"), "6ba256c072d72b0e"),
        )),
        Target(module=CLASS_MODULE, qualname="PearsonCorrCoef.__init__", variants=(
            Variant(span("1.0.0", "1.7.3"), "47872fd86cbb4e32", build_init),
            Variant(span("1.7.4", "1.9.0"), "581c7b29ceb7a50e"),
        )),
        # the base class's, shared with every metric: needed where the release's update has the branch
        Target(module=_METRIC, qualname="Metric._apply", variants=(
            Variant(span("1.0.0", "1.2.1"), "230dda1bf62c7927", build_apply),
            Variant(span("1.3.0.post0", "1.7.3"), "232b818f8abf487b", build_apply),
        ), present=span("1.0.0", "1.7.3"), shared=True),
        Target(module=_METRIC, qualname="Metric._copy_state_dict", variants=(  # 1.4.0+: forward() saves copies
            Variant(span("1.4.0", "1.5.2"), "73e63836d7516ab5", build_copy_state),
            Variant(span("1.6.0", "1.7.3"), "6961ae938cd19538", build_copy_state),  # annotations
        ), present=span("1.4.0", "1.7.3"), shared=True),
        Target(module=_METRIC, qualname="Metric.reset", variants=(
            Variant(span("1.0.0", "1.3.2"), "718dd05530d14777", build_reset),
            Variant(span("1.4.0", "1.7.3"), "26a400138ffbd9ed", build_reset),
        ), present=span("1.0.0", "1.7.3"), shared=True),
    ),
)

