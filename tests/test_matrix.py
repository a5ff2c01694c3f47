"""tools/matrix.py: the release matrix holds a release of every upstream implementation
that a patch recognises, so each variant's replacement runs in the suite."""
from __future__ import annotations

import importlib.util
import os
import sys
import time

import pytest
from packaging.version import Version

from tmpatch import patches as catalogue
from tmpatch.spec import describe

pytestmark = pytest.mark.once  # nothing here depends on the torchmetrics release

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _matrix_releases():
    spec = importlib.util.spec_from_file_location("tmpatch_tools_matrix", os.path.join(ROOT, "tools", "matrix.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return [Version(r) for r in module.RELEASES]


def test_every_variant_has_a_release_in_the_matrix():
    releases = _matrix_releases()
    missing = []
    for name in catalogue.NAMES:
        for target in catalogue.load(name).targets:
            for variant in target.variants:
                if not any(variant.releases.contains(r, prereleases=True) for r in releases):
                    missing.append(f"{name}: {target.path} {describe(variant.releases)}")
    assert not missing, "add a release of each to tools/matrix.py RELEASES:\n" + "\n".join(missing)


def _matrix_module():
    spec = importlib.util.spec_from_file_location("tmpatch_tools_matrix", os.path.join(ROOT, "tools", "matrix.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_plan_runs_every_supported_torch_with_releases_of_the_matrix():
    from tmpatch.audit.support import MIN_TORCH, TESTED_TORCH

    matrix = _matrix_module()
    planned = {t: set(releases) for t, releases in matrix.PLAN.items()}
    assert set().union(*planned.values()) == set(matrix.RELEASES)  # every release runs somewhere
    assert all(releases <= set(matrix.RELEASES) for releases in planned.values())
    others = [t for t in matrix.PLAN if t != matrix.CURRENT]
    assert sorted(others + ["2.13.0"]) == sorted(TESTED_TORCH)
    assert any(t.startswith(MIN_TORCH + ".") for t in others)
    # the anchors run the whole suite on the newest torches (FULL), each of them on one at least
    newest = [t for t in matrix.FULL if t != matrix.CURRENT]
    assert newest and all(any(a in planned[t] for t in newest) for a in matrix.ANCHORS)
    assert matrix.PLAN[matrix.CURRENT][0] == matrix.RELEASES[0]  # the ``once`` tests run with the CPU build
    # each torch's Python is one it has wheels for: the newest on the newest Python, another on 3.12
    assert matrix.PYTHONS.get("2.15.0") == "3.13" and "3.12" in matrix.PYTHONS.values()


def test_a_venv_is_made_with_its_own_constraints_and_python(monkeypatch, tmp_path):
    """A venv's pip reads a constraints file of the run's own (the torch asked for, whatever cap the
    machine's pip configuration sets), and is made with the Python of :data:`PYTHONS`."""
    matrix = _matrix_module()
    calls = []
    monkeypatch.setattr(matrix, "base_python", lambda version: "/py/" + version)

    def run(cmd, **kw):
        calls.append((cmd, kw.get("env")))
        return matrix.subprocess.CompletedProcess(cmd, 0, "")

    monkeypatch.setattr(matrix.subprocess, "run", run)
    python = str(tmp_path / "torch-9.9.9" / "bin" / "python")
    matrix._fill_venv("9.9.9", python, str(tmp_path / "done"))
    (make, _), (install, env) = calls
    assert make[0] == "/py/9.9.9" and make[-1] == str(tmp_path / "torch-9.9.9")
    assert "torch==9.9.9" in install
    with open(env["PIP_CONSTRAINT"]) as handle:
        assert handle.read().split() == ["torch==9.9.9"]


def test_venv_requirements_come_from_setup_cfg():
    matrix = _matrix_module()
    old, new = matrix.requirements("2.1.2"), matrix.requirements("2.5.1")
    assert "numpy<2" in old and "numpy" in new and "numpy<2" not in new
    for reqs in (old, new):
        assert not [r for r in reqs if r.startswith("torch")]
        assert {"pytest", "hypothesis", "packaging", "lightning-utilities"} <= set(reqs)


def test_releases_before_1_0_get_pkg_resources_beside_them():
    """0.10/0.11 import ``pkg_resources``, which setuptools 81+ no longer has."""
    matrix = _matrix_module()
    assert matrix.extras("0.11.4") == matrix.extras("0.10.1") == [matrix.PKG_RESOURCES]
    assert matrix.extras("1.0.0") == matrix.extras("1.9.0") == []


def test_no_tests_collected_is_a_failure(monkeypatch, capsys):
    matrix = _matrix_module()
    monkeypatch.setattr(matrix, "install", lambda release, folder: None)
    monkeypatch.setattr(matrix, "_torch_of", lambda python: "x")
    monkeypatch.setattr(matrix, "run", lambda python, release, folder, args, first=False, explore="", processes=True,
                        full_counts=None: (5 if release == "1.4.0" else 0, 0.0, "no tests ran"))
    assert matrix.main(["-r", "1.4.0", "-r", "1.9.0"]) == 1
    assert capsys.readouterr().out.rstrip().splitlines()[-1] == "matrix: 1 passed, 1 failed"


def test_the_plan_gives_each_anchor_its_full_counts_once_on_a_torch_of_full(monkeypatch):
    """What each run of ``--plan`` is given: the CPU build's first release its machinery's tests alone
    (it runs whole on a newer torch), the anchors their full counts on a torch of FULL, the older
    torches their tests with a tenth of the examples, the releases between the anchors their tests."""
    matrix = _matrix_module()
    seen = {}

    def fake_run(python, release, folder, args, first=False, explore="", processes=True, full_counts=None):
        seen[(python, release)] = (list(args), first, full_counts, processes)
        return 0, 0.0, "1 passed"

    monkeypatch.setattr(matrix, "install", lambda release, folder: None)
    monkeypatch.setattr(matrix, "_torch_of", lambda python: "x")
    monkeypatch.setattr(matrix, "make_venv", lambda torch_version: torch_version)
    monkeypatch.setattr(matrix, "run", fake_run)
    assert matrix.main(["--plan"]) == 0
    current = {release: got for (python, release), got in seen.items() if python == sys.executable}
    first = matrix.PLAN[matrix.CURRENT][0]
    assert current[first][:2] == (["-m", "once or processes"], True)
    assert all(not got[1] and not got[2] and not got[3] for release, got in current.items() if release != first)
    full = {release for (python, release), got in seen.items() if got[2]}
    assert full == set(matrix.ANCHORS)
    for (python, release), (args, _, counts, _) in seen.items():
        if python in matrix.PLAN and python not in matrix.FULL:
            assert args == list(matrix.TORCH_TESTS) and not counts, (python, release)
    runs = [(python, release) for (python, release), got in seen.items() if got[2]]
    assert len(runs) == len(set(matrix.ANCHORS))  # each anchor's full counts run once


def test_a_stuck_run_is_killed_with_its_stacks(monkeypatch, tmp_path):
    matrix = _matrix_module()
    (tmp_path / "test_stuck.py").write_text("import time\n\ndef test_stuck():\n    time.sleep(600)\n")
    monkeypatch.setattr(matrix, "RUN_LIMIT", 8.0)
    code, seconds, output = matrix.run(sys.executable, "none", str(tmp_path), [str(tmp_path / "test_stuck.py")])
    assert code == 124 and seconds < 60
    assert "still running after 8s" in output and "test_stuck" in output  # where it was stuck


def test_a_run_draws_the_same_hypothesis_examples_and_keeps_no_database():
    """CI's outcome depends on the code alone: no example an earlier run saved is replayed."""
    from hypothesis import settings

    if os.environ.get("TMPATCH_HYPOTHESIS", "").lower() == "explore":
        pytest.skip("an exploring run (tools/matrix.py --explore)")
    assert settings.default.derandomize and settings.default.database is None


def test_explore_gives_each_run_fresh_draws_and_its_own_database(monkeypatch):
    matrix = _matrix_module()
    seen = {}

    class Process:
        returncode, pid = 0, 0

        def __init__(self, command, env, **options):
            seen.clear()
            seen.update(env)

        def communicate(self, timeout=None):
            return "", None

    monkeypatch.setattr(matrix.subprocess, "Popen", Process)
    monkeypatch.setenv("TMPATCH_HYPOTHESIS", "explore")  # the caller's variable does not leak into CI runs
    matrix.run(sys.executable, "1.9.0", "/nowhere", [])
    assert "TMPATCH_HYPOTHESIS" not in seen
    matrix.run(sys.executable, "1.9.0", "/nowhere", [], explore="2.13.0-1.9.0")
    assert seen["TMPATCH_HYPOTHESIS"] == "explore"
    assert seen["TMPATCH_HYPOTHESIS_DB"] == os.path.join(ROOT, ".hypothesis", "2.13.0-1.9.0")


def test_a_venv_is_made_once_by_concurrent_callers(monkeypatch, tmp_path):
    """``.venvs`` is shared by checkouts: a second caller waits for the first (a lock beside the
    venv) instead of clearing the venv it is filling, and finds it made."""
    import threading

    matrix = _matrix_module()
    python = str(tmp_path / "venvs" / "torch-9.9.9" / "bin" / "python")
    monkeypatch.setattr(matrix, "venv_python", lambda version: python)
    fills = []

    def fill(version, interpreter, done):
        fills.append(version)
        time.sleep(0.5)
        os.makedirs(os.path.dirname(done), exist_ok=True)
        open(done, "w").close()

    monkeypatch.setattr(matrix, "_fill_venv", fill)
    found = []
    threads = [threading.Thread(target=lambda: found.append(matrix.make_venv("9.9.9"))) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert fills == ["9.9.9"] and found == [python] * 3

def test_every_release_outside_the_anchors_changes_a_patch_and_runs_its_tests():
    """A release runs the tests of the patches whose code changes there: each release of the matrix
    changes some patch (else it adds nothing to the matrix), and those patches have tests."""
    matrix = _matrix_module()
    for release in matrix.RELEASES:
        changed = matrix.changed_patches(release, matrix.RELEASES)
        assert changed, f"{release}: no patch's code changes there"
        selected = matrix.selected_tests(release, matrix.RELEASES)
        for name in changed:
            assert set(matrix.patch_tests([name])) <= set(selected)
    oldest = min(matrix.RELEASES, key=Version)
    assert matrix.changed_patches(oldest, matrix.RELEASES) == list(catalogue.NAMES)


def test_every_patch_test_belongs_to_a_patch_or_runs_at_every_release():
    """No test file under tests/patches is left out of the releases between the anchors, and every
    path the selection names exists (a moved test file must move there too)."""
    matrix = _matrix_module()
    named = set(matrix.patch_tests(catalogue.NAMES)) | set(matrix.EVERY_RELEASE)
    folder = os.path.join(ROOT, "tests", "patches")
    files = {f"tests/patches/{entry}" for entry in os.listdir(folder)
             if entry.startswith("test_") and entry.endswith(".py")
             or os.path.isdir(os.path.join(folder, entry)) and not entry.startswith("__")}
    assert files - named == set()
    for path in named | set(matrix.TORCH_TESTS):
        assert os.path.exists(os.path.join(ROOT, path)), path


def test_a_release_outside_the_anchors_runs_what_changed_there():
    matrix = _matrix_module()
    assert matrix.ANCHORS and all(r in matrix.RELEASES for r in matrix.ANCHORS)
    assert matrix.changed_patches("1.7.4", matrix.RELEASES) == ["pearson_update"]  # tools/fingerprints.py
    assert "tests/patches/test_pearson_update.py" in matrix.selected_tests("1.7.4", matrix.RELEASES)
    assert "tests/patches/test_safe_divide.py" not in matrix.selected_tests("1.7.4", matrix.RELEASES)


def test_a_venv_pip_cannot_fill_is_removed_and_its_error_shows_pip(monkeypatch, tmp_path):
    """A failed ``pip install`` (a full disk, a torch the index lacks) names pip's own last lines and
    the free space, and leaves no half-made venv behind (gigabytes that nothing would use)."""
    matrix = _matrix_module()
    folder = tmp_path / "torch-9.9.9"
    monkeypatch.setattr(matrix, "base_python", lambda version: sys.executable)

    def run(cmd, **kw):
        if "venv" in cmd:
            (folder / "bin").mkdir(parents=True)
            return matrix.subprocess.CompletedProcess(cmd, 0)
        return matrix.subprocess.CompletedProcess(cmd, 1,
                                                  "Collecting torch\nERROR: [Errno 28] No space left on device\n")

    monkeypatch.setattr(matrix.subprocess, "run", run)
    with pytest.raises(RuntimeError, match=r"(?s)exited 1 \(.* GiB free now\).*No space left on device"):
        matrix._fill_venv("9.9.9", str(folder / "bin" / "python"), str(folder / ".tmpatch-ready"))
    assert not folder.exists()


def test_a_venv_is_not_begun_without_the_disk_it_needs(monkeypatch, tmp_path):
    matrix = _matrix_module()
    monkeypatch.setattr(matrix.shutil, "disk_usage", lambda path: matrix.shutil._ntuple_diskusage(100, 99, 2**30))
    monkeypatch.setattr(matrix.subprocess, "run", lambda *a, **k: pytest.fail("began making the venv"))
    with pytest.raises(RuntimeError, match=r"1\.0 GiB free .* torch 9\.9\.9 takes about 8 GiB"):
        matrix._fill_venv("9.9.9", str(tmp_path / "torch-9.9.9" / "bin" / "python"), str(tmp_path / "done"))


def test_prune_removes_each_venv_after_its_last_run_and_holds_few_at_once(monkeypatch, tmp_path, capsys):
    """CI (``--prune``): a venv of another torch goes with its torch's last run, and no more than
    LIVE_VENVS are on disk at once, whatever the order the runs end in."""
    import threading

    matrix = _matrix_module()
    torches = ("9.1", "9.2", "9.3", "9.4", "9.5")
    monkeypatch.setattr(matrix, "PLAN", {matrix.CURRENT: ("1.9.0",), **{t: ("1.4.0", "1.9.0") for t in torches}})
    monkeypatch.setattr(matrix, "LIVE_VENVS", 2)
    monkeypatch.setattr(matrix, "install", lambda release, folder: None)
    monkeypatch.setattr(matrix, "_torch_of", lambda python: "x")
    monkeypatch.setattr(matrix, "venv_python", lambda version: str(tmp_path / f"torch-{version}" / "bin" / "python"))
    lock, most = threading.Lock(), []

    def make_venv(version):
        (tmp_path / f"torch-{version}" / "bin").mkdir(parents=True)
        with lock:
            most.append(len(list(tmp_path.iterdir())))
        return matrix.venv_python(version)

    def run(python, release, folder, args, **options):
        time.sleep(0.05)
        return 0, 0.0, "1 passed"

    monkeypatch.setattr(matrix, "make_venv", make_venv)
    monkeypatch.setattr(matrix, "run", run)
    assert matrix.main(["--plan", "--prune"]) == 0
    assert len(most) == len(torches) and max(most) == 2  # every venv made; never more than 2 at once
    assert list(tmp_path.iterdir()) == []  # and every one removed
    assert capsys.readouterr().out.rstrip().splitlines()[-1] == "matrix: 11 passed, 0 failed"
