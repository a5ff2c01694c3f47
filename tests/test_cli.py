"""The ``tmpatch`` command: status, run, audit, help (in-process where possible)."""
from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
import types

import pytest
import torchmetrics

import tmpatch
from tmpatch import cli, patches as catalogue
from tmpatch.bootstrap import DIRECTORY as BOOT
from tmpatch.control import settings
from tmpatch.control.report import State
from tmpatch.patches import NAMES

pytestmark = pytest.mark.once  # nothing here depends on the torchmetrics release


@pytest.fixture(autouse=True)
def _no_tmpatch_variables(monkeypatch):
    for name in [n for n in os.environ if n.startswith("TMPATCH")]:
        monkeypatch.delenv(name)


def run_cli(*argv: str, env=None, timeout: float = 120) -> subprocess.CompletedProcess:
    """``python -m tmpatch ARGV`` in an empty directory, with this process's path."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TMPATCH")}
    environ["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in sys.path if p and os.path.isdir(p))
    environ.update(env or {})
    with tempfile.TemporaryDirectory() as empty:
        return subprocess.run([sys.executable, "-m", "tmpatch", *argv], env=environ, cwd=empty,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=timeout)


# -- status ------------------------------------------------------------------------
def test_status_prints_the_table_and_exits_by_the_states(capsys):
    code = cli.main(["status"])
    out = capsys.readouterr().out
    report = tmpatch.status()
    assert out.strip() == str(report)
    assert out.splitlines()[0].split() == ["patch", "state", "release", "target", "reason"]
    assert all(name in out for name in NAMES) and torchmetrics.__version__ in out
    assert {row.state for row in report} <= {State.APPLIED, State.NOT_NEEDED, *State.PROBLEMS}
    assert code == (1 if any(row.state in State.PROBLEMS for row in report) else 0)


def test_status_json_and_selection(capsys):
    cli.main(["status", "--json", "--patches", "safe_divide,cumsum_device", "--exclude", "cumsum_device"])
    rows = json.loads(capsys.readouterr().out)
    assert rows == tmpatch.status().to_dict()
    states = {row["name"]: row["state"] for row in rows}
    assert states["safe_divide"] in (State.APPLIED, State.NOT_NEEDED)
    assert all(states[name] == State.EXCLUDED for name in NAMES if name != "safe_divide")
    assert set(rows[0]) == {"name", "target", "state", "reason", "release", "code_compared_with", "code_differs"}
    # the release's own code: compared with its wheel, no target differs
    assert {row["code_compared_with"] for row in rows} == {torchmetrics.__version__}
    assert not any(row["code_differs"] for row in rows)


def test_status_takes_its_defaults_from_the_environment(capsys, monkeypatch):
    monkeypatch.setenv("TMPATCH_EXCLUDE", "safe_divide")
    cli.main(["status", "--json"])
    states = {row["name"]: row["state"] for row in json.loads(capsys.readouterr().out)}
    assert states["safe_divide"] == State.EXCLUDED


def test_status_fits_120_columns_and_says_where_targets_are_whole(capsys):
    cli.main(["status"])
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 120, out
    for row in tmpatch.status():
        assert row.reason.split()[0] in out
    if any(len(row.target) > 60 for row in tmpatch.status()):
        assert "(+" in out and "tmpatch status -v" in out  # a clipped multi-target cell says how many more


@pytest.mark.parametrize("flag", ["-v", "--wide", "--verbose"])
def test_status_verbose_shows_each_patch_whole(capsys, flag):
    code = cli.main(["status", flag])
    out = capsys.readouterr().out
    flat = " ".join(out.split())
    assert out.startswith(f"torchmetrics {torchmetrics.__version__}\n")
    for row in tmpatch.status():
        patch = catalogue.load(row.name)
        assert f"\n{row.name}: {row.state}\n" in out
        for target in patch.targets:  # every target, whole, on a line of its own
            assert re.search(rf"^ +(targets? +)?{re.escape(target.path)}$", out, re.M), target.path
        for text in (row.reason, patch.summary, patch.upstream):
            assert " ".join(text.split()) in flat
    assert all(len(line) <= 120 for line in out.splitlines() if "torchmetrics." not in line)
    assert "policies: nan_check=deferred, bincount=deferred" in out
    assert code in (0, 1)


def test_status_verbose_leaves_empty_fields_out_and_shows_the_others(capsys, monkeypatch):
    patch = catalogue.load("safe_divide")
    other = catalogue.load("cumsum_device")
    monkeypatch.setattr(catalogue, "_loaded", dict(
        catalogue._loaded,
        safe_divide=dataclasses.replace(patch, changes="the zero-division result is 0, not num (1.0-1.3)", upstream=""),
        cumsum_device=dataclasses.replace(other, changes="")))
    cli.main(["status", "-v", "--patches", "safe_divide,cumsum_device"])
    blocks = {block.split(":")[0]: block for block in capsys.readouterr().out.split("\n\n")[1:]}
    assert "  changes   the zero-division result is 0, not num (1.0-1.3)" in blocks["safe_divide"]
    assert "  upstream  " not in blocks["safe_divide"]
    assert "changes" not in blocks["cumsum_device"] and "  upstream  #2608" in blocks["cumsum_device"]
    assert "  defect    " in blocks["mean_default_weight"]  # excluded rows are described too


def test_status_json_verbose_adds_the_patch_fields(capsys):
    cli.main(["status", "--json", "--wide"])
    rows = json.loads(capsys.readouterr().out)
    for row in rows:
        patch = catalogue.load(row["name"])
        assert row["targets"] == [target.path for target in patch.targets]
        assert (row["summary"], row["upstream"], row["changes"]) == (patch.summary, patch.upstream, patch.changes)
        assert set(row) == {"name", "target", "state", "reason", "release", "targets", "summary", "upstream",
                            "changes", "requires", "known", "code_compared_with", "code_differs"}


def test_status_reports_bad_variables_once_on_stderr(capsys, monkeypatch):
    monkeypatch.setattr(settings, "_announced", set())
    monkeypatch.setenv("TMPATCH_PATCHES", ",,")
    monkeypatch.setenv("TMPATCH_NANCHECK", "off")
    cli.main(["status", "--json"])
    captured = capsys.readouterr()
    assert set(row["state"] for row in json.loads(captured.out)) == {State.EXCLUDED}  # ",," is none, not all
    lines = captured.err.splitlines()
    assert len(lines) == 2, captured.err
    assert lines[0].startswith("tmpatch: TMPATCH_PATCHES=',,' names no patch")
    assert "did you mean TMPATCH_NAN_CHECK?" in lines[1]


@pytest.mark.parametrize("argv", [
    ["status", "--patches", "safe_divid"],
    ["run", "--exclude", "nope", "--", "true"],
])
def test_unknown_patch_names_are_a_usage_error(capsys, argv):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "unknown patch name" in err and all(name in err for name in NAMES)


# -- help and usage -----------------------------------------------------------------
def test_help_explains_commands_environment_and_exit_codes(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for text in ("status", "run", "audit", "TMPATCH=1", "TMPATCH_PATCHES=NAMES", "TMPATCH_EXCLUDE",
                 "TMPATCH_STRICT", "TMPATCH_LOG_LEVEL", "TMPATCH_NAN_CHECK=deferred|eager|off",
                 "TMPATCH_BINCOUNT=deferred|eager", "exit status", "usage error", "tmpatch run -- python",
                 "tmpatch status -v"):
        assert text in out, text


@pytest.mark.parametrize("argv", [[], ["run"], ["run", "--"], ["frobnicate"]])
def test_usage_errors_exit_2(capsys, argv):
    with pytest.raises(SystemExit) as exit_info:
        code = cli.main(argv)
        raise SystemExit(code)
    assert exit_info.value.code == 2


# -- run ----------------------------------------------------------------------------
def test_run_environment_prepends_the_bootstrap_directory_once():
    environ = cli.run_environ({"PYTHONPATH": os.pathsep.join(["/a", BOOT, "/b"]), "TMPATCH_EXCLUDE": "x"},
                              {"patches": ("safe_divide",), "strict": True})
    assert environ["TMPATCH"] == "1"
    assert environ["PYTHONPATH"].split(os.pathsep) == [BOOT, "/a", "/b"]
    assert environ["TMPATCH_PATCHES"] == "safe_divide" and environ["TMPATCH_STRICT"] == "1"
    assert environ["TMPATCH_EXCLUDE"] == "x"  # companions already set are kept
    assert os.path.isfile(os.path.join(BOOT, "sitecustomize.py"))


def test_run_has_an_option_per_setting(monkeypatch):
    seen = {}
    monkeypatch.setattr(os, "execvpe", lambda file, argv, environ: seen.update(environ) or 0)
    monkeypatch.setattr(os, "name", "posix")
    cli.main(["run", "--nan-check", "eager", "--bincount", "eager", "--strict", "--log-level", "info",
              "--exclude", "gather_autograd", "--", "true"])
    assert {k: v for k, v in seen.items() if k.startswith("TMPATCH")} == {
        "TMPATCH": "1", "TMPATCH_NAN_CHECK": "eager", "TMPATCH_BINCOUNT": "eager", "TMPATCH_STRICT": "1",
        "TMPATCH_LOG_LEVEL": "info", "TMPATCH_EXCLUDE": "gather_autograd"}


def test_run_execs_the_command_with_the_environment_and_its_exit_code():
    code = ("import json, os, sys; "
            "print(json.dumps({k: v for k, v in os.environ.items() if k.startswith(('TMPATCH', 'PYTHONPATH'))})); "
            "sys.exit(3)")
    proc = run_cli("run", "--patches", "safe_divide", "--log-level", "debug", "--",
                   sys.executable, "-S", "-c", code, env={"TMPATCH_EXCLUDE": "gather_autograd"})
    assert proc.returncode == 3, proc.stderr
    seen = json.loads(proc.stdout)
    assert seen["TMPATCH"] == "1" and seen["PYTHONPATH"].split(os.pathsep)[0] == BOOT
    assert seen["TMPATCH_PATCHES"] == "safe_divide" and seen["TMPATCH_LOG_LEVEL"] == "debug"
    assert seen["TMPATCH_EXCLUDE"] == "gather_autograd"


def test_run_without_double_dash_and_a_missing_command():
    assert run_cli("run", sys.executable, "-S", "-c", "import sys; sys.exit(0)").returncode == 0
    proc = run_cli("run", "--", "no-such-command-tmpatch")
    assert proc.returncode == 127 and "command not found: no-such-command-tmpatch" in proc.stderr


# -- audit --------------------------------------------------------------------------
def test_audit_hands_over_its_arguments(monkeypatch):
    seen = []
    fake = types.ModuleType("tmpatch.audit.cli")
    fake.main = lambda argv: seen.append(argv) or 1
    monkeypatch.setitem(sys.modules, "tmpatch.audit.cli", fake)
    assert cli.main(["audit", "--help", "-k", "x"]) == 1
    assert seen == [["--help", "-k", "x"]]


def test_audit_missing_is_exit_2_with_a_clear_message(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tmpatch.audit.cli", None)
    assert cli.main(["audit"]) == 2
    assert "tmpatch audit: not available" in capsys.readouterr().err


def test_a_reader_that_closes_the_pipe_early_gets_no_traceback():
    """``tmpatch status | head -1``: the command ends quietly, exit 0, nothing on stderr."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p and os.path.isdir(p)))
    proc = subprocess.Popen([sys.executable, "-m", "tmpatch", "status", "-v"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)
    assert proc.stdout.readline()
    proc.stdout.close()  # the reader goes away before the table is written out
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) in (0, 1) and "Traceback" not in err and "BrokenPipe" not in err, err
