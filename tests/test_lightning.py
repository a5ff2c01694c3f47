"""Lightning, as its users run it: ``examples/lightning_train.py`` released and with ``TMPATCH=1`` (one
process and Lightning's own DDP launcher on 2 CPU ranks) logs, warns and raises alike; the audit of a
step a Trainer drives (``examples/lightning_step.py``) sees the module's syncs go. Skipped without
lightning (not a test requirement: ``pip install lightning``)."""
from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytest.importorskip("lightning", reason="lightning is not installed (pip install lightning)")

pytestmark = pytest.mark.processes

TRAIN = os.path.join(ROOT, "examples", "lightning_train.py")


def _run(args, folder, patched: bool) -> dict:
    """The example's outputs, rank by rank, and its CSV files."""
    os.makedirs(folder)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TMPATCH")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p and os.path.isdir(p))
    if patched:
        env["TMPATCH"] = "1"
    args = [a.replace("{csv}", os.path.join(folder, "csv")) for a in args]
    done = subprocess.run([sys.executable, TRAIN, "--out", os.path.join(folder, "out.json")] + args, cwd=folder,
                          env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    ranks = {os.path.basename(f): json.load(open(f)) for f in glob.glob(os.path.join(folder, "out.json*"))}
    csv = {os.path.relpath(f, folder): open(f).read()
           for f in glob.glob(os.path.join(folder, "csv", "**", "*.csv"), recursive=True)}
    return {"ranks": ranks, "csv": csv}


@pytest.mark.parametrize("args", [
    ["--nan", "--bad-target", "--csv", "{csv}"],  # deterministic: the bad target is left out, silently
    ["--bad-target", "--no-validate", "--no-deterministic"],  # the release's RuntimeError from forward()
    ["--devices", "2", "--nan"],  # DDP: the NaN warning on rank 0 only (rank_zero_warn)
], ids=["nan-csv-deterministic", "bad-target-raises", "ddp-2-ranks"])
def test_release_and_tmpatch_log_warn_and_raise_alike(tmp_path, args):
    release = _run(args, str(tmp_path / "release"), patched=False)
    patched = _run(args, str(tmp_path / "patched"), patched=True)
    ranks = 2 if "--devices" in args else 1
    assert sorted(release["ranks"]) == sorted(patched["ranks"]) and len(release["ranks"]) == ranks
    for name, mine in patched["ranks"].items():
        theirs = release["ranks"][name]
        assert theirs["applied"] == 0 and mine["applied"] > 0 and mine["env"] == "1"  # TMPATCH=1 reached the rank
        for key in ("logged", "warnings", "error"):
            assert mine[key] == theirs[key], (name, key)
        assert mine["logged"]
    assert patched["csv"] == release["csv"]
    nan_warnings = [[w for w in release["ranks"][n]["warnings"] if "nan" in w["message"]]
                    for n in sorted(release["ranks"])]
    if "--nan" in args:
        assert [len(w) for w in nan_warnings] == [1] + [0] * (ranks - 1)
        assert nan_warnings[0][0]["file"] == "utilities/prints.py"
    if "--no-deterministic" in args:
        assert release["ranks"]["out.json"]["error"]["type"] == "RuntimeError"
    else:
        assert release["ranks"]["out.json"]["error"] is None


def test_a_step_driven_by_a_trainer_is_audited(monkeypatch):
    """The module's metric syncs (at its training_step lines) go; Lightning's own are seen at the fit."""
    from tmpatch.audit.step.run import audit_step, load

    monkeypatch.chdir(ROOT)
    runs = audit_step(load("examples/lightning_step.py:make_fit"))
    for mode in ("unpatched", "patched"):
        mine = [s for s in runs[mode].seen if s.point.is_sync and s.function == "training_step"]
        assert bool(mine) == (mode == "unpatched"), mode  # 6 on 1.9.0, 12 on 1.6.1 -> 0
        assert any(s.point.is_sync and s.function == "fit" for s in runs[mode].seen), mode
