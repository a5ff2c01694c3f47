"""bincount: counting updates without ``torch.bincount``'s device read or boolean removals.

Defect: on CUDA, ``torch.bincount`` reads the input's minimum and maximum back to the
host to size its output (two syncs per call), and ``torchmetrics.utilities.data._bincount``
runs on every ``update()`` of multiclass stat scores (Accuracy, Precision, Recall, F1,
FBeta, Specificity, HammingDistance, NegativePredictiveValue, StatScores with
``top_k=1``, ``"global"``, ``average`` not ``"micro"``), of the binary, multiclass and
multilabel confusion matrices (and CohenKappa, JaccardIndex, MatthewsCorrCoef) and of
binned precision-recall curves (and AUROC, AveragePrecision, ROC and the X-at-fixed-Y
metrics). With ``ignore_index`` the same updates remove ignored positions with a
boolean index (a sync each); the multilabel ones do so even without it. In
deterministic mode upstream counts with an N x minlength mesh instead. Not fixed
upstream (1.9.0 included).

Repair, without a copy of the release's code (the release's functions run, wrapped,
and the statements that remove ignored positions or make the codes are edited:
``tmpatch.engine.rewrite``), in no more kernels than the release's update launches:

* ``metrics.py``: the class ``update`` marks a *recorded update* (a metric with a
  deferred-report book; binned curves only);
* ``formatters.py``: the formatters' removal of ignored positions becomes two
  selections (their target -1);
* ``updates.py``: the statements that make the codes make the release's codes (its
  arithmetic in one op where it can), clamped to one past each end of the bins, and codes
  past the bins for the positions the release removed (ignored ones); the loops of large
  curves are handed inputs whose removed positions count a fixed value, taken off;
* ``counting.py``: ``_bincount`` counts into ``minlength`` bins on the device (an
  out-of-place ``put``; the codes outside the bins wrap into spare bins), and the deferred
  reports, in the release's words.

Invalid values — a target or label prediction outside the valid classes — are the
release's. On the CPU (``tmpatch.runtime.host``) the release's update runs (no sync to save
there): its counts (an invalid class in the cell its code lands in), its errors, raised by its
own statement in the same call of the same metric (a metric of a MetricCollection included);
in deterministic mode, where the release's ``_bincount`` counts with an N x minlength mesh, an
update whose classes are all valid is recorded and counted plainly (the same states), any
other is the release's. On a device the recorded update makes the release's codes and counts
every code the release's ``_bincount`` counts (one in ``[0, minlength)`` in its bin, as
``torch.bincount`` does); only what would make the release raise is deferred, to the next
settle point (``deferred_reports``: a later update, ``compute()``, ``reset()``, ...): a negative
code (``torch.bincount``'s error; multilabel updates remove negative codes first, as the
release does), a code past the bins (the release's ``reshape`` error), a class the multiclass
curves' ``one_hot`` refuses (its error; that row left out of the counts). Such an error is a
RuntimeError whose message is the release's, then tmpatch's note; the ``reshape``'s message
names the count's length only as "larger than" the bins (the release's length is its largest
code + 1, not known without a read). In deterministic mode, on MPS and with torch_xla installed
the release's mesh drops codes outside the bins silently: so does the recorded update (the
``one_hot`` error excepted, which comes before the count). Unlike the release, a deferred error
comes after the bad batch's in-range codes were counted (as every deferred report's:
``reset()`` discards them). ``TMPATCH_BINCOUNT=eager`` keeps the release's update throughout.
Not covered (the release's code runs): the functional API,
compute-time callers, metrics built before ``apply()``, unbinned curves (their states
keep the values), stat scores with ``top_k > 1`` or ``"samplewise"`` (no removal, no
``_bincount``), multiclass metrics built with ``num_classes=None`` but for the micro average of
top-1 global stat scores (the release's one use of it, 1.9.0: there no class is invalid, and the
ignored positions are left out without a removal). The formatters' logits check before 1.6.1 is
``logits_check``'s edit of the same functions.

Releases: 1.0.0-1.9.0 (four implementations of ``_bincount``, of
``_multiclass_stat_scores_update``, up to four of each formatter and update function).
"""
from __future__ import annotations

from typing import Optional

from tmpatch.patches.bincount import counting, formatters, metrics, updates
from tmpatch.spec import INHERENT, PATCHED, Label, Patch, Releases, Target, Together, Variant, since, span

