"""scalar_tensors: counts and fill values made on the device, not copied from the host, in update().

Defect: several update functions turn a Python number into a device tensor with
``torch.tensor(n, device=...)``: the number is written in host memory and copied to the
device, a blocking host-to-device copy on every ``update()``:

* ``_multiclass_exact_match_update`` / ``_multilabel_exact_match_update`` (the sample count):
  MulticlassExactMatch, MultilabelExactMatch;
* ``_binary_hinge_loss_update`` / ``_multiclass_hinge_loss_update`` (the sample count):
  BinaryHingeLoss, MulticlassHingeLoss;
* ``_multilabel_ranking_average_precision_update`` (the score's initial 0.0):
  MultilabelRankingAveragePrecision;
* ``_log_cosh_error_update``, ``_tweedie_deviance_score_update`` (the observation count):
  LogCoshError, TweedieDevianceScore;
* ``_perplexity_update`` (the 0 that replaces ``ignore_index``): Perplexity with ``ignore_index``.

Not fixed upstream (1.9.0 included).

Repair: in each function the one statement is edited (:mod:`tmpatch.engine.rewrite`; the rest is
the release's code) to build the same tensor with :func:`tmpatch.runtime.device_tensors.device_tensor`:
``torch.full`` with ``torch.tensor``'s dtype (int64 for a count, the default float dtype
for 0.0), which hands the number to a fill kernel instead of copying it. Same tensor, bit
for bit, on every input; on the CPU ``torch.tensor`` itself runs. Only these statements
change: the boolean-mask selections of the hinge losses and Perplexity and the
per-sample loop of ranking average precision are other syncs (other patches' business).

Releases: 0.10.0-1.9.0 (two to five implementations of each function, differing in
annotations, argument names and code around the statement, which is the same in all;
ExactMatch and LogCoshError from 0.11.0).
"""
from __future__ import annotations

from types import ModuleType
from typing import Any, Dict, Optional, Tuple

from tmpatch.runtime.device_tensors import built, swap
from tmpatch.spec import PATCHED, Edit, Label, Patch, Releases, Rewrite, Target, Variant, since, span


def _names(module: ModuleType) -> Dict[str, Any]:
    return {"_tmpatch_tensor": built()[0]}


def _made_on_device(*statements: str) -> Rewrite:
    """The release's statements, their ``torch.tensor(`` made on the device."""
    return Rewrite(tuple(Edit(s, swap(s)) for s in statements), _names)


def _target(module: str, qualname: str, rewrite: Rewrite, *variants: Tuple[Any, str],
            present: Optional[Releases] = None) -> Target:
    return Target(module=module, qualname=qualname, present=present,
                  variants=tuple(Variant(releases, fingerprint, rewrite) for releases, fingerprint in variants))


#: ExactMatch and LogCoshError came in 0.11.0
_SINCE_0_11 = since("0.11.0")


_CLS = "torchmetrics.functional.classification"
_REG = "torchmetrics.functional.regression"

EXACT_MC = _made_on_device(
    'total = torch.tensor(preds.shape[0] if multidim_average == "global" else 1, device=correct.device)')
EXACT_ML = _made_on_device(
    'total = torch.tensor(preds.shape[0 if multidim_average == "global" else 2], device=correct.device)')
HINGE = _made_on_device("total = tensor(target.shape[0], device=target.device)")
RANKING = _made_on_device("score = torch.tensor(0.0, device=neg_preds.device)")
LOG_COSH_OLD = _made_on_device("n_obs = torch.tensor(target.shape[0], device=preds.device)")
LOG_COSH = _made_on_device("num_obs = torch.tensor(target.shape[0], device=preds.device)")
TWEEDIE = _made_on_device("num_observations = torch.tensor(torch.numel(deviance_score), device=preds.device)")
PERPLEXITY = _made_on_device(
    "target = target.where(target != ignore_index, torch.tensor(0, device=target.device))")

