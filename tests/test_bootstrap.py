"""Auto-apply from the environment: the tmpatch.pth line and the sitecustomize.

Children run with ``python -S`` (no site processing: an installed tmpatch.pth
or sitecustomize cannot interfere) and do what ``site`` would do themselves:
``exec`` the .pth line, ``import sitecustomize``. Most use a fake torchmetrics
(a version and nothing else, so no torch import); one uses the real release.
tools/install_check.sh checks the same on real wheel and editable installs.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from typing import Dict, Optional, Sequence

import pytest

import tmpatch.bootstrap
from tests.conftest import edited_release, lazily_imported_patches
from tmpatch.patches import NAMES

pytestmark = pytest.mark.once  # nothing here depends on the torchmetrics release

PTH_LINE = tmpatch.bootstrap.pth_line()
BOOT = tmpatch.bootstrap.DIRECTORY


def child(code: str, env: Optional[Dict[str, str]] = None, path: Sequence[str] = ()) -> subprocess.CompletedProcess:
    """``python -S -c code`` with this process's path after ``path``, no TMPATCH* but ``env``,
    in an empty directory (``-c`` puts the working directory first on sys.path)."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TMPATCH")}
    entries = [os.path.abspath(p) for p in sys.path if p and os.path.isdir(p)]
    environ["PYTHONPATH"] = os.pathsep.join([*path, *entries])
    environ.update(env or {})
    with tempfile.TemporaryDirectory() as empty:
        return subprocess.run(
            [sys.executable, "-S", "-c", f"PTH_LINE = {PTH_LINE!r}\n" + textwrap.dedent(code)],
            env=environ, cwd=empty, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120,
        )


