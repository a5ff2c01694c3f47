"""tools/upstream_tests.py: how torchmetrics' own tests are run, read and judged (the outcomes of
the report plugin's records, the findings, the environments of the modes, the requirement files);
the real suites are not run here."""
from __future__ import annotations

import fnmatch
import importlib.util
import json
import os
import re

import pytest

from tmpatch.bootstrap import DIRECTORY
from tmpatch.control.settings import POLICIES

pytestmark = pytest.mark.once  # nothing here depends on the torchmetrics release

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLUGIN_DIR = os.path.join(ROOT, "tools", "upstream")

pytest_plugins = ["pytester"]


def _load(name: str, path: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


up = _load("tmpatch_tools_upstream_tests", os.path.join(ROOT, "tools", "upstream_tests.py"))
plugin = _load("tmpatch_tools_upstream_report", os.path.join(PLUGIN_DIR, "upstream_report.py"))
Result = up.Result


def rec(nodeid, when, outcome, message="", xfail=False):
    return {"nodeid": nodeid, "when": when, "outcome": outcome, "message": message, "xfail": xfail}


def test_fold_gives_each_test_its_worst_phase():
    records = [
        rec("t.py::ok", "setup", "passed"), rec("t.py::ok", "call", "passed"), rec("t.py::ok", "teardown", "passed"),
        rec("t.py::bad", "setup", "passed"), rec("t.py::bad", "call", "failed", "AssertionError: x"),
        rec("t.py::bad", "teardown", "failed", "RuntimeError: later"),
        rec("t.py::fixture", "setup", "failed", "ValueError: fixture"),
        rec("t.py::fixture", "teardown", "passed"),
        rec("t.py::torn", "setup", "passed"), rec("t.py::torn", "call", "passed"),
        rec("t.py::torn", "teardown", "failed", "OSError: cleanup"),
        rec("t.py::skip", "setup", "skipped", "no sklearn"),
        rec("t.py::xf", "call", "skipped", "reason", xfail=True),
        rec("t.py::xpass", "call", "passed", xfail=True),
        rec("broken.py", "collect", "failed", "ImportError: no module named x"),
    ]
    assert up.fold(records) == {
        "t.py::ok": Result("passed", ""),
        "t.py::bad": Result("failed", "AssertionError: x"),  # the call's error, not the teardown's
        "t.py::fixture": Result("error", "ValueError: fixture"),
        "t.py::torn": Result("error", "OSError: cleanup"),
        "t.py::skip": Result("skipped", "no sklearn"),
        "t.py::xf": Result("xfailed", "reason"),
        "t.py::xpass": Result("passed", ""),
        "broken.py": Result("error", "ImportError: no module named x"),
    }


def test_a_rerun_starts_the_test_over():
    """pytest-rerunfailures (torchmetrics' ``flaky`` marks): the last attempt decides."""
    records = [rec("t.py::f", "setup", "passed"), rec("t.py::f", "call", "rerun", "AssertionError"),
               rec("t.py::f", "setup", "passed"), rec("t.py::f", "call", "passed")]
    assert up.fold(records) == {"t.py::f": Result("passed", "")}


def test_read_report_of_a_run_that_wrote_nothing_is_empty(tmp_path):
    assert up.read_report(str(tmp_path / "missing.jsonl")) == {}
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(rec("a.py::b", "call", "failed", "E")) + "\n\n")
    assert up.read_report(str(path)) == {"a.py::b": Result("failed", "E")}


class _Crash:
    def __init__(self, message):
        self.message = message


class _Repr:
    def __init__(self, message, text="tb"):
        self.reprcrash = _Crash(message) if message is not None else None
        self.text = text

    def __str__(self):
        return self.text


def test_first_line_of_an_error():
    assert plugin.first_line(None) == ""
    assert plugin.first_line(_Repr("RuntimeError: tmpatch bincount: 4 value(s)\nmore")) == \
        "RuntimeError: tmpatch bincount: 4 value(s)"
    assert plugin.first_line(_Repr(None, "def f():\n>   x()\nE   ValueError: bad\nE   second\nt.py:3: ValueError")) == \
        "ValueError: bad"
    assert plugin.first_line(_Repr("  ", "collect failed\n\nImportError while importing\n")) == \
        "ImportError while importing"
    assert plugin.first_line(("t.py", 3, "Skipped: no sklearn")) == "Skipped: no sklearn"
    assert plugin.first_line(_Repr("RuntimeError: \nattribute lookup is not defined on python value:\n  File")) == \
        "RuntimeError: attribute lookup is not defined on python value:"  # TorchScript's


