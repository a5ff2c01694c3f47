"""tools/new_release.py: a release's files read, the targets whose code is new named, what each patch
would do there (the gating of apply()), and the tests to run."""
from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
import subprocess
import sys
import zipfile

import tmpatch
from tests.conftest import ROOT, edited_release
from tmpatch import patches as catalogue
from tmpatch.control import likeness

TOOL = os.path.join(ROOT, "tools", "new_release.py")
SSIM = "torchmetrics.functional.image.ssim._ssim_update"


def _tool():
    spec = importlib.util.spec_from_file_location("tmpatch_tools_new_release", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, TOOL, *args], capture_output=True, text=True, timeout=300)


def _unwrapped(text: str) -> str:
    """The tool's text with its wrapped lines joined again."""
    return re.sub(r"\n {4,}", " ", text)


def _here() -> str:
    import torchmetrics

    return os.path.dirname(os.path.dirname(torchmetrics.__file__))


def _torch_bound(name: str) -> bool:
    """Whether the patch relies on torch's code, which the tool leaves to the torch at hand."""
    return any(r.module.split(".")[0] != catalogue.HOST for r in catalogue.load(name).relies_on)


def test_on_this_release_it_says_what_apply_does():
    for name in catalogue.NAMES:  # every target's module imported: no row stays pending
        for target in catalogue.load(name).targets:
            try:
                importlib.import_module(target.module)
            except ImportError:
                pass
    states = tmpatch.apply().states()
    found = _tool().study(_here(), __import__("torchmetrics").__version__)
    assert {n: row["state"] for n, row in found["patches"].items() if not _torch_bound(n)} == \
        {n: state for n, state in states.items() if not _torch_bound(n)}
    assert [t["path"] for t in found["targets"] if t["change"] not in ("known", "absent")] == []
    assert found["patches with changed targets"] == [] and "tests/control/test_api.py" in found["tests"]


def test_a_changed_target_is_named_with_its_patch_and_tests(tmp_path):
    folder = edited_release(str(tmp_path / "tree" / "src"), {SSIM.rsplit(".", 1)[0] + ":_ssim_update": "x = 1"})
    proc = _run(str(tmp_path / "tree"), "--json")  # a source tree: its package in src/
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout)
    changed = [t for t in found["targets"] if t["change"] != "known" and t["change"] != "absent"]
    assert [(t["path"], t["change"], t["patches"]) for t in changed] == [(SSIM, "new", ["image_constants"])]
    assert found["patches"]["image_constants"]["state"] == "partial"
    assert SSIM in found["patches"]["image_constants"]["reason"] and SSIM in found["code"]
    assert found["patches with changed targets"] == ["image_constants"]
    assert found["tests"][0] == "tests/patches/test_image_constants.py"
    text = _run(folder).stdout  # the folder holding the package, as text
    assert "  new " in text and SSIM in text and "partial image_constants: " in text
    assert f"PYTHONPATH={folder}:. python -m pytest tests/patches/test_image_constants.py" in _unwrapped(text)


def test_a_wheel_is_read_in_place(tmp_path):
    folder = edited_release(str(tmp_path / "unpacked"), {})
    wheel = tmp_path / "torchmetrics-9.9.9-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as out:
        for base, _, files in os.walk(folder):
            for name in files:
                out.write(os.path.join(base, name), os.path.relpath(os.path.join(base, name), folder))
    proc = _run(str(wheel), "--release", "9.9.9")
    assert proc.returncode == 0, proc.stderr
    newest = str(likeness.newest())  # this release's code, taken for a release to come: compared with the newest
    assert proc.stdout.startswith("torchmetrics 9.9.9 (a release tmpatch has not seen; code ")
    assert f"compared with the {newest} wheel (the newest tmpatch knows)" in _unwrapped(proc.stdout)
    assert f"pip install --no-deps --target DIR {wheel}" in _unwrapped(proc.stdout)


def test_a_path_without_torchmetrics_is_one_line_and_exit_1(tmp_path):
    proc = _run(str(tmp_path))
    assert proc.returncode == 1 and proc.stderr.strip() == f"new_release: no torchmetrics package in {tmp_path}"