def ok(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert proc.returncode == 0, f"child failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc


def stderr_lines(proc: subprocess.CompletedProcess):
    return [line for line in proc.stderr.splitlines() if line.strip()]


@pytest.fixture
def fake_tm(tmp_path):
    """A directory holding a fake torchmetrics 1.4.0 (no torch, no targets)."""
    package = tmp_path / "fake" / "torchmetrics"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text('__version__ = "1.4.0"\n')
    return str(tmp_path / "fake")


@pytest.fixture
def odd_tm(fake_tm):
    """The fake torchmetrics with a ``_safe_divide`` tmpatch does not recognise."""
    package = os.path.join(fake_tm, "torchmetrics")
    os.makedirs(os.path.join(package, "utilities"))
    open(os.path.join(package, "utilities", "__init__.py"), "w").close()
    with open(os.path.join(package, "utilities", "compute.py"), "w") as handle:
        handle.write("def _safe_divide(num, denom):\n    return num / denom  # not a release's code\n")
    with open(os.path.join(package, "__init__.py"), "a") as handle:
        handle.write("from torchmetrics.utilities import compute\n")
    return fake_tm


# -- the .pth line --------------------------------------------------------------
def test_pth_line_is_one_gated_import_line():
    assert "\n" not in PTH_LINE and PTH_LINE.startswith("import os, sys;")
    assert "torch" not in PTH_LINE and "TMPATCH" in PTH_LINE


@pytest.mark.parametrize("value, called", [
    (None, False), ("", False), ("0", False), ("off", False), ("No", False),
    ("1", True), ("true", True), ("maybe", True),  # an unknown word is reported by the bootstrap
])
def test_pth_line_calls_the_bootstrap_only_with_the_variable(monkeypatch, value, called):
    calls = []
    monkeypatch.setattr(tmpatch.bootstrap, "from_pth", lambda: calls.append(1))
    monkeypatch.setattr(sys, "_tmpatch_pth_ran", False, raising=False)
    if value is None:
        monkeypatch.delenv("TMPATCH", raising=False)
    else:
        monkeypatch.setenv("TMPATCH", value)
    exec(PTH_LINE, {})
    exec(PTH_LINE, {})  # site may process a .pth twice (seen in venvs): once is done
    assert calls == ([1] if called else [])


def test_without_the_variable_the_pth_line_imports_nothing():
    proc = ok(child("""
        import sys
        exec(PTH_LINE)
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("tmpatch", "torch", "torchmetrics", "wrapt")))
    """, env={"TMPATCH": "0"}))
    assert proc.stdout.strip() == "[]" and proc.stderr == ""


def test_the_bootstrap_imports_nothing_beyond_tmpatch_itself():
    """Start-up cost: arming adds tmpatch.bootstrap, tmpatch.control.env and the settings
    table to what ``import tmpatch`` costs (benchmarks/startup.py measures it)."""
    proc = ok(child("""
        import sys
        import tmpatch
        before = set(sys.modules)
        exec(PTH_LINE)
        print(" ".join(sorted(set(sys.modules) - before)))
    """, env={"TMPATCH": "1"}))
    # os and its helpers are loaded by ``site`` in every normal start-up (the child runs without it)
    stdlib_of_site = {"os", "os.path", "posixpath", "genericpath", "stat", "_stat", "_collections_abc"}
    allowed = {"tmpatch.bootstrap", "tmpatch.control", "tmpatch.control.env", "tmpatch.control.settings",
               "tmpatch.runtime", "tmpatch.runtime.policies", "_thread"} | stdlib_of_site
    assert set(proc.stdout.split()) <= allowed, proc.stdout


def test_pth_route_is_lazy_then_patches_the_real_release():
    proc = ok(child("""
        import json, sys
        exec(PTH_LINE)
        loaded = sorted(m for m in ("torch", "torchmetrics") if m in sys.modules)
        import tmpatch.bootstrap as boot
        started, state = boot.started, boot.state
        import torchmetrics
        import tmpatch
        from torchmetrics.utilities import compute
        f_beta = sys.modules["torchmetrics.functional.classification.f_beta"]  # binds _safe_divide by name
        from tmpatch.control import api
        from tmpatch.engine import cache
        print(json.dumps({
            "loaded": loaded, "started": started, "state": state, "after": boot.state,
            "states": tmpatch.status().states(),
            "patched": tmpatch.is_patched(compute._safe_divide),
            "bound": f_beta._safe_divide is compute._safe_divide,
            "end": "torchmetrics" in api.armed(), "unwritten": sum(map(len, cache._new.values())),
        }))
    """, env={"TMPATCH": "1"}))
    out = json.loads(proc.stdout)
    # torchmetrics' own post-import hook fired when its import ended: what it computed is on disk
    assert (out["end"], out["unwritten"]) == (False, 0)
    assert out["loaded"] == [], "start-up imported " + ", ".join(out["loaded"])
    assert (out["started"], out["state"], out["after"]) == ("pth", "armed", "applied")
    assert {n for n, s in out["states"].items() if s == "pending"} <= lazily_imported_patches(), out["states"]
    assert "off" not in out["states"].values()
    safe_divide = out["states"]["safe_divide"]
    assert safe_divide in ("applied", "not-needed")
    assert out["patched"] == (safe_divide == "applied") and out["bound"]


# -- the sitecustomize (tmpatch run) --------------------------------------------
@pytest.mark.parametrize("with_pth", [False, True], ids=["sitecustomize", "pth+sitecustomize"])
def test_sitecustomize_applies_chains_the_users_and_bootstraps_once(tmp_path, fake_tm, with_pth):
    user = tmp_path / "user"
    user.mkdir()
    marker = tmp_path / "user-sitecustomize-ran"
    (user / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'w').close()\nUSER = True\n")
    proc = ok(child(f"""
        import json, os, sys
        if {with_pth}:
            exec(PTH_LINE)
        import sitecustomize  # what site does
        import tmpatch.bootstrap as boot
        import torchmetrics, tmpatch
        print(json.dumps({{
            "started": boot.started,
            "triggers": sum(isinstance(f, boot.Trigger) for f in sys.meta_path),
            "module": getattr(sys.modules["sitecustomize"], "USER", False),
            "boot_on_path": any(os.path.realpath(p) == os.path.realpath({BOOT!r}) for p in sys.path if p),
            "states": tmpatch.status().states(),
        }}))
    """, env={"TMPATCH": "1"}, path=[BOOT, str(user), fake_tm]))
    out = json.loads(proc.stdout)
    assert marker.exists(), "the user's sitecustomize did not run"
    assert out["module"] and not out["boot_on_path"]
    assert out["started"] == ("pth" if with_pth else "sitecustomize")
    assert out["triggers"] == 1
    states = out["states"]
    assert states["safe_divide"] == "pending" and "off" not in states.values()  # the fake has no targets
    assert proc.stderr == ""


def test_sitecustomize_without_a_users_one_stays_and_is_quiet(fake_tm):
    proc = ok(child("""
        import sys
        import sitecustomize
        print(sitecustomize.__name__, sitecustomize.__file__)
    """, env={"TMPATCH": "1"}, path=[BOOT, fake_tm]))
    assert os.path.dirname(proc.stdout.split()[1]) == BOOT and proc.stderr == ""


# -- reporting: bad values, errors, strict, log level ---------------------------
def test_bad_values_one_warning_each_and_the_rest_applies(fake_tm):
    proc = ok(child("""
        import json
        exec(PTH_LINE)
        import torchmetrics, tmpatch
        print(json.dumps(tmpatch.status().states()))
    """, env={"TMPATCH": "1", "TMPATCH_PATCHES": "safe_divide,bogus", "TMPATCH_STRICT": "perhaps",
              "TMPATCH_EXLUDE": "cumsum_device", "TMPATCH_DDP_RELEASES": "all"}, path=[fake_tm]))
    states = json.loads(proc.stdout)
    assert states["safe_divide"] == "pending"
    assert all(state == "excluded" for name, state in states.items() if name != "safe_divide")
    lines = stderr_lines(proc)
    assert len(lines) == 3, proc.stderr
    strict = [line for line in lines if "TMPATCH_STRICT: unknown patch name(s) 'perhaps'" in line
              and "strict about no patch" in line]
    names = [line for line in lines if "'bogus'" in line]
    unknown = [line for line in lines if "TMPATCH_EXLUDE is not a tmpatch variable" in line
               and "did you mean TMPATCH_EXCLUDE?" in line]
    assert len(strict) == len(names) == len(unknown) == 1
    assert all(name in names[0] for name in NAMES)


@pytest.mark.parametrize("route", ["pth", "sitecustomize"])
def test_policy_variables_are_checked_at_start_up_and_said_once(fake_tm, route):
    """TMPATCH_NAN_CHECK/TMPATCH_BINCOUNT: a bad value or a misspelt name is one
    line at start-up, not repeated by apply(); a good value is the policy."""
    start = "exec(PTH_LINE)" if route == "pth" else "import sitecustomize"
    proc = ok(child(f"""
        {start}
        import sys
        sys.stderr.write("STARTED\\n")
        import torchmetrics, tmpatch
        tmpatch.apply()
        from tmpatch.runtime import policies
        print(policies.current["nan_check"], policies.current["bincount"])
    """, env={"TMPATCH": "1", "TMPATCH_NAN_CHECK": "Eager", "TMPATCH_BINCOUNT": "",
              "TMPATCH_NANCHECK": "off"}, path=[BOOT, fake_tm] if route == "sitecustomize" else [fake_tm]))
    assert proc.stdout.split() == ["eager", "deferred"]
    lines = stderr_lines(proc)
    assert lines[-1] == "STARTED", proc.stderr  # everything said at start-up, nothing after
    assert len(lines) == 3, proc.stderr
    assert any(line.startswith("tmpatch: TMPATCH_BINCOUNT='' is empty; use one of deferred, eager") for line in lines)
    assert any(line.startswith("tmpatch: TMPATCH_NANCHECK is not a tmpatch variable, ignored; did you mean "
                               "TMPATCH_NAN_CHECK?") for line in lines)


def test_an_empty_patches_list_applies_no_patch(fake_tm):
    proc = ok(child("""
        import json
        exec(PTH_LINE)
        import torchmetrics, tmpatch
        print(json.dumps(tmpatch.status().states()))
    """, env={"TMPATCH": "1", "TMPATCH_PATCHES": ",,"}, path=[fake_tm]))
    assert set(json.loads(proc.stdout).values()) == {"excluded"}
    lines = stderr_lines(proc)
    assert len(lines) == 1 and "TMPATCH_PATCHES=',,' names no patch" in lines[0], proc.stderr


def _broken_tmpatch(tmp_path) -> str:
    broken = tmp_path / "broken"
    (broken / "tmpatch").mkdir(parents=True)
    (broken / "tmpatch" / "__init__.py").write_text("raise RuntimeError('tmpatch is broken here')\n")
    return str(broken)


@pytest.mark.parametrize("where", ["pth import", "sitecustomize import", "apply"])
def test_an_error_prints_one_line_and_the_program_runs_on(tmp_path, fake_tm, where):
    if where == "pth import":
        code, path = "exec(PTH_LINE)\nexec(PTH_LINE)\n", [_broken_tmpatch(tmp_path)]  # one line, not two
    elif where == "sitecustomize import":
        code, path = "import sitecustomize\n", [BOOT, _broken_tmpatch(tmp_path)]
    else:
        code = ("import tmpatch.control.api\n"
                "def boom(*a, **k): raise ZeroDivisionError('apply broke')\n"
                "tmpatch.control.api.apply_from = boom\n"
                "exec(PTH_LINE)\n"
                "import torchmetrics, tmpatch.bootstrap\n"
                "assert tmpatch.bootstrap.state.startswith('failed'), tmpatch.bootstrap.state\n")
        path = [fake_tm]
    proc = ok(child(code + "print('ran on')\n", env={"TMPATCH": "1"}, path=path))
    assert proc.stdout.strip() == "ran on"
    lines = stderr_lines(proc)
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("tmpatch: ") and "runs on unpatched" in lines[0]
    assert ("broken here" if "import" in where else "apply broke") in lines[0]


def _strict_import(patch, env, release):
    """A child that imports ``release`` (a torchmetrics folder) with the .pth line and ``env``, printing
    the TmpatchError it raises or ``patch``'s state."""
    return ok(child(f"""
        exec(PTH_LINE)
        import tmpatch
        try:
            import torchmetrics
        except tmpatch.TmpatchError as exc:
            print("error:", exc)
        else:
            print("imported:", tmpatch.status()[{patch!r}].state)
    """, env=env, path=[release]))


@pytest.mark.parametrize("strict", [False, True])
def test_strict_makes_a_patch_that_cannot_apply_fail_the_import(odd_tm, strict):
    env = {"TMPATCH": "1", "TMPATCH_PATCHES": "safe_divide", "TMPATCH_LOG_LEVEL": "info"}
    if strict:
        env["TMPATCH_STRICT"] = "1"
    proc = _strict_import("safe_divide", env, odd_tm)
    if strict:
        assert proc.stdout.startswith("error: ") and "safe_divide (mismatch" in proc.stdout
    else:
        assert proc.stdout.strip() == "imported: mismatch"
    # TMPATCH_LOG_LEVEL: tmpatch's records go to stderr through its own handler
    assert any(line.startswith("WARNING [pid ") and "safe_divide" in line for line in stderr_lines(proc))


@pytest.fixture(scope="module")
def changed_tm(tmp_path_factory):
    """This torchmetrics, with the code of one target of image_constants changed (as a release to come may)."""
    return edited_release(str(tmp_path_factory.mktemp("changed")),
                          {"torchmetrics.functional.image.ssim:_ssim_update": "preds = preds  # changed"})


@pytest.mark.parametrize("strict, raises", [("1", True), ("image_constants", True), ("safe_divide,nan_check", False)])
def test_strict_raises_only_for_the_patches_asked_naming_the_target_left_alone(changed_tm, strict, raises):
    proc = _strict_import("image_constants", {"TMPATCH": "1", "TMPATCH_STRICT": strict}, changed_tm)
    if raises:
        assert proc.stdout.startswith(f"error: tmpatch (TMPATCH_STRICT={strict}): could not apply image_constants "
                                      "(partial: "), proc.stdout
        assert "left alone: torchmetrics.functional.image.ssim._ssim_update (code not recognised" in proc.stdout
        assert proc.stdout.count(" (partial: ") == 1 and "mismatch" not in proc.stdout  # nothing else to say
    else:
        assert proc.stdout.strip() == "imported: partial", proc.stdout + proc.stderr


def test_strict_about_a_patch_left_out_is_one_line_and_the_program_runs_on(fake_tm):
    proc = ok(child("""
        exec(PTH_LINE)
        import torchmetrics, tmpatch.bootstrap
        print(tmpatch.bootstrap.state)
    """, env={"TMPATCH": "1", "TMPATCH_STRICT": "safe_divide", "TMPATCH_EXCLUDE": "safe_divide"}, path=[fake_tm]))
    assert proc.stdout.startswith("failed: ValueError: tmpatch.apply(strict=...) names safe_divide, not among")
    lines = stderr_lines(proc)
    assert len(lines) == 1 and "runs on unpatched" in lines[0], proc.stderr
