"""perplexity_mask: Perplexity without ignore_index selects no tokens through a mask.

Defect: ``torchmetrics.functional.text.perplexity._perplexity_update`` picks each token's
probability with ``probs[torch.arange(target.numel()), target][mask]``
(``probs[:, target].diagonal()[mask]`` before 1.3.1). Without ``ignore_index`` the mask
is ``torch.ones_like(target, dtype=torch.bool)``, yet the boolean index reads it back to
the host to size its result: one sync on every ``update()`` of Perplexity on CUDA; and
the index ``torch.arange(...)`` is built on the host, so indexing a CUDA ``probs`` with
it copies it to the device first (a blocking copy from pageable memory). Not fixed
upstream (1.9.0 included).

Repair: that statement of the release's function (an edit, :mod:`tmpatch.engine.rewrite`; the
rest runs as released) takes the same probabilities, with the ``arange`` made on
``probs``' device (1.3.1+), and applies the mask only when ``ignore_index`` is given.
Without it the mask keeps every element in order, so the vector summed is the release's,
element for element: results and gradients are the release's bit for bit. Applies to the
functional API too.

Not covered: with ``ignore_index`` the mask drops tokens and the release sums the
log-probabilities of the kept ones, a vector whose length is data-dependent. Summing a
zero-filled vector of fixed length instead would change the floating-point summation
order (last-bit differences), so the release's selection is kept (one sync per update);
so is its ``torch.tensor(0, device=...)`` copy in the ``target.where(...)`` before it (a
host value made a device tensor, not this patch's).

Releases: 0.10.0-1.9.0 (four implementations of ``_perplexity_update``: ``F.softmax``
before 1.2.1, the ``arange`` pick from 1.3.1, annotations from 1.6.0).
"""
from __future__ import annotations

from tmpatch.spec import PATCHED, Edit, Label, Patch, Rewrite, Target, Variant, since, span

_MASKED = "if ignore_index is not None:\n    probs = probs[mask]\n"

#: before 1.3.1
DIAGONAL = Rewrite((Edit("probs = probs[:, target].diagonal()[mask]",
                         "probs = probs[:, target].diagonal()\n" + _MASKED),))
#: 1.3.1+
ARANGE = Rewrite((Edit("probs = probs[torch.arange(target.numel()), target][mask]",
                       "probs = probs[torch.arange(target.numel(), device=probs.device), target]\n" + _MASKED),))

PATCH = Patch(
    name="perplexity_mask",
    summary="Perplexity selects every token through an all-True boolean mask (and indexes with a host arange) "
            "on each update() without ignore_index; the mask is applied only with ignore_index",
    known=since("0.10.0"),
    upstream="not fixed upstream (probs[...][mask] in _perplexity_update)",
    labels=(
        Label(PATCHED, "Perplexity selects the tokens' probabilities through a boolean mask; without ignore_index "
              "the perplexity_mask patch drops the (all-True) mask, with ignore_index the release's selection "
              "stays (a fixed-length sum would round differently)",
              function="_perplexity_update", op="aten.index", kind="data-dependent shape"),
    ),
    targets=(
        Target(
            module="torchmetrics.functional.text.perplexity",
            qualname="_perplexity_update",
            variants=(
                Variant(span("0.10.0", "1.2.0"), "d1fb08187dfdae50", DIAGONAL),
                Variant(span("1.2.1", "1.3.0.post0"), "8cc8ed40494c1552", DIAGONAL),  # torch.nn.functional.softmax
                Variant(span("1.3.1", "1.5.2"), "c9a0e040dc5c67ff", ARANGE),
                Variant(span("1.6.0", "1.9.0"), "83fbf22ca38fa280", ARANGE),  # annotations
            ),
        ),
    ),
)
