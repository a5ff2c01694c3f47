"""The audit panel across the release matrix: patched update rows sync only where the
sync is labelled inherent/validation, and the unpatched rows show the syncs the patches target."""
from __future__ import annotations

import json

import pytest

import tmpatch
from tests.audit.helpers import counts_with_bincount, release_in
from tmpatch.audit import SyncKind, SyncPoint
from tmpatch.audit.panel import rows as panel_rows, run as panel_module
from tmpatch.audit.panel.run import TOLERATED, label_for, run_panel
from tmpatch.control.report import State
from tmpatch.spec import INHERENT, PATCHED as PATCH, UPSTREAM, VALIDATION

#: the release's own count on CUDA: ``torch.bincount`` (from 0.10.2; 0.10.0-0.10.1 use ``index_add_``, no read)
BINCOUNT = ["aten.bincount"] if counts_with_bincount() else []

pytest.importorskip("torchmetrics")

AGGREGATORS = ("MeanMetric (default weight)", "MeanMetric (tensor weight)", "MeanMetric (float value)",
               "SumMetric", "MaxMetric", "MinMetric", "RunningMean")
MULTICLASS = ("MulticlassAccuracy", "MulticlassPrecision", "MulticlassRecall", "MulticlassF1Score")


@pytest.fixture
def panel(panel_result):
    """The whole panel, once per release (tests/audit/conftest.py)."""
    return panel_result


def _at(points, suffix, kind=None):
    return [p for p in points if p.location.rsplit(":", 1)[0].replace("\\", "/").endswith(suffix)
            and (kind is None or p.kind is SyncKind(kind))]


def _applied(panel, name):
    return panel.patch_states.get(name) == "applied"


def _not_here(row) -> bool:
    """Whether the row's metric or function is not in this release (0.10-0.11: RunningMean, _cumsum, ...)."""
    return not row.available and "not in this release" in row.why_na


def _upstream_cannot_run(row) -> bool:
    """Whether the release itself raises for the row's call on the CPU (torchmetrics 1.6.1-1.6.x:
    ``top_k > 1`` with samplewise multidim input fails in ``_refine_preds_oh``)."""
    if "samplewise" not in row.name:
        return False
    tmpatch.revert()
    try:
        for metric, args, kwargs in panel_module.find_row(row.name).build():
            metric.update(*args, **kwargs)
    except RuntimeError:
        return True
    return False


def _default(panel):
    """The panel's default rows (after them: the rows of the patches not in force here, if any)."""
    return panel.rows[:len(panel_rows.ROWS)]


def test_every_row_ran(panel):
    assert [row.name for row in _default(panel)] == list(panel_rows.ROW_NAMES)
    lost = [f"{name} ({state})" for name, state in panel.patch_states.items() if state in State.PROBLEMS]
    assert all(row.stands_for and set(row.stands_for) <= set(lost) for row in panel.rows[len(panel_rows.ROWS):])
    assert {label for row in panel.rows for label in row.stands_for} == set(lost)  # each has its rows
    for row in _default(panel):
        if _upstream_cannot_run(row):
            assert not row.available and "raises RuntimeError" in row.why_na and not row.error, row.name
            continue
        if _not_here(row) and release_in("<1.0.0"):
            continue
        assert row.available and not row.error, (row.name, row.why_na, row.error)
        for part in (row.update, row.compute):
            for audited in part.values():
                assert audited.report.complete, (row.name, str(audited.report))
        assert set(row.update) == {"unpatched", "patched"}
        assert set(row.compute) == (set() if row.helper else {"unpatched", "patched"})


def test_patched_updates_sync_only_where_labelled_and_tolerated(panel):
    for row in _default(panel):
        if _upstream_cannot_run(row) or _not_here(row):
            continue
        patched = row.update["patched"]
        assert all(label is not None for label in patched.labels()), (row.name, str(patched.report))
        leftover = patched.untolerated()
        if row.name.startswith(("Binary", "Multilabel")) and "validate_args" not in row.name \
                and release_in("<1.6.1") and not _applied(panel, "logits_check"):
            assert {label_for(p).category for p in leftover} == {UPSTREAM}
            assert row.fails()
        else:
            assert not leftover, (row.name, [str(p) for p in leftover])
            assert not row.fails()