def test_the_plugin_reports_every_test_and_runs_only_the_ids_named(pytester, monkeypatch):
    pytester.makepyfile(test_sample="""
        import pytest

        def test_ok():
            pass

        @pytest.mark.parametrize("x", ["a[1]", "b"])
        def test_param(x):
            assert x == "b", "not b"

        @pytest.fixture
        def broken():
            raise ValueError("fixture broke")

        def test_error(broken):
            pass

        @pytest.mark.skip(reason="left out")
        def test_skip():
            pass
    """)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([PLUGIN_DIR, os.environ.get("PYTHONPATH", "")]))
    report = pytester.path / "report.jsonl"
    pytester.runpytest_subprocess("-p", "upstream_report", "--upstream-report", str(report), "-p", "no:cacheprovider")
    results = up.read_report(str(report))
    assert {n: r.outcome for n, r in results.items()} == {
        "test_sample.py::test_ok": "passed", "test_sample.py::test_param[a[1]]": "failed",
        "test_sample.py::test_param[b]": "passed", "test_sample.py::test_error": "error",
        "test_sample.py::test_skip": "skipped",
    }
    assert results["test_sample.py::test_param[a[1]]"].message.startswith("AssertionError: not b")
    assert results["test_sample.py::test_error"].message == "ValueError: fixture broke"

    ids = pytester.path / "ids.txt"
    ids.write_text("test_sample.py::test_param[a[1]]\ntest_sample.py::test_ok\n")
    again = pytester.path / "again.jsonl"
    pytester.runpytest_subprocess("-p", "upstream_report", "--upstream-report", str(again),
                                  "--upstream-only", str(ids), "-p", "no:cacheprovider", "test_sample.py")
    assert {n: r.outcome for n, r in up.read_report(str(again)).items()} == {
        "test_sample.py::test_ok": "passed", "test_sample.py::test_param[a[1]]": "failed"}


TABLE = (up.Correction(">=1.5", "unittests/x/test_a.py::test_raises[*]", "deferred checks"),
         up.Correction("<1.5", "unittests/x/test_b.py::*", "old"))


def test_a_correction_names_its_tests_and_releases():
    assert up.correction_of("1.9.0", "unittests/x/test_a.py::test_raises[1-None]", TABLE).name == "deferred checks"
    assert up.correction_of("1.4.0", "unittests/x/test_a.py::test_raises[1-None]", TABLE) is None  # not that release
    assert up.correction_of("1.9.0", "unittests/x/test_a.py::test_raisesX", TABLE) is None  # brackets are literal
    assert up.correction_of("1.4.0", "unittests/x/test_b.py::test_c[0]", TABLE).name == "old"


def test_every_correction_names_a_test_of_its_domains():
    paths = [path for paths in up.DOMAINS.values() for path in paths]
    for entry in up.CORRECTIONS:
        assert "::" in entry.pattern, entry  # a test, never a whole file
        files = entry.pattern.split("::")[0]
        assert any(files.startswith(path + "/") or fnmatch.fnmatchcase(path, files) for path in paths), entry