PATCH = Patch(
    name="scalar_tensors",
    summary="exact match, hinge losses, ranking average precision, LogCosh, Tweedie and Perplexity copy a "
            "Python number to the device (torch.tensor(n, device=...)) on each update(); made with torch.full",
    known=since("0.10.0"),
    upstream="not fixed upstream (torch.tensor(n, device=...) in the update functions)",
    labels=(
        Label(PATCHED, "a Python number made into a device tensor with torch.tensor(n, device=...) (a host-to-device "
              "copy); the scalar_tensors patch makes it with torch.full",
              function=r"_multi(class|label)_exact_match_update|_(binary|multiclass)_hinge_loss_update"
                       r"|_multilabel_ranking_average_precision_update|_log_cosh_error_update"
                       r"|_tweedie_deviance_score_update|_perplexity_update",
              op="aten._to_copy", kind="host-to-device copy"),
    ),
    targets=(
        _target(f"{_CLS}.exact_match", "_multiclass_exact_match_update", EXACT_MC,
                (span("0.11.0", "0.11.4"), "001c99f9c4954646"),  # no ignore_index
                (span("1.0.0", "1.5.2"), "2358230ade9f742f"),
                (span("1.6.0", "1.9.0"), "d423e48b37f22df3"),  # annotation only
                present=_SINCE_0_11),
        _target(f"{_CLS}.exact_match", "_multilabel_exact_match_update", EXACT_ML,
                (span("0.11.0", "1.5.2"), "44c90d22be464f91"),
                (span("1.6.0", "1.7.1"), "272dbac4c17e90c3"),  # annotation only
                (span("1.7.2", "1.9.0"), "d107ccc8ff4e78eb"),  # adds ignore_index
                present=_SINCE_0_11),
        _target(f"{_CLS}.hinge", "_binary_hinge_loss_update", HINGE,
                (span("0.10.0", "1.5.2"), "2bc2c5cb531c3ebe"),
                (span("1.6.0", "1.9.0"), "57173fb842f5317e")),  # annotation only
        _target(f"{_CLS}.hinge", "_multiclass_hinge_loss_update", HINGE,
                (span("0.10.0", "0.11.4"), "b541019da8727504"),  # the softmax check spelled ``(0 <= preds)``
                (span("1.0.0", "1.5.2"), "33c74dc57b3e4076"),
                (span("1.6.0"), "95aff742e3e21d24"),  # annotation only
                (span("1.6.1", "1.9.0"), "c997d47e3a34048f")),  # normalize_logits_if_needed
        _target(f"{_CLS}.ranking", "_multilabel_ranking_average_precision_update", RANKING,
                (span("0.10.0", "0.11.4"), "e4d18341fe1424c4"),  # ``score_idx = 1.0``
                (span("1.0.0", "1.1.2"), "da8e63d13b753d59"),
                (span("1.2.0", "1.5.2"), "1e40233313c3f416"),  # variable names
                (span("1.6.0", "1.9.0"), "da10fee94481bf11")),  # annotation only
        Target(module=f"{_REG}.log_cosh", qualname="_log_cosh_error_update", variants=(
            Variant(span("0.11.0", "1.1.2"), "8d47d31e70814030", LOG_COSH_OLD),
            Variant(span("1.2.0", "1.5.2"), "b8abc7ff9a4e4d88", LOG_COSH),  # variable names
            Variant(span("1.6.0", "1.9.0"), "69636cc2878e1d4b", LOG_COSH),  # annotation only
        ), present=_SINCE_0_11),
        _target(f"{_REG}.tweedie_deviance", "_tweedie_deviance_score_update", TWEEDIE,
                (span("0.10.0", "1.5.2"), "f5e302d79c8e37f4"),
                (span("1.6.0", "1.9.0"), "78fa6f04f141e40d")),  # annotation only
        _target("torchmetrics.functional.text.perplexity", "_perplexity_update", PERPLEXITY,
                (span("0.10.0", "1.2.0"), "d1fb08187dfdae50"),
                (span("1.2.1", "1.3.0.post0"), "8cc8ed40494c1552"),
                (span("1.3.1", "1.5.2"), "c9a0e040dc5c67ff"),
                (span("1.6.0", "1.9.0"), "83fbf22ca38fa280")),
    ),
)
