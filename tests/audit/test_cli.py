"""``tmpatch audit``: table (120 columns, default rows, --all-rows, totals), --json, --metric
matching, -v, labels, --fail-on-sync, exit codes."""
from __future__ import annotations

import json

import pytest

import tmpatch
from tests.audit.helpers import counts_with_bincount, release_in
from tmpatch import cli as tmpatch_cli
from tmpatch.audit import cli
from tmpatch.audit.panel import rows as panel_rows, run as panel, text as panel_text

pytest.importorskip("torchmetrics")


def _run(capsys, *argv):
    code = cli.main(list(argv) + ["--simulated"])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def whole(panel_result):
    """The whole panel, once per release (tests/audit/conftest.py), and its default and --all-rows text."""
    result = panel_result
    head = panel_text.header(result) + "\n"
    return result, head + panel_text.render(result), head + panel_text.render(result, verbose=True, all_rows=True)


def _table_rows(text):
    names = panel_rows.ROW_NAMES + panel_rows.PATCH_ROW_NAMES + tuple(panel_rows.UNMEASURED)
    return [line.split("  ")[0] for line in text.splitlines() if line.split("  ")[0] in names]


def test_every_line_fits_120_columns(whole):
    _, text, everything = whole
    assert max(map(len, text.splitlines())) <= 120
    assert max(map(len, everything.splitlines())) <= 120


def test_default_rows_are_the_ones_that_change_or_still_sync(whole):
    result, text, everything = whole
    shown = _table_rows(text)
    assert shown == [row.name for row in result.rows if panel_text.shown(row)]
    assert "MeanMetric (default weight)" in shown and "training step" in shown  # 2+ -> 0 on every release
    quiet = [row for row in result.rows if row.available and not row.error and not row.stands_for
             and all(a.count == 0 and not a.points for part in (row.update, row.compute) for a in part.values())]
    assert quiet and not {row.name for row in quiet} & set(shown)  # e.g. MeanSquaredError: 0 -> 0
    hidden_na = sum(not r.available for r in result.rows if r.name not in shown)  # a row shown n/a is not hidden
    assert f"({len(result.rows) - len(shown) - hidden_na} rows with no sync" in text
    assert _table_rows(everything) == [row.name for row in result.rows]
    assert "--all-rows shows them" not in everything


def test_totals_line_and_what_the_training_step_is(whole):
    result, text, _ = whole
    update = [sum(row.update[m].count for row in result.rows if m in row.update) for m in ("unpatched", "patched")]
    compute = [sum(row.compute[m].count for row in result.rows if m in row.compute) for m in ("unpatched", "patched")]
    last = text.splitlines()[-1]
    assert last.startswith(f"total, {sum(r.available for r in result.rows)} rows audited: "
                           f"{update[0]} -> {update[1]} sync points in update/forward, {compute[0]} -> {compute[1]} "
                           "in compute")
    assert update[0] > update[1]
    assert "training step: MeanMetric(loss) + multiclass Accuracy, Precision, Recall, F1" in text
    assert "compute: one compute() after one update" in text


def test_verbose_lists_each_point_with_its_label(whole):
    result, _, everything = whole
    lines = everything.splitlines()
    at = lines.index("  SumMetric")
    assert lines[at + 1].startswith("    update unpatched: device-to-host read (aten._local_scalar_dense) "
                                    "[patch nan_check]")
    assert lines[at + 2].startswith("      at torchmetrics/aggregation.py:")
    assert lines[at + 2].endswith(" in _cast_and_nan_check_input")
    if counts_with_bincount():  # (0.10.0-0.10.1 count with index_add_: no read)
        at = lines.index("  MulticlassAccuracy")  # CUDA bincount: removed by the bincount patch, not inherent
        assert "(aten.bincount) [patch bincount]" in lines[at + 1]


