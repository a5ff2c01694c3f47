"""The calibration command, on the CPU up to where a GPU is needed: the simulated half, the
comparison and report of a (stubbed) real half, sources plugged in, the real audit's plumbing."""
from __future__ import annotations

import contextlib
import json
import sys
import types
import warnings

import pytest
import torch

from tmpatch.audit import cli
from tmpatch.audit.calibrate import cases, cli as calibrate_cli
from tmpatch.audit.calibrate.run import Outcome, compare
from tmpatch.audit.oracle import api

pytest.importorskip("torchmetrics")


def test_simulated_only_runs_every_probe(capsys):
    assert calibrate_cli.main(["--source", "probes", "--simulated-only"]) == 0
    out = capsys.readouterr().out
    from tmpatch.audit.calibrate.probes import PROBE_NAMES

    assert all(f"probes   {name} " in out for name in PROBE_NAMES)
    assert out.rstrip().splitlines()[-1] == f"calibration: 0 same, 0 count, 0 differs, 0 expected, 0 error, " \
                                            f"{len(PROBE_NAMES)} simulated"


def test_without_a_gpu_it_stops_at_once(capsys, monkeypatch):
    """No GPU and no --simulated-only: exit 2 with one line before anything is simulated."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)

    def never(*args, **kwargs):
        raise AssertionError("simulated before saying it needs a GPU")

    monkeypatch.setattr(cases, "collect", never)
    assert cli.main(["--calibrate"]) == 2
    out, err = capsys.readouterr()
    assert not out and len(err.splitlines()) == 1
    assert err.startswith("calibrate: no CUDA GPU here") and "--simulated-only" in err


def test_usage_errors(capsys):
    assert calibrate_cli.main(["--source", "nope"]) == 2
    assert "unknown --source nope" in capsys.readouterr().err
    assert calibrate_cli.main(["--help"]) == 0


def test_compare_statuses():
    sim = {("p", "a"): Outcome(1, ("device-to-host read",)), ("p", "b"): Outcome(0),
           ("p", "c"): Outcome(1, expected_real=False), ("p", "d"): Outcome(2), ("p", "e"): Outcome(1),
           ("p", "f"): Outcome(1)}
    real = {("p", "a"): Outcome(1), ("p", "b"): Outcome(1), ("p", "c"): Outcome(0), ("p", "d"): Outcome(5),
            ("p", "e"): Outcome(None, error="RuntimeError: x"), ("p", "f"): Outcome(None, error="needs 2 GPUs")}
    assert [c.status for c in compare(sim, real)] == ["same", "differs", "expected", "count", "error", "skipped"]
    assert {c.status for c in compare(sim, None)} == {"simulated"}


@pytest.fixture
def stub_gpu(monkeypatch):
    """A stand-in for the real half: torch.cuda answers as on a one-GPU machine, and the
    real collection returns the simulated outcomes with the changes a test asks for."""
    changes = {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "init", lambda: None)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: "Stub GPU")
    collect = cases.collect

    def fake_collect(chosen, real):
        if not real:
            with monkeypatch.context() as m:
                m.setattr(torch.cuda, "is_available", lambda: False)  # the simulation, untouched
                return collect(chosen, real)
        results = {key: Outcome(o.syncs, o.kinds, o.error, 0.001) for key, o in stub_gpu.simulated.items()}
        results.update(changes)
        return results

    def remember(chosen, real):
        out = fake_collect(chosen, real)
        if not real:
            stub_gpu.simulated = out
        return out

    stub_gpu = types.SimpleNamespace(changes=changes, simulated={})
    monkeypatch.setattr(cases, "collect", remember)
    return stub_gpu


def test_the_gpu_half_reports_where_the_verdicts_differ(stub_gpu, tmp_path, capsys):
    stub_gpu.changes[("probes", "where_scalar")] = Outcome(1, ("device-to-host read",), seconds=0.002)
    stub_gpu.changes[("probes", "nonblocking_into_pageable")] = Outcome(0, seconds=0.002)
    out_file, json_file = tmp_path / "calibration.txt", tmp_path / "calibration.json"
    code = calibrate_cli.main(["--source", "probes", "--out", str(out_file), "--json", str(json_file)])
    out = capsys.readouterr().out
    assert code == 1
    assert "Stub GPU (1 device(s))" in out and "where simulated and real differ:" in out
    assert "probes where_scalar: simulated 0, real 1 (device-to-host read); the simulated verdict is wrong" in out
    assert "probes nonblocking_into_pageable" in out and "expected: the host waits for the copy" in out
    assert "1 differs, 1 expected" in out
    assert out_file.read_text().startswith("$ python -m tmpatch.audit.calibrate")
    rows = json.loads(json_file.read_text())
    assert {r["case"]: r["status"] for r in rows}["where_scalar"] == "differs"


def test_no_difference_is_exit_0(stub_gpu, capsys):
    assert calibrate_cli.main(["--source", "probes"]) == 0
    assert "0 differs" in capsys.readouterr().out


def test_a_sweep_plugs_in(monkeypatch, capsys):
    module = types.ModuleType("tmpatch_test_sweep")

    def calibration_cases(real):
        from tmpatch.audit import audit

        yield "a sweep case", audit(lambda x: x.sum().item(), torch.ones(2), real=real)

    module.calibration_cases = calibration_cases
    monkeypatch.setitem(sys.modules, "tmpatch_test_sweep", module)
    monkeypatch.setattr(cases, "SWEEP_MODULES", ("tmpatch_test_sweep", "tmpatch_no_such_module"))
    monkeypatch.setitem(cases.SOURCES, "extra", lambda real: [("added", Outcome(0))])
    assert set(cases.sources(1)) == {"probes", "panel", "tmpatch_test_sweep", "extra"}
    assert calibrate_cli.main(["--source", "tmpatch_test_sweep", "--source", "extra", "--simulated-only"]) == 0
    out = capsys.readouterr().out
    assert "a sweep case" in out and "1 (device-to-host read)" in out and "added" in out


def test_panel_rows_are_cases(capsys):
    found = dict(cases.panel_cases(False, names=["SumMetric", "_safe_divide"]))
    assert set(found) == {f"SumMetric | {part} | {mode}" for part in ("update", "compute")
                          for mode in ("unpatched", "patched")} | {"_safe_divide | update | unpatched",
                                                                   "_safe_divide | update | patched"}
    assert found["SumMetric | update | unpatched"].syncs >= 1


def test_real_audit_plumbing_on_stubs(monkeypatch):
    """``audit(real=True)`` turns torch's sync-debug warnings into points at the user's line."""
    modes = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", modes.append)
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(api, "_move_real", lambda value, dev: value)

    def reads(x):
        value = x.sum().item()
        warnings.warn("called a synchronizing CUDA operation", stacklevel=1)  # what torch says in "warn" mode
        warnings.warn("something else", UserWarning, stacklevel=1)
        return value

    with pytest.warns(UserWarning, match="something else"):
        report = api.audit(reads, torch.ones(3), real=True)
    (point,) = report.sync_points
    assert report.mode == "real" and modes == ["warn", 0]
    assert point.op == "aten._local_scalar_dense" and point.kind.value == "device-to-host read"
    assert point.location.endswith(f"calibrate/test_run.py:{reads.__code__.co_firstlineno + 2}")
    assert cases.time_call(lambda: None, 3) >= 0.0
    assert cases.device_for("cuda:1") == "cuda:0" and cases.device_for("cuda:0") == "cuda:0"


def test_a_broken_source_does_not_stop_the_others(monkeypatch, capsys):
    def broken(real):
        yield "first", Outcome(0)
        raise RuntimeError("boom")

    monkeypatch.setitem(cases.SOURCES, "broken", broken)
    monkeypatch.setitem(cases.SOURCES, "fine", lambda real: [("ok", Outcome(1))])
    assert calibrate_cli.main(["--source", "broken", "--source", "fine", "--simulated-only"]) == 0
    out = capsys.readouterr().out
    assert "(the source itself)" in out and "RuntimeError: boom" in out and "fine     ok" in out