_DATA = "torchmetrics.utilities.data"
_STAT = "torchmetrics.classification.stat_scores"
_STAT_FN = "torchmetrics.functional.classification.stat_scores"
_CONFUSION = "torchmetrics.classification.confusion_matrix"
_CONFUSION_FN = "torchmetrics.functional.classification.confusion_matrix"
_CURVE = "torchmetrics.classification.precision_recall_curve"
_CURVE_FN = "torchmetrics.functional.classification.precision_recall_curve"


def _one(module: str, qualname: str, *variants: Variant, present: Optional[Releases] = None) -> Target:
    return Target(module=module, qualname=qualname, variants=variants, present=present)


#: the curves' ``_vectorized`` helpers came in 1.0.0 (0.10-0.11 make their codes in the update function)
_SINCE_1_0 = since("1.0.0")


PATCH = Patch(
    name="bincount",
    summary="CUDA torch.bincount reads min and max to size its output, and ignore_index removes positions with a "
            "boolean index, in every multiclass stat-score, confusion-matrix and binned-curve update",
    known=since("0.10.0"),
    upstream="not fixed upstream (ATen's CUDA bincount sizes its output from the data)",
    changes="on a GPU, where a target or label prediction outside the valid classes makes the release raise in "
            "update(), the release's error is raised later (a later update() or compute()), the batch's codes "
            "in the bins counted; on the CPU the release's update",
    requires=("deferred_reports",),
    labels=(
        Label(PATCHED, "CUDA torch.bincount reads the input's min and max to size its output; the bincount "
              "patch counts into fixed-size bins instead", function="_bincount", op="aten.bincount"),
        Label(PATCHED, "ignore_index: ignored positions dropped by a boolean index before counting; the bincount "
              "patch leaves them out of the counts instead",
              function=r"_multiclass_stat_scores_update|_(binary|multiclass)_confusion_matrix_format"
                       r"|_multilabel_(confusion_matrix|precision_recall_curve)_update",
              op="aten.index"),
        Label(INHERENT, "ignore_index: ignored positions dropped by a boolean index; inherent where the states keep "
              "the values (thresholds=None); the bincount patch leaves them out of binned counts",
              function=r"_(binary|multiclass)_precision_recall_curve_format", op="aten.index", patch="bincount"),
    ),
    together=(
        Together("the codes they make for the positions left out are counted only by its fixed bins",
                 on=("_bincount",)),
        Together("the update is recorded only where the functions it counts with are repaired",
                 targets=("MulticlassStatScores.update",), on=("_multiclass_stat_scores_update",)),
        *(Together("the update is recorded only where the functions it counts with are repaired",
                   targets=(f"{task.capitalize()}ConfusionMatrix.update",),
                   on=tuple(f"_{task}_confusion_matrix_{part}" for part in parts))
          for task, parts in (("binary", ("format", "update")), ("multiclass", ("format", "update")),
                              ("multilabel", ("update",)))),
        *(Together("the update is recorded only where the functions it counts with are repaired",
                   targets=(f"{task.capitalize()}PrecisionRecallCurve.update",),
                   on=tuple(f"_{task}_precision_recall_curve_{part}" for part in parts))
          for task, parts in (("binary", ("format", "update", "update_vectorized")),
                              ("multiclass", ("format", "update", "update_vectorized")),
                              ("multilabel", ("update",)))),
    ),
    targets=(
        _one(_DATA, "_bincount",
             Variant(span("0.10.0", "0.10.1"), "016a48b9a02499bf", counting.build_bincount),  # index_add_: no read
             Variant(span("0.10.2", "0.10.3"), "66c3170c0b5a54cc", counting.build_bincount),
             Variant(span("0.11.0", "0.11.1"), "c92d9358832e09c8", counting.build_bincount),
             Variant(span("0.11.2", "1.2.0"), "4d98ca107ae254e1", counting.build_bincount),
             Variant(span("1.2.1", "1.5.2"), "92377986ae8ac6c4", counting.build_bincount),
             Variant(span("1.6.0"), "3b01983d96015e74", counting.build_bincount),
             Variant(span("1.6.1", "1.9.0"), "844aca9a5b9bef1c", counting.build_bincount)),
        # multiclass stat scores (Accuracy, Precision, Recall, F1, ... inherit update)
        _one(_STAT, "MulticlassStatScores.update",
             Variant(span("0.10.0", "0.10.1"), "22c72aac5b6c829b", metrics.build_update),
             Variant(span("0.10.2", "1.6.1"), "e1900853e6588990", metrics.build_update),
             Variant(span("1.6.2", "1.9.0"), "ef20a94ad2300515", metrics.build_update)),
        _one(_STAT_FN, "_multiclass_stat_scores_update",
             Variant(span("0.10.0", "0.10.1"), "510b7c36d53a010d", updates.STAT_SCORES_0_10),  # no ``average``
             Variant(span("0.10.2", "0.10.3"), "2c5218729c57dee6", updates.STAT_SCORES_0),
             Variant(span("0.11.0", "0.11.2"), "1373153984c6b5d8", updates.STAT_SCORES_0),
             Variant(span("0.11.3"), "2b36b540bd19e833", updates.STAT_SCORES),
             Variant(span("0.11.4", "1.0.2"), "8f90619f8a069199", updates.STAT_SCORES),
             Variant(span("1.0.3", "1.5.2"), "cc69b1446ba8ac1d", updates.STAT_SCORES),
             Variant(span("1.6.0"), "802f14a7fbdad54a", updates.STAT_SCORES),
             Variant(span("1.6.1", "1.9.0"), "3ea2f317da52f574", updates.STAT_SCORES)),
        # confusion matrices (CohenKappa, JaccardIndex, MatthewsCorrCoef inherit update)
        _one(_CONFUSION, "BinaryConfusionMatrix.update",
             Variant(span("0.10.0", "1.9.0"), "b2f754606cd4e4a6", metrics.build_update)),
        _one(_CONFUSION, "MulticlassConfusionMatrix.update",
             Variant(span("0.10.0", "1.9.0"), "23bef959df184b10", metrics.build_update)),
        _one(_CONFUSION, "MultilabelConfusionMatrix.update",
             Variant(span("0.10.0", "1.9.0"), "3f3b42ba24e9f8d1", metrics.build_update)),
        _one(_CONFUSION_FN, "_binary_confusion_matrix_format",
             Variant(span("0.10.0", "0.11.4"), "896740cf48f4bf7a", formatters.KEEP_IGNORED),
             Variant(span("1.0.0", "1.5.2"), "af734a55585421c7", formatters.KEEP_IGNORED),
             Variant(span("1.6.0"), "b7af5997d4875998", formatters.KEEP_IGNORED),
             Variant(span("1.6.1", "1.9.0"), "bf379e83297ca7a2", formatters.KEEP_IGNORED)),
        _one(_CONFUSION_FN, "_multiclass_confusion_matrix_format",
             Variant(span("0.10.0", "0.10.3"), "f3f9f93e03cf91f1", formatters.KEEP_IGNORED),
             Variant(span("0.11.0", "0.11.4"), "f17b1bdbbc7dc41b", formatters.KEEP_IGNORED),
             Variant(span("1.0.0", "1.5.2"), "c739e24d7cdc0801", formatters.KEEP_IGNORED),
             Variant(span("1.6.0", "1.9.0"), "a2ca606903c4d0d0", formatters.KEEP_IGNORED)),
        _one(_CONFUSION_FN, "_binary_confusion_matrix_update",
             Variant(span("0.10.0", "1.9.0"), "77c56c52094d11cf", updates.BINARY_CONFUSION)),
        _one(_CONFUSION_FN, "_multiclass_confusion_matrix_update",
             Variant(span("0.10.0", "0.11.2"), "70e27fac71b0ca99", updates.MULTICLASS_CONFUSION_0),
             Variant(span("0.11.3", "1.9.0"), "ca9e3e1c27758b54", updates.MULTICLASS_CONFUSION)),
        _one(_CONFUSION_FN, "_multilabel_confusion_matrix_update",
             Variant(span("0.10.0", "1.9.0"), "4997f253d2970f13", updates.MULTILABEL_CONFUSION)),
        # binned precision-recall curves (AUROC, AveragePrecision, ROC, EER, LogAUC, the X-at-fixed-Y
        # metrics inherit update)
        _one(_CURVE, "BinaryPrecisionRecallCurve.update",
             Variant(span("0.10.0", "0.11.4"), "51685505879283bc", metrics.build_curve_update),  # no docstring
             Variant(span("1.0.0", "1.8.0"), "02674c77bed29aef", metrics.build_curve_update),
             Variant(span("1.8.1", "1.9.0"), "6814eb8e7e5368ef", metrics.build_curve_update)),
        _one(_CURVE, "MulticlassPrecisionRecallCurve.update",
             Variant(span("0.10.0", "0.11.4"), "70524fae1dc0f4a7", metrics.build_curve_update),
             Variant(span("1.0.0", "1.2.1"), "1778e31925cf6aec", metrics.build_curve_update),
             Variant(span("1.3.0.post0", "1.9.0"), "cf35778178fa22b0", metrics.build_curve_update)),
        _one(_CURVE, "MultilabelPrecisionRecallCurve.update",
             Variant(span("0.10.0", "0.11.4"), "9444bcd1be9cd350", metrics.build_curve_update),
             Variant(span("1.0.0", "1.9.0"), "7c78b38bb4cbe80d", metrics.build_curve_update)),
        _one(_CURVE_FN, "_binary_precision_recall_curve_format",
             Variant(span("0.10.0", "0.11.4"), "2dc49c3a43576242", formatters.KEEP_IGNORED),
             Variant(span("1.0.0", "1.5.2"), "d99368eaf7778d5e", formatters.KEEP_IGNORED),
             Variant(span("1.6.0"), "1f4443f231459b23", formatters.KEEP_IGNORED),
             Variant(span("1.6.1", "1.8.0"), "9f54bb81bb7cf5f9", formatters.KEEP_IGNORED),
             Variant(span("1.8.1", "1.9.0"), "c45424650b499165", formatters.KEEP_IGNORED)),
        _one(_CURVE_FN, "_multiclass_precision_recall_curve_format",
             Variant(span("0.10.0", "0.11.4"), "63fd914eefdd8ab2", formatters.KEEP_IGNORED),
             Variant(span("1.0.0", "1.2.1"), "98924752dc1c3649", formatters.KEEP_IGNORED),
             Variant(span("1.3.0.post0", "1.5.2"), "25f9956419d1a656", formatters.KEEP_IGNORED_AND_CLASSES),
             Variant(span("1.6.0"), "337b4951bfd9a238", formatters.KEEP_IGNORED_AND_CLASSES),
             Variant(span("1.6.1", "1.9.0"), "c5e8c0f7be88df8e", formatters.KEEP_IGNORED_AND_CLASSES)),
        _one(_CURVE_FN, "_binary_precision_recall_curve_update",
             # 0.10-0.11: the codes made here (no ``_vectorized`` helper, no loop): the edit, not the wrapper
             Variant(span("0.10.0", "0.11.4"), "b05c7843216758f8", updates.BINARY_CURVE_0),
             Variant(span("1.0.0", "1.5.2"), "e1ab1b2d8deb2168", updates.build_binary_curve_update),
             Variant(span("1.6.0", "1.9.0"), "f0f0ec6270b7da95", updates.build_binary_curve_update)),
        _one(_CURVE_FN, "_binary_precision_recall_curve_update_vectorized",
             Variant(span("1.0.0", "1.5.2"), "ec301d9cf77fe882", updates.BINARY_CURVE),
             Variant(span("1.6.0", "1.9.0"), "fbdbbf06e93f4942", updates.BINARY_CURVE), present=_SINCE_1_0),
        _one(_CURVE_FN, "_multiclass_precision_recall_curve_update",
             Variant(span("0.10.0", "0.11.4"), "55785b8af27770f7", updates.MULTICLASS_CURVE_0),  # as the binary one
             Variant(span("1.0.0", "1.2.1"), "375945c4aec1ab7a", updates.build_multiclass_curve_update),
             Variant(span("1.3.0.post0", "1.5.2"), "0c602746dd8fe0a4", updates.build_multiclass_curve_update_average),
             Variant(span("1.6.0", "1.9.0"), "367132df6772a098", updates.build_multiclass_curve_update_average)),
        _one(_CURVE_FN, "_multiclass_precision_recall_curve_update_vectorized",
             Variant(span("1.0.0", "1.5.2"), "a3199ce0d1d26593", updates.MULTICLASS_CURVE),
             Variant(span("1.6.0", "1.9.0"), "f1777e98e3580091", updates.MULTICLASS_CURVE), present=_SINCE_1_0),
        _one(_CURVE_FN, "_multilabel_precision_recall_curve_update",
             Variant(span("0.10.0", "0.11.4"), "6adb14d107553ea2", updates.MULTILABEL_CURVE_0),  # target not cast
             Variant(span("1.0.0", "1.5.2"), "85ee9dd3d59f6bc9", updates.MULTILABEL_CURVE),
             Variant(span("1.6.0", "1.9.0"), "5c026a2163afc4da", updates.MULTILABEL_CURVE)),
    ),
)
