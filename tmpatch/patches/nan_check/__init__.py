"""nan_check: the aggregators' NaN check without a device read during ``update()``.

Defect: ``BaseAggregator._cast_and_nan_check_input`` runs
``if nans.any() or nans_weight.any():`` on every ``update()`` of SumMetric,
MeanMetric, MaxMetric, MinMetric, CatMetric and the Running wrappers
(RunningMean, RunningSum): a device-to-host read per step, on every release.
Its ``ignore``/``warn`` paths remove NaN with a boolean mask (a data-dependent
shape, a second sync) and its imputation writes into the caller's tensors.
Python scalars (``update(3.5)``) are copied from the host. Not fixed upstream
(1.6.2 added the opt-out ``nan_strategy="disable"``; #3434 is its weight bug).

Releases: 0.10.0-1.9.0, seven implementations (0.10.0-0.11.4 | 1.0.0 | 1.0.1-1.2.0 |
1.2.1-1.3.1 | 1.3.2-1.5.2 | 1.6.0-1.6.1 | 1.6.2-1.9.0). 0.10-0.11 check as 1.0.0 does
but warn with ``warnings.warn`` on every rank (no ``rank_zero_warn``): so does the
report. Aggregators whose ``update`` is not one of the five above keep the release's code.

Behaviour (policy ``TMPATCH_NAN_CHECK`` / ``apply(nan_check=...)``: ``deferred``,
the default; ``eager``; ``off``):

* on the CPU, ``ignore``/``warn``/``error`` run the release's own check (a read of a host
  value is no sync): its values bit for bit, its warning from its own statement (words,
  category, file, module, rank rule), its error from the same call, a removed NaN without
  its graph. ``eager`` runs the release's check everywhere, its syncs included;
* a float strategy imputes NaN with ``torch.where`` in the input's dtype, then casts,
  as the release does: the value its write (``x[nans] = strategy``) stores in that
  dtype (an integer input: truncated). Where torch refuses to store it there (out of
  an integer's range; out of a float's on torch before 2.6 and from 2.15 on), the
  update raises torch's own error as the release does, once a NaN is there (a device
  read, for such a value only). An imputed element gets weight 1, the others keep theirs;
* on a device, ``ignore``/``warn``/``error`` neutralise NaN elements (Sum 0, Mean weight 0,
  Max -inf, Min +inf): the state is the one the removal gives, with no sync. CatMetric
  still removes them (its output's size depends on the data: one inherent sync).
  ``warn``/``error`` are deferred (through the ``deferred_reports`` patch): the warning
  comes in the release's words alone, through the release's own ``rank_zero_warn`` (its
  file, module and rank rule), what tmpatch adds (the metric, how many updates, where it
  is given) to the ``tmpatch`` logger at INFO; the error with the release's words first,
  then that note. ``off``: not at all;
* ``disable`` (1.6.2+): no check, a user-supplied weight is honoured (#3434).

Deliberate corrections: the caller's tensors are never written into; imputed
elements get weight 1 (upstream: the whole batch's weight becomes the imputed value
up to 1.6.1 — a NaN mean with the default weight — and collapses to 1 from 1.6.2);
an imputed element passes no gradient (upstream: the caller's tensor is overwritten
under no_grad). On a device, removed and neutralised elements give the same states up to
float summation order; so does a MeanMetric weight that broadcasts to the value's shape (a
scalar, or fewer dimensions), even without NaN: neutralising per element materialises it, and
its total is summed over a full tensor where the release sums the broadcast view (last bits
only); up to 1.0.0, where the release checks a Mean's value and weight in two calls, an element
whose weight alone is NaN is left out with its value (the release's shapes no longer match).

The package: ``check.py`` builds the replacement per release; ``report.py`` gives the
release's warning or error at ``compute()``.
"""
from __future__ import annotations

from tmpatch.patches.nan_check.check import _build_check
from tmpatch.patches.nan_check.report import RECORD, _Release
from tmpatch.spec import INHERENT, PATCHED, Label, Patch, Target, Variant, since, span

__all__ = ["PATCH", "RECORD"]

_R010 = _Release(one_argument=True, spelling="Encounted", metric_dtype=False, disable=False, rank_zero=False)
_R100 = _Release(one_argument=True, spelling="Encounted", metric_dtype=False, disable=False)
_R101 = _Release(one_argument=False, spelling="Encounted", metric_dtype=False, disable=False)
_R121 = _Release(one_argument=False, spelling="Encountered", metric_dtype=False, disable=False)
_R132 = _Release(one_argument=False, spelling="Encountered", metric_dtype=True, disable=False)
_R162 = _Release(one_argument=False, spelling="Encountered", metric_dtype=True, disable=True)

PATCH = Patch(
    name="nan_check",
    summary="the aggregators' NaN check reads the device on every update() (and removes NaN with a boolean "
            "index); Python scalars are copied from the host",
    known=since("0.10.0"),
    upstream="not fixed upstream (1.6.2 added nan_strategy='disable'); corrects #3434",
    changes="on the CPU ignore/warn/error are the release's own check; on a GPU warn/error come once, "
            "from a later update() or compute(), in the release's words (the metric and the number of "
            "updates with NaN to the tmpatch logger); "
            "the caller's tensors are never written into; an imputed element gets weight 1",
    requires=("deferred_reports",),
    labels=(
        Label(INHERENT, "CatMetric drops NaN elements: its output size depends on the values",
              function="check", file="tmpatch/patches/nan_check/check.py"),
        Label(PATCHED, "NaN check `if nans.any()` in _cast_and_nan_check_input; fixed by the nan_check patch",
              function="_cast_and_nan_check_input", file="torchmetrics/aggregation.py"),
    ),
    targets=(
        Target(
            module="torchmetrics.aggregation",
            qualname="BaseAggregator._cast_and_nan_check_input",
            variants=(
                Variant(span("0.10.0", "0.11.4"), "1666fc7f2f21aa62", _build_check(_R010)),
                Variant(span("1.0.0"), "d10df440b4c4be78", _build_check(_R100)),
                Variant(span("1.0.1", "1.2.0"), "e9b5bcdbb4309ef8", _build_check(_R101)),
                Variant(span("1.2.1", "1.3.1"), "0c46b319aa83b2ec", _build_check(_R121)),
                Variant(span("1.3.2", "1.5.2"), "57f5be5ee23c9bcd", _build_check(_R132)),
                Variant(span("1.6.0", "1.6.1"), "e6752bb759da4d33", _build_check(_R132)),
                Variant(span("1.6.2", "1.9.0"), "17015515ea47b4b2", _build_check(_R162)),
            ),
        ),
    ),
)