def test_aggregator_updates_drop_to_zero_with_nan_check(panel):
    for name in AGGREGATORS + ("CatMetric",):
        row = panel[name]
        if _not_here(row):  # RunningMean before 1.0.0
            continue
        unpatched = row.update["unpatched"]
        checks = [p for p in unpatched.points if p.function == "_cast_and_nan_check_input"]
        assert checks and all(label_for(p).category == PATCH for p in checks), name
        if _applied(panel, "nan_check"):
            expected = 1 if name == "CatMetric" else 0  # CatMetric drops NaN: inherent
            assert row.update["patched"].count == expected, (name, str(row.update["patched"].report))
    if _applied(panel, "nan_check"):
        (point,) = panel["CatMetric"].update["patched"].points
        assert label_for(point).category == INHERENT


def test_mean_metric_host_copies(panel):
    default = _at(panel["MeanMetric (default weight)"].update["unpatched"].points,
                  "torchmetrics/aggregation.py", "host-to-device copy")
    assert len(default) == (1 if release_in("<1.6.2") else 0)
    value = _at(panel["MeanMetric (float value)"].update["unpatched"].points,
                "torchmetrics/aggregation.py", "host-to-device copy")
    assert len(value) >= 1  # every release
    for name in ("MeanMetric (default weight)", "MeanMetric (float value)"):
        assert not panel[name].update["patched"].report.of_kind(SyncKind.H2D_COPY)
    assert "mean_default_weight" in panel["MeanMetric (float value)"].fixed_by()


def test_safe_divide_host_copy(panel):
    row = panel["_safe_divide"]
    copies = _at(row.update["unpatched"].points, "torchmetrics/utilities/compute.py", "host-to-device copy")
    assert len(copies) == (1 if release_in(">=1.4.0,<1.9.0") else 0)
    assert row.update["patched"].count == 0
    if copies:  # and the multiclass compute goes through it
        compute = panel["MulticlassAccuracy"].compute
        assert _at(compute["unpatched"].points, "torchmetrics/utilities/compute.py", "host-to-device copy")
        assert not _at(compute["patched"].points, "torchmetrics/utilities/compute.py")
        assert row.fixed_by() == ["safe_divide"]


def test_cumsum_device_mismatch(panel):
    row = panel["_cumsum"]
    if _not_here(row):
        assert release_in("<1.0.0")
        return
    mismatch = row.update["unpatched"].report.of_kind(SyncKind.DEVICE_MISMATCH)
    assert bool(mismatch) is release_in("<1.4.1")
    assert not row.update["patched"].report.of_kind(SyncKind.DEVICE_MISMATCH)
    assert row.update["patched"].report.result_devices == [row.update["patched"].report.device]


def test_multiclass_and_regression_rows(panel):
    bincount = [] if _applied(panel, "bincount") else BINCOUNT
    for name in MULTICLASS:
        assert [p.op for p in panel[name].update["unpatched"].points] == BINCOUNT, name
        ops = [p.op for p in panel[name].update["patched"].points]
        assert ops == bincount, (name, ops)
    for name in ("MeanSquaredError", "MeanAbsoluteError"):
        assert panel[name].update["unpatched"].count == panel[name].update["patched"].count == 0


def _grid_rows(panel):
    return [row for row in panel.rows if row.name.startswith("MulticlassStatScores (")]


def test_multiclass_grid_covers_every_update_branch(panel):
    rows = _grid_rows(panel)
    assert len(rows) == 3 * 2 * 2 * 2  # average x top_k x multidim_average x ignore_index
    for row in rows:
        if _upstream_cannot_run(row):
            continue
        unpatched = [(p.function, p.op) for p in row.update["unpatched"].points]
        counting = "top_k=1, global" in row.name  # the branches that count or remove
        expected = []
        if counting and "ignore_index" in row.name:
            expected += [("_multiclass_stat_scores_update", "aten.index")] * 2  # preds[idx], target[idx]
        if counting and "micro" not in row.name and BINCOUNT:
            expected.append(("_bincount", "aten.bincount"))
        assert sorted(unpatched) == sorted(expected), (row.name, unpatched)
        if _applied(panel, "bincount"):
            assert row.update["patched"].count == 0, (row.name, str(row.update["patched"].report))
            assert row.fixed_by() == (["bincount"] if expected else []), row.name


