"""The audit panel across the release matrix: patched update rows sync only where the
sync is labelled inherent/validation, and the unpatched rows show the syncs the patches target."""
from __future__ import annotations

import json

import pytest

import tmpatch
from tmpatch.audit import SyncKind, SyncPoint
from tmpatch.audit import panel as panel_module
from tmpatch.audit.panel import INHERENT, PATCH, TOLERATED, UPSTREAM, label_for, run_panel

from tests.audit.helpers import release_in

pytest.importorskip("torchmetrics")

AGGREGATORS = ("MeanMetric (default weight)", "MeanMetric (tensor weight)", "MeanMetric (float value)",
               "SumMetric", "MaxMetric", "MinMetric", "RunningMean")
MULTICLASS = ("MulticlassAccuracy", "MulticlassPrecision", "MulticlassRecall", "MulticlassF1Score")


@pytest.fixture(scope="module")
def panel():
    """The whole panel, once per release (a few seconds)."""
    tmpatch.revert()
    return run_panel(real=False)


def _at(points, suffix, kind=None):
    return [p for p in points if p.location.rsplit(":", 1)[0].replace("\\", "/").endswith(suffix)
            and (kind is None or p.kind is SyncKind(kind))]


def _applied(panel, name):
    return panel.patch_states.get(name) == "applied"


def test_every_row_ran(panel):
    assert [row.name for row in panel.rows] == list(panel_module.ROW_NAMES)
    for row in panel.rows:
        assert row.available and not row.error, (row.name, row.why_na, row.error)
        for part in (row.update, row.compute):
            for audited in part.values():
                assert audited.report.complete, (row.name, str(audited.report))
        assert set(row.update) == {"unpatched", "patched"}
        assert set(row.compute) == (set() if row.helper else {"unpatched", "patched"})


def test_patched_updates_sync_only_where_labelled_and_tolerated(panel):
    for row in panel.rows:
        patched = row.update["patched"]
        assert all(label is not None for label in patched.labels()), (row.name, str(patched.report))
        leftover = patched.untolerated()
        if row.name == "BinaryAccuracy" and release_in("<1.6.1") and not _applied(panel, "logits_check"):
            assert {label_for(p).category for p in leftover} == {UPSTREAM}
            assert row.fails()
        else:
            assert not leftover, (row.name, [str(p) for p in leftover])
            assert not row.fails()


def test_aggregator_updates_drop_to_zero_with_nan_check(panel):
    for name in AGGREGATORS + ("CatMetric",):
        row = panel[name]
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
    mismatch = row.update["unpatched"].report.of_kind(SyncKind.DEVICE_MISMATCH)
    assert bool(mismatch) is release_in("<1.4.1")
    assert not row.update["patched"].report.of_kind(SyncKind.DEVICE_MISMATCH)
    assert row.update["patched"].report.result_devices == [row.update["patched"].report.device]


def test_multiclass_and_regression_rows(panel):
    bincount = [] if _applied(panel, "bincount") else ["aten.bincount"]
    for name in MULTICLASS:
        assert [p.op for p in panel[name].update["unpatched"].points] == ["aten.bincount"], name
        ops = [p.op for p in panel[name].update["patched"].points]
        assert ops == bincount, (name, ops)
    for name in ("MeanSquaredError", "MeanAbsoluteError"):
        assert panel[name].update["unpatched"].count == panel[name].update["patched"].count == 0


def test_training_step_row(panel):
    row = panel["training step"]
    patched = row.update["patched"]
    per_metric = [] if _applied(panel, "bincount") else ["aten.bincount"]
    assert [p.op for p in patched.points] == per_metric * 4  # one per classification metric
    assert row.update["unpatched"].count > patched.count


def test_json_ready_and_tmpatch_left_reverted(panel):
    data = json.loads(json.dumps(panel.to_dict()))
    assert data["torchmetrics"] == panel.release and len(data["rows"]) == len(panel_module.ROWS)
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
    row = panel_module.Row("Missing", lambda: [], ("torchmetrics:NoSuchMetric",))
    monkeypatch.setattr(panel_module, "ROWS", (row,))
    result = run_panel(["Missing"], real=False)
    assert not result["Missing"].available and "n/a" in result["Missing"].why_na
    assert not result.failing()


def test_labels_match_on_function_file_and_kind():
    def point(kind, function, path, op="aten._to_copy"):
        return SyncPoint(SyncKind(kind), op, f"{path}:10", function)

    bincount = point("data-dependent shape", "_bincount", "/x/torchmetrics/utilities/data.py", "aten.bincount")
    assert label_for(bincount).category == INHERENT
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
