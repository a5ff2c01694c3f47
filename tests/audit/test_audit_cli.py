"""``tmpatch audit``: table, --json, --metric, -v, --fail-on-sync, exit codes."""
from __future__ import annotations

import json

import pytest

import tmpatch
from tmpatch import cli as tmpatch_cli
from tmpatch.audit import cli, panel

from tests.audit.helpers import release_in

pytest.importorskip("torchmetrics")


def _run(capsys, *argv):
    code = cli.main(list(argv) + ["--simulated"])
    out, err = capsys.readouterr()
    return code, out, err


def test_table_for_one_row(capsys):
    code, out, _ = _run(capsys, "--metric", "MeanMetric (float value)")
    import torchmetrics

    assert code == 0
    assert f"torchmetrics {torchmetrics.__version__}" in out
    line = next(l for l in out.splitlines() if l.startswith("MeanMetric (float value)"))
    assert " -> 0" in line and "mean_default_weight" in line


def test_json_has_every_sync_point(capsys):
    code, out, _ = _run(capsys, "--json", "--metric", "_safe_divide", "--metric", "minmetric")
    data = json.loads(out)
    assert code == 0 and [row["name"] for row in data["rows"]] == ["MinMetric", "_safe_divide"]
    minimum = data["rows"][0]
    points = minimum["update"]["unpatched"]["sync_points"]
    assert points and all({"kind", "op", "location", "function", "label"} <= set(p) for p in points)
    assert minimum["update"]["unpatched"]["count"] == len(points)
    assert data["rows"][1]["compute"] == {}


def test_unknown_metric_is_exit_2_with_the_valid_names(capsys):
    code, out, err = _run(capsys, "--metric", "Nope")
    assert code == 2 and not out
    assert "unknown --metric 'Nope'" in err and "MulticlassAccuracy" in err and "training step" in err


def test_usage_errors_and_help(capsys):
    assert cli.main(["--no-such-option"]) == 2
    assert cli.main(["--help"]) == 0
    assert "--fail-on-sync: exit 1" in capsys.readouterr().out
    assert cli.main(["--list"]) == 0
    assert capsys.readouterr().out.split("\n")[:2] == list(panel.ROW_NAMES[:2])


def test_verbose_lists_source_lines(capsys):
    code, out, _ = _run(capsys, "-v", "--metric", "SumMetric")
    lines = [l for l in out.splitlines() if l.startswith("  SumMetric | update unpatched")]
    assert code == 0 and lines
    assert "torchmetrics/aggregation.py:" in lines[0] and "_cast_and_nan_check_input" in lines[0]


def test_fail_on_sync_passes_on_tolerated_or_absent_syncs(capsys):
    assert _run(capsys, "--fail-on-sync", "--metric", "MeanSquaredError")[0] == 0
    assert _run(capsys, "--fail-on-sync", "--metric", "MulticlassAccuracy")[0] == 0  # bincount: inherent


def test_fail_on_sync_fails_on_unlabelled_syncs(capsys, monkeypatch):
    monkeypatch.setattr(panel, "LABELS", ())  # CatMetric's NaN removal (or NaN check) no longer explained
    code, _, err = _run(capsys, "--fail-on-sync", "--metric", "CatMetric", "--metric", "MeanSquaredError")
    assert code == 1 and "1 row(s)" in err and "CatMetric" in err and "MeanSquaredError" not in err


def test_fail_on_sync_binary_formatter_before_1_6_1(capsys):
    code, out, err = _run(capsys, "--json", "--fail-on-sync", "--metric", "BinaryAccuracy")
    fixed = json.loads(out)["patches"].get("logits_check") == "applied"
    assert code == (1 if release_in("<1.6.1") and not fixed else 0), err


def test_through_the_tmpatch_command_leaves_tmpatch_as_found(capsys):
    assert tmpatch_cli.main(["audit", "--metric", "_cumsum", "--simulated"]) == 0
    assert "_cumsum" in capsys.readouterr().out
    assert "applied" not in tmpatch.status().states().values()
    tmpatch.apply(["cumsum_device"])
    before = tmpatch.status().states()
    assert tmpatch_cli.main(["audit", "--metric", "_cumsum", "--simulated"]) == 0
    assert tmpatch.status().states()["cumsum_device"] == before["cumsum_device"]
