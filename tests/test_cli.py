"""The ``tmpatch`` command: status, run, audit, help (in-process where possible)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import types

import pytest

import tmpatch
from tmpatch import cli
from tmpatch.bootstrap import DIRECTORY as BOOT
from tmpatch.patches import NAMES
from tmpatch.report import State

import torchmetrics  # noqa: E402  (status imports it; import it once here)


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
    assert set(rows[0]) == {"name", "target", "state", "reason", "release"}


def test_status_takes_its_defaults_from_the_environment(capsys, monkeypatch):
    monkeypatch.setenv("TMPATCH_EXCLUDE", "safe_divide")
    cli.main(["status", "--json"])
    states = {row["name"]: row["state"] for row in json.loads(capsys.readouterr().out)}
    assert states["safe_divide"] == State.EXCLUDED


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
    for text in ("status", "run", "audit", "TMPATCH=1", "TMPATCH_PATCHES", "TMPATCH_EXCLUDE",
                 "TMPATCH_STRICT", "TMPATCH_LOG_LEVEL", "exit status", "usage error", "tmpatch run -- python"):
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