def test_ignore_index_rows(panel):
    for name in MULTICLASS:
        row = panel[f"{name} (ignore_index)"]
        ops = sorted(p.op for p in row.update["unpatched"].points)
        assert ops == sorted(BINCOUNT + ["aten.index", "aten.index"]), (name, ops)
        if _applied(panel, "bincount"):
            assert row.update["patched"].count == 0


def test_binary_and_multilabel_rows(panel):
    for task in ("Binary", "Multilabel"):
        for metric in ("Accuracy", "Precision", "Recall", "F1Score", "StatScores"):
            row = panel[task + metric]
            unpatched = [p.function for p in row.update["unpatched"].points]
            assert unpatched == ([f"_{task.lower()}_stat_scores_format"] if release_in("<1.6.1") else []), \
                (row.name, unpatched)
            if _applied(panel, "logits_check") or release_in(">=1.6.1"):
                assert row.update["patched"].count == 0, row.name


CONFUSION_AND_BINNED = (
    "BinaryConfusionMatrix", "MulticlassConfusionMatrix", "MultilabelConfusionMatrix",
    "BinaryConfusionMatrix (ignore_index)", "MulticlassConfusionMatrix (ignore_index)",
    "BinaryPrecisionRecallCurve (thresholds=10)", "MulticlassPrecisionRecallCurve (thresholds=10)",
    "MultilabelPrecisionRecallCurve (thresholds=10)", "BinaryAUROC (thresholds=10)",
    "BinaryPrecisionRecallCurve (thresholds=10, ignore_index)",
    "MulticlassPrecisionRecallCurve (thresholds=10, ignore_index)",
)


def test_confusion_matrix_and_binned_curve_rows(panel):
    logits_fixed = _applied(panel, "logits_check") or release_in(">=1.6.1")
    for name in CONFUSION_AND_BINNED:
        row = panel[name]
        ops = [p.op for p in row.update["unpatched"].points]
        assert ("aten.bincount" in ops) is bool(BINCOUNT), (name, ops)
        assert ("aten.index" in ops) is ("ignore_index" in name or name.startswith("Multilabel")), (name, ops)
        if _applied(panel, "bincount") and logits_fixed:
            assert row.update["patched"].count == 0, (name, str(row.update["patched"].report))
            assert ("bincount" in row.fixed_by()) is any(op in ("aten.bincount", "aten.index") for op in ops), name


def test_calibration_error_rows(panel):
    for name in ("BinaryCalibrationError", "MulticlassCalibrationError"):
        row = panel[name]
        unpatched = [p.function for p in row.update["unpatched"].points]
        assert len(unpatched) == (1 if release_in("<1.6.1") else 0), (name, unpatched)
        assert row.update["patched"].count == 0, (name, str(row.update["patched"].report))
        if unpatched:
            assert row.fixed_by() == ["logits_check"], name


def test_unbinned_curves_keep_only_the_inherent_removal(panel):
    plain = panel["BinaryPrecisionRecallCurve (thresholds=None)"]
    assert not [p for p in plain.update["unpatched"].points if p.op != "aten._local_scalar_dense"]
    ignoring = panel["BinaryAUROC (thresholds=None, ignore_index)"]
    for row in (plain, ignoring):
        for part in (row.update, row.compute):
            assert all(label is not None for label in part["patched"].labels()), (row.name, str(part["patched"].report))
    removal = ignoring.update["patched"].points
    assert len(removal) == 2 and all(label_for(p).category == INHERENT for p in removal)
    if _applied(panel, "logits_check") or release_in(">=1.6.1"):
        assert plain.update["patched"].count == 0


def test_validation_rows_keep_only_validation_syncs(panel):
    names = [row.name for row in panel.rows if "validate_args" in row.name]
    assert len(names) == 4
    for name in names:
        row = panel[name]
        patched = row.update["patched"]
        assert patched.count > 0, name  # the validation the user asked for
        categories = {label.category for label in patched.labels()}
        if _applied(panel, "bincount") and (_applied(panel, "logits_check") or release_in(">=1.6.1")):
            assert categories == {VALIDATION}, (name, str(patched.report))
        assert row.update["unpatched"].count >= patched.count, name


