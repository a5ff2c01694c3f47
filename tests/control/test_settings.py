"""tmpatch.control.settings: the one table of settings, and the run-time policies."""
from __future__ import annotations

import inspect
import os
import subprocess
import sys

import pytest

import tmpatch
from tmpatch import cli
from tmpatch.control import env, selection, settings
from tmpatch.runtime import policies

pytestmark = pytest.mark.once  # nothing here depends on the torchmetrics release


def child(code: str, **variables: str) -> subprocess.CompletedProcess:
    """``python -S -c code`` with this process's path and only the TMPATCH* ``variables``
    (Python writes bytecode unless ``variables`` say otherwise)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TMPATCH") and k != "PYTHONDONTWRITEBYTECODE"}
    environ["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in sys.path if p and os.path.isdir(p))
    environ.update(variables)
    return subprocess.run([sys.executable, "-S", "-c", code], env=environ, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, timeout=120)


def test_every_setting_once_with_a_variable_a_form_and_a_help_line():
    names = [setting.name for setting in settings.SETTINGS]
    variables = [setting.variable for setting in settings.SETTINGS]
    assert len(set(names)) == len(names) and len(set(variables)) == len(variables)
    assert variables[0] == "TMPATCH" and all(v.startswith("TMPATCH_") for v in variables[1:])
    for setting in settings.SETTINGS:
        assert setting.doc and setting.form and setting.placeholder
        if setting.policy:
            assert setting.keyword and setting.kind == settings.CHOICE
            assert setting.default == setting.choices[0] == policies.current[setting.name]
    assert set(settings.POLICIES) == {"nan_check", "bincount", "checks", "update_count"} == set(policies.current)


def test_every_keyword_setting_is_accepted_by_apply():
    parameters = inspect.signature(tmpatch.apply).parameters
    assert any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())  # the policies
    for setting in settings.SETTINGS:
        if setting.keyword and not setting.policy:
            assert setting.name in parameters, setting.name
        if setting.policy:
            for value in setting.choices:
                assert selection.check_policies({setting.name: value}) == {setting.name: value}


def test_the_help_and_the_run_command_name_every_variable(capsys):
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    text = capsys.readouterr().out
    run_options = {action.dest for action in cli.build_parser()._subparsers._group_actions[0].choices["run"]._actions}
    for setting in settings.SETTINGS:
        assert f"{setting.variable}={setting.placeholder}" in text, setting.variable
        if setting.kind != settings.SWITCH:
            assert setting.name in run_options, setting.name


@pytest.mark.parametrize("value, error, fragment", [
    ("later", ValueError, "nan_check must be one of deferred, eager, off; got 'later'"),
    ("EAGER", ValueError, "one of deferred, eager, off"),
    (1, TypeError, "nan_check must be a string, one of deferred, eager, off; got int 1"),
    (None, TypeError, "got NoneType None"),
])
def test_set_policy_checks_the_value(value, error, fragment):
    with pytest.raises(error, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        settings.set_policy("nan_check", value)
    assert policies.current["nan_check"] == "deferred"


def test_set_policy_of_an_unknown_name():
    with pytest.raises(KeyError, match="policies: nan_check, bincount"):
        settings.set_policy("nancheck", "off")


def test_policies_start_from_the_environment_quietly_and_are_reported_once_by_apply():
    """A bad value keeps the default; importing says nothing; the first apply()
    warns once (the second does not)."""
    code = ("import tmpatch.control.settings; from tmpatch.runtime.policies import current as p; "
            "print(p['nan_check'], p['bincount'], flush=True); "
            "import sys; sys.stderr.write('IMPORTED\\n'); sys.stderr.flush(); "
            "sys.modules['torchmetrics'] = None; import warnings; warnings.simplefilter('ignore'); "
            "import tmpatch; tmpatch.apply(); tmpatch.apply()")
    proc = child(code, TMPATCH_NAN_CHECK="Eager", TMPATCH_BINCOUNT="sometimes")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["eager", "deferred"]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines[0] == "IMPORTED", proc.stderr  # nothing at import
    assert len(lines) == 2, proc.stderr
    assert lines[1].startswith("tmpatch: TMPATCH_BINCOUNT='sometimes' not understood; use one of deferred, eager")


@pytest.mark.parametrize("bytecode", ["written", "not written"])
def test_the_registry_imports_nothing_but_os(bytecode):
    """Where Python writes no bytecode, tmpatch's own cache of it comes too (importlib.machinery)."""
    variables = {"PYTHONDONTWRITEBYTECODE": "1"} if bytecode == "not written" else {}
    proc = child("import sys; before = set(sys.modules); import tmpatch.control.settings, tmpatch.control.env; "
                 "print(' '.join(sorted(set(sys.modules) - before)))", **variables)
    assert proc.returncode == 0, proc.stderr
    # os and its helpers are loaded by ``site`` in every normal start-up (the child runs without it)
    site = {"os", "os.path", "posixpath", "genericpath", "stat", "_stat", "_collections_abc", "__future__"}
    ours = {"tmpatch", "tmpatch.control", "tmpatch.control.settings", "tmpatch.control.env", "tmpatch.runtime",
            "tmpatch.runtime.policies"}
    if variables:  # importlib (and warnings) are loaded by ``site`` in every normal start-up too
        ours |= {"tmpatch.engine", "tmpatch.engine.bytecode", "importlib", "importlib._bootstrap",
                 "importlib._bootstrap_external", "importlib.machinery", "warnings"}
    assert set(proc.stdout.split()) <= ours | site, proc.stdout


def test_announce_says_each_message_once():
    said = []
    settings.announce(["tmpatch-test: once"], said.append)
    settings.announce(["tmpatch-test: once", "tmpatch-test: other"], said.append)
    assert said == ["tmpatch-test: once", "tmpatch-test: other"]


def test_env_reads_the_policies_with_the_same_parser():
    for setting in settings.POLICIES.values():
        for value in setting.choices:
            assert env.read({setting.variable: value.upper()}).policies == {setting.name: value}
            assert settings._from_env(setting.name, {setting.variable: value.upper()}) == value
        assert settings._from_env(setting.name, {setting.variable: "bogus"}) == setting.default