def test_classify_separates_regressions_corrections_and_flaky_tests():
    failed = {"unittests/x/test_a.py::test_raises[1]": Result("failed", "DID NOT RAISE"),
              "unittests/x/test_c.py::test_v": Result("failed", "AssertionError: 0.0 != 1.0"),
              "unittests/x/test_c.py::test_flaky": Result("failed", "AssertionError"),
              "unittests/x/test_c.py::test_both": Result("error", "ImportError: sklearn")}
    unpatched = {"unittests/x/test_a.py::test_raises[1]": Result("passed", ""),
                 "unittests/x/test_c.py::test_v": Result("passed", ""),
                 "unittests/x/test_c.py::test_flaky": Result("passed", ""),
                 "unittests/x/test_c.py::test_both": Result("error", "ImportError: sklearn")}
    again = {"unittests/x/test_a.py::test_raises[1]": Result("failed", "DID NOT RAISE"),
             "unittests/x/test_c.py::test_v": Result("failed", "AssertionError"),
             "unittests/x/test_c.py::test_flaky": Result("passed", "")}
    eager = {"unittests/x/test_a.py::test_raises[1]": Result("passed", ""),
             "unittests/x/test_c.py::test_v": Result("failed", "AssertionError")}
    findings = {f.nodeid: f for f in up.classify("1.9.0", failed, unpatched, again, eager, TABLE)}
    assert set(findings) == {"unittests/x/test_a.py::test_raises[1]", "unittests/x/test_c.py::test_v",
                             "unittests/x/test_c.py::test_flaky"}  # failing unpatched too: not a finding
    correction = findings["unittests/x/test_a.py::test_raises[1]"]
    assert (correction.kind, correction.correction, correction.eager) == ("correction", "deferred checks", "passed")
    regression = findings["unittests/x/test_c.py::test_v"]
    assert (regression.kind, regression.message, regression.eager) == \
        ("regression", "AssertionError: 0.0 != 1.0", "failed")
    assert findings["unittests/x/test_c.py::test_flaky"].kind == "flaky"
    assert "REGRESSION" in up.finding_line("1.9.0", regression)
    assert "[eager policies: passed]" in up.finding_line("1.9.0", correction)


def test_the_modes_environments(tmp_path):
    base = {"PATH": "/bin", "TMPATCH": "1", "TMPATCH_NAN_CHECK": "off", "PYTHONPATH": "/mine"}
    tests = str(tmp_path)
    unpatched = up.environ("unpatched", tests, base)
    assert "TMPATCH" not in unpatched and "TMPATCH_NAN_CHECK" not in unpatched
    assert unpatched["PYTHONPATH"].split(os.pathsep) == [tests, PLUGIN_DIR, "/mine"]
    assert unpatched["USE_PYTEST_POOL"] == "0"
    patched = up.environ("patched", tests, base, ddp=True)
    assert patched["TMPATCH"] == "1" and "TMPATCH_NAN_CHECK" not in patched  # the default policies
    assert patched["PYTHONPATH"].split(os.pathsep)[:3] == [DIRECTORY, tests, ROOT]
    assert patched["USE_PYTEST_POOL"] == "1"
    eager = up.environ("eager", tests, base)
    assert eager["TMPATCH_NAN_CHECK"] == "eager" and eager["TMPATCH_BINCOUNT"] == "eager"
    # every policy with an eager choice, whatever policies the library grows
    assert {k for k, v in eager.items() if k.startswith("TMPATCH_")} == \
        {s.variable for s in POLICIES.values() if "eager" in s.choices}
    with pytest.raises(ValueError, match="mode must be"):
        up.environ("fast", tests, base)


def test_domains_given_defaulted_and_aliased():
    assert up.parse_domains(None, ci=True) == list(up.CI_DOMAINS)
    assert up.parse_domains(None, ci=False) == list(up.DOMAINS)
    assert up.parse_domains("aggregation,classification,bases", ci=True) == ["bases", "classification"]
    with pytest.raises(SystemExit, match="unknown domain"):
        up.parse_domains("classfication", ci=False)


def test_a_rerun_collects_only_the_files_of_its_ids(tmp_path):
    runner = up.Runner("python", "1.9.0", str(tmp_path), str(tmp_path), jobs=2)
    command = runner.command(up.Part("classification", False), "r.jsonl", "ids.txt", ["unittests/a.py"], 500)
    assert command[-1] == "unittests/a.py" and ("--upstream-only", "ids.txt") in zip(command, command[1:])
    assert {("-n", "2"), ("-m", "not DDP")} <= set(zip(command, command[1:]))
    few = runner.command(up.Part("classification", False), "r.jsonl", "ids.txt", ["unittests/a.py"], 3)
    assert "-n" not in few  # a few tests: no workers to start
    ddp = runner.command(up.Part("bases", True), "r.jsonl", None, up.DOMAINS["bases"])
    assert "-n" not in ddp and ("-m", "DDP") in zip(ddp, ddp[1:])  # one pool of processes, one port range