def test_training_step_row(panel):
    row = panel["training step"]
    patched = row.update["patched"]
    per_metric = [] if _applied(panel, "bincount") else BINCOUNT
    assert [p.op for p in patched.points] == per_metric * 4  # one per classification metric
    assert row.update["unpatched"].count > patched.count


def test_json_ready_and_tmpatch_left_reverted(panel):
    data = json.loads(json.dumps(panel.to_dict()))
    assert data["torchmetrics"] == panel.release and len(data["rows"]) == len(panel.rows) >= len(panel_rows.ROWS)
    assert all(row["state"] != "applied" for row in tmpatch.status().to_dict())


def test_patches_applied_before_stay_applied():
    tmpatch.apply(["safe_divide"])
    before = tmpatch.status().states()["safe_divide"]
    result = run_panel(["_safe_divide"], real=False)
    assert result["_safe_divide"].update["patched"].count == 0
    assert tmpatch.status().states()["safe_divide"] == before
    assert tmpatch.status().states()["nan_check"] != "applied"


def test_unknown_row_and_na_rows(monkeypatch):
    with pytest.raises(KeyError):
        run_panel(["no such metric"])
    row = panel_rows.Row("Missing", lambda: [], ("torchmetrics:NoSuchMetric",))
    monkeypatch.setattr(panel_module, "ROWS", (row,))
    result = run_panel(["Missing"], real=False)
    assert not result["Missing"].available and "n/a" in result["Missing"].why_na
    assert not result.failing()


def test_labels_match_on_function_file_and_kind():
    def point(kind, function, path, op="aten._to_copy"):
        return SyncPoint(SyncKind(kind), op, f"{path}:10", function)

    bincount = point("data-dependent shape", "_bincount", "/x/torchmetrics/utilities/data.py", "aten.bincount")
    assert label_for(bincount).category == PATCH and label_for(bincount).patch == "bincount"
    nan = point("device-to-host read", "_cast_and_nan_check_input", "/x/torchmetrics/aggregation.py",
                "aten._local_scalar_dense")
    assert label_for(nan).category == PATCH and label_for(nan).patch == "nan_check"
    validation = point("data-dependent shape", "_multiclass_stat_scores_tensor_validation",
                       "/x/torchmetrics/functional/classification/stat_scores.py", "aten._unique2")
    assert label_for(validation).category in TOLERATED
    assert label_for(point("device mismatch", "_cumsum", "/x/torchmetrics/utilities/data.py")).patch == \
        "cumsum_device"
    assert label_for(point("host-to-device copy", "_cumsum", "/x/tmpatch/patches/cumsum_device.py")).category \
        == INHERENT
    assert label_for(point("device-to-host read", "mystery", "/x/user.py")) is None


def test_non_syncs_never_fail_a_row():
    from tmpatch.audit import AuditReport

    report = AuditReport()
    report.add(SyncPoint(SyncKind.DEVICE_MISMATCH, "aten._to_copy", "/x/user.py:3", "mystery", "cuda:0 vs cuda:1"))
    report.add(SyncPoint(SyncKind.PINNED_COPY, "aten._to_copy", "/x/user.py:4", "mystery"))
    audited = panel_module.Audited(report, patched=True)
    row = panel_module.RowResult("x", True, update={"patched": audited})
    assert audited.count == 0 and len(audited.points) == 2 and audited.untolerated() == []
    assert not row.fails() and "device mismatch (not a sync)" in row.notes()
    report.add(SyncPoint(SyncKind.FORMAT, "Tensor.__format__", "/x/user.py:5", "mystery"))
    assert row.fails() and "unexplained sync" in row.notes()


# -- patches not in force: their rows join the default panel ---------------------------------------------------------
def test_every_patch_has_rows_that_show_its_repair_or_says_why_none_can():
    for name in tmpatch.patch_names():
        assert (name in panel_rows.WITNESSES) != (name in panel_rows.UNMEASURED), name
        for row in panel_rows.WITNESSES.get(name, ()):
            assert panel_module.find_row(row).name == row
    assert set(panel_rows.WITNESSES) | set(panel_rows.UNMEASURED) == set(tmpatch.patch_names())
    assert not set(panel_rows.PATCH_ROW_NAMES) & set(panel_rows.ROW_NAMES)