@pytest.mark.once
def test_help_names_the_labels_consistently(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "--fail-on-sync: exit 1" in out and "bincount" not in out.split("labels of a sync point")[1].split(
        "patch NAME")[0]  # CUDA bincount is no example of "inherent"
    for word in ("inherent", "validation", "patch NAME", "upstream", "deferred", "unexplained", "your code"):
        assert f"\n  {word}" in out
    assert max(map(len, out.splitlines())) <= 120
    assert {panel_text.tag(None)} | {panel_text.tag(label) for label in panel.LABELS} <= {
        "inherent", "validation", "upstream", "deferred", "unexplained"} | {
        f"patch {label.patch}" for label in panel.LABELS}


@pytest.mark.once
def test_metric_accepts_a_class_name_or_a_substring():
    names = panel_rows.ROW_NAMES
    assert cli.select(["MeanMetric"], names) == ([n for n in names if n.startswith("MeanMetric (")], [])
    assert cli.select(["meanmetric (float value)"], names) == (["MeanMetric (float value)"], [])
    assert cli.select(["step"], names) == (["training step"], [])
    assert cli.select(["confusion", "minmetric", "nope"], names) == (
        [n for n in names if "ConfusionMatrix" in n or n == "MinMetric"], ["nope"])


def test_table_for_one_class(capsys):
    code, out, _ = _run(capsys, "--metric", "MeanMetric")
    import torchmetrics

    assert code == 0
    assert f"torchmetrics {torchmetrics.__version__}" in out
    assert [l.split("  ")[0] for l in out.splitlines() if l.startswith("MeanMetric (")] == \
        ["MeanMetric (default weight)", "MeanMetric (tensor weight)", "MeanMetric (float value)"]
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


@pytest.mark.once
def test_unknown_metric_is_exit_2_with_a_short_message(capsys):
    code, out, err = _run(capsys, "--metric", "MeanMetrik")
    assert code == 2 and not out
    assert err.startswith("tmpatch audit: no row matches --metric 'MeanMetrik'; did you mean ")
    rows = len(panel_rows.ROW_NAMES + panel_rows.PATCH_ROW_NAMES)
    assert "'MeanMetric'" in err and len(err.splitlines()) == 1 and f"the {rows} rows" in err


@pytest.mark.once
def test_usage_errors_and_list(capsys):
    assert cli.main(["--no-such-option"]) == 2
    assert cli.main(["--verb"]) == 2  # no abbreviations: a later option (--all) cannot be taken by --all-rows
    assert cli.main(["--list"]) == 0
    assert capsys.readouterr().out.split("\n")[:2] == list(panel_rows.ROW_NAMES[:2])
    conflicts = {
        ("--real",): "--real goes with --step, not with the panel",
        ("--step", "x:y", "--metric", "MinMetric"): "--metric goes with the panel, not with --step",
        ("--step", "x:y", "--all-rows"): "--all-rows goes with the panel, not with --step",
        ("--all", "--metric", "MinMetric"): "--metric goes with the panel, not with --all",
        ("--all", "--step", "x:y"): "--step and --all are different audits; give one of them",
        ("--list", "--all"): "--all and --list are different audits; give one of them",
        ("--all", "--graph-breaks"): "--graph-breaks goes with the panel, not with --all",
        ("--all", "--fail-on-sync"): "--fail-on-sync goes with the panel or --step, not with --all",
        ("--list", "--json"): "--json goes with the panel or --step or --all, not with --list",
        ("--step", "x:y", "-v"): "--verbose goes with the panel, not with --step",
    }
    for argv, message in conflicts.items():
        assert cli.main(list(argv)) == 2, argv
        out, err = capsys.readouterr()
        assert not out and err == f"tmpatch audit: error: {message}\n", argv  # one line, before any audit


def test_fail_on_sync_passes_on_tolerated_or_absent_syncs(capsys):
    assert _run(capsys, "--fail-on-sync", "--metric", "MeanSquaredError")[0] == 0
    assert _run(capsys, "--fail-on-sync", "--metric", "MulticlassAccuracy (validate_args)")[0] == 0  # validation


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