@pytest.mark.parametrize("release", up.RELEASES)
def test_every_domain_has_its_requirements_from_pypi(release):
    folder = os.path.join(PLUGIN_DIR, release)
    assert sorted(os.listdir(folder)) == sorted(f"{d}.txt" for d in ("common", *up.DOMAINS))
    for name in os.listdir(folder):
        with open(os.path.join(folder, name)) as handle:
            lines = [line.split("#")[0].strip() for line in handle]
        for line in filter(None, lines):
            assert not re.search(r"@|://|^-", line), f"{release}/{name}: {line} (PyPI names only)"
    with open(os.path.join(folder, "common.txt")) as handle:
        assert f"torchmetrics=={release}" in handle.read()


def test_the_archives_are_found_beside_or_above_the_checkout(tmp_path):
    (tmp_path / "shared" / "upstream").mkdir(parents=True)
    (tmp_path / "a" / "b").mkdir(parents=True)
    assert up.find_archives(str(tmp_path / "a" / "b")) == str(tmp_path / "shared" / "upstream")


def test_the_venv_borrows_this_interpreters_torch_whole():
    entries = up.torch_entries()
    names = {os.path.basename(path) for path in entries}
    assert "torch" in names and any(n.startswith("torch-") and n.endswith(".dist-info") for n in names)
    import torch

    assert os.path.dirname(os.path.abspath(torch.__file__)) in entries


def test_the_table_and_the_json_give_each_part_its_figures():
    finding = up.Finding("unittests/x.py::t", "regression", "AssertionError", "failed", "")
    fig = up.PartFigures(up.Part("classification", True), 120, 4, 3, 110, 1, [finding],
                         {"patched": 30.0, "reruns": 5.0}, "", 70.0)
    head, row = up.table("1.9.0", [fig])[1:]
    assert row.split() == ["classification", "(DDP)", "120", "4", "3", "110", "1", "0", "0", "35", "70"]
    assert head.split()[:3] == ["domain", "tests", "skipped"]
    part = up.as_json("1.9.0", [fig])["parts"][0]
    assert (part["ddp"], part["passed_unpatched"], part["findings"][0]["nodeid"]) == (True, 110, "unittests/x.py::t")
    json.dumps(part)


def test_a_sample_keeps_every_function_and_the_same_ids_each_time():
    ids = ([f"unittests/a.py::test_f[{i}]" for i in range(1000)]
           + ["unittests/a.py::test_g[x]", "unittests/a.py::test_h"])
    kept = plugin.sampled(ids, 10)
    assert kept == plugin.sampled(list(reversed(ids)), 10)  # by the ids alone
    assert {"unittests/a.py::test_g[x]", "unittests/a.py::test_h"} <= kept  # a function of one id keeps it
    assert 60 < sum(i.startswith("unittests/a.py::test_f") for i in kept) < 140
    assert plugin.sampled(ids, 1) == set(ids)


def test_a_sample_for_every_domain_or_some():
    assert up.parse_sample(None) == {} and up.parse_sample("1") == {}
    assert up.parse_sample("4") == {"": 4}
    assert up.parse_sample("classification=10, aggregation=2") == {"classification": 10, "bases": 2}
    for bad in ("classfication=10", "ten", "classification=0"):
        with pytest.raises(SystemExit, match="--sample"):
            up.parse_sample(bad)
    runner = up.Runner("python", "1.9.0", "/t", "/t", jobs=1, sample={"classification": 10})
    sampled = runner.command(up.Part("classification", False), "r.jsonl", None, ["unittests/classification"])
    assert ("--upstream-sample", "10") in zip(sampled, sampled[1:])
    assert "--upstream-sample" not in runner.command(up.Part("bases", False), "r.jsonl", None, ["unittests/bases"])
    rerun = runner.command(up.Part("classification", False), "r.jsonl", "ids.txt", ["unittests/a.py"], 2)
    assert "--upstream-sample" not in rerun  # a rerun runs the ids it names