@pytest.fixture(scope="module")
def patch_rows():
    return run_panel(panel_rows.PATCH_ROW_NAMES)


def test_each_patch_row_shows_a_repair_where_its_patches_apply(patch_rows):
    """Each row of PATCH_ROWS syncs less patched than unpatched wherever a patch it stands for is
    applied (the test can fail: a row whose inputs miss the defect)."""
    assert [row.name for row in patch_rows.rows] == list(panel_rows.PATCH_ROW_NAMES)
    shown = {}
    for row in patch_rows.rows:
        patches = [p for p, rows in panel_rows.WITNESSES.items() if row.name in rows]
        if not row.available or not any(_applied(patch_rows, p) for p in patches):
            continue
        assert not row.error, row.error
        before, after = (sum(a.count for a in (row.update.get(mode), row.compute.get(mode)) if a is not None)
                         for mode in ("unpatched", "patched"))
        shown[row.name] = (before, after)
        assert after < before, (row.name, before, after, row.notes())
    assert "PeakSignalNoiseRatio" in shown  # every release has it


def _fork_of_psnr_update(preds, target, dim=None):  # a local fork: code tmpatch does not know
    return preds, target


def test_a_patch_not_in_force_gets_its_rows_and_counts_in_the_totals(monkeypatch):
    import importlib

    from tmpatch.audit.panel.text import render, totals

    monkeypatch.setattr(panel_module, "ROWS", (panel_module.find_row("SumMetric"),))
    psnr = importlib.import_module("torchmetrics.functional.image.psnr")
    monkeypatch.setattr(psnr, "_psnr_update", _fork_of_psnr_update)  # the class keeps the release's own
    panel = run_panel()
    assert panel.patch_states["image_constants"] == "partial"
    names = [row.name for row in panel.rows]
    assert names[0] == "SumMetric" and "PeakSignalNoiseRatio" in names and "StructuralSimilarityIndexMeasure" in names
    row = panel["PeakSignalNoiseRatio"]
    assert row.stands_for == ["image_constants (partial)"]
    if row.available:  # the release's PSNR cannot run on simulated CUDA with some older CUDA builds of torch
        assert (row.update["unpatched"].count, row.update["patched"].count) == (1, 1)  # its repair is the one lost
    text = render(panel)
    assert "PeakSignalNoiseRatio" in text and "image_constants (partial)" in text
    assert "1 of " in panel.code and "torchmetrics.functional.image.psnr._psnr_update" in panel.code
    assert f"{len([r for r in panel.rows if r.available])} rows audited" in totals(panel.rows)


def test_a_patch_no_row_can_measure_gets_a_row_saying_so():
    from tmpatch.audit.panel.text import render, shown

    rows, results = panel_module._stand_in([], [], {"coalesced_sync": "mismatch"})
    assert rows == [] and [r.name for r in results] == ["coalesced_sync"]
    assert not results[0].available and shown(results[0])
    assert results[0].why_na.startswith("coalesced_sync (mismatch): not measured by the panel: it syncs states")
    text = render(panel_module.Panel("x", "simulated", {}, results))
    assert "coalesced_sync" in text and "not measured by the panel" in text


def test_a_metrics_compute_inside_forward_is_explained():
    """forward() computes the batch's value: the reads of the release's compute functions (AUROC's
    average, its curve) are labelled, not "unexplained"."""
    def point(op, function, path):
        return SyncPoint(SyncKind("device-to-host read"), op, f"{path}:59", function)

    for function, path in (("_reduce_auroc", "functional/classification/auroc.py"),
                           ("_multiclass_auroc_compute", "functional/classification/auroc.py"),
                           ("_binary_roc_compute", "functional/classification/roc.py")):
        label = label_for(point("aten._local_scalar_dense", function, f"/x/torchmetrics/{path}"))
        assert label is not None and label.category == INHERENT, (function, label)
    assert label_for(point("aten._local_scalar_dense", "computed", "/x/user.py")) is None
