"""``tmpatch audit --step``: a user's own step, unpatched and patched, each sync at the user's line."""
from __future__ import annotations

import json
import os
import re

import pytest
import torch

import tmpatch
from tests.audit.helpers import marked_line, release_in
from tmpatch.audit import cli
from tmpatch.audit.oracle.report import SyncKind
from tmpatch.audit.step.run import StepError, audit_step, load, takes_device

HERE = os.path.abspath(__file__)
values = []


def make_syncing_step(device):
    x = torch.randn(8, device=device)  # set-up: not counted

    def step():
        y = x * 2
        values.append(y.sum().item())  # <- item
        values.append(float(y.mean()))  # <- float
        if y.max() > 0:  # <- if
            values.append(1)
        return y

    return step


def whole_step(device):
    torch.randn(4).to(device)  # <- copy
    return None


def step_without_device():
    torch.zeros(3, device="cuda").tolist()  # <- tolist


def metric_step(device):
    from torchmetrics import MeanMetric

    metric = MeanMetric().to(device)
    value = torch.randn(8, device=device)

    def step():
        metric.update(value)  # <- update

    return step


def raising_step(device):
    raise ValueError("no data")  # <- raise


def stopping_step(device):
    from torch._subclasses.fake_tensor import DynamicOutputShapeException

    x = torch.ones(3, device=device)
    x.sum().item()  # <- seen
    raise DynamicOutputShapeException(torch.ops.aten.nonzero.default)  # <- stop


def collection_step(device):
    from torchmetrics import MetricCollection
    from torchmetrics.classification import MulticlassAccuracy, MulticlassF1Score

    metrics = MetricCollection([MulticlassAccuracy(num_classes=5, validate_args=False),
                                MulticlassF1Score(num_classes=5, validate_args=False)]).to(device)
    preds, target = torch.randn(16, 5, device=device), torch.randint(0, 5, (16,), device=device)

    def step():
        metrics.update(preds, target)
        values.append(preds.sum().item())  # <- after

    return step


def labels_step(device, labels=None):
    from torchmetrics.classification import MulticlassAccuracy

    accuracy = MulticlassAccuracy(num_classes=10).to(device)  # validate_args=True
    target = torch.randint(0, 10, (32,), device=device)
    preds = torch.randn(32, 10, device=device).argmax(dim=1) if labels is None else labels(device)

    def step():
        accuracy.update(preds, target)  # <- labels

    return step


def unknown_labels_step(device):
    return labels_step(device, lambda d: torch.empty(32, dtype=torch.long, device=d).random_())


def wrong_shape_step(device):
    return labels_step(device, lambda d: torch.randint(0, 10, (16,), device=d))


def _line(fn, marker):
    return f"{HERE}:{marked_line(fn, f'# <- {marker}')}"


@pytest.mark.once
def test_each_sync_at_the_users_line_and_set_up_left_out():
    runs = audit_step(make_syncing_step)
    for mode in ("unpatched", "patched"):
        run = runs[mode]
        assert run.split and run.count == 3 and not run.stopped
        assert [s.where for s in run.seen] == [_line(make_syncing_step, m) for m in ("item", "float", "if")]
        assert {s.function for s in run.seen} == {"step"}
        assert {s.point.kind for s in run.seen} == {SyncKind.D2H_READ}
    assert "applied" not in tmpatch.status().states().values()  # left as found
    tmpatch.apply(["cumsum_device"])
    before = tmpatch.status().states()
    audit_step(make_syncing_step)
    assert tmpatch.status().states() == before


@pytest.mark.once
def test_a_function_that_returns_no_step_is_audited_whole_and_without_device():
    run = audit_step(whole_step)["unpatched"]
    assert not run.split and [(s.point.kind, s.where) for s in run.seen] == [
        (SyncKind.H2D_COPY, _line(whole_step, "copy"))]
    assert not takes_device(step_without_device) and takes_device(whole_step)
    run = audit_step(step_without_device)["patched"]
    assert [s.where for s in run.seen] == [_line(step_without_device, "tolist")] and run.count == 1


def test_metric_syncs_are_shown_at_the_users_line_and_patched_away():
    runs = audit_step(metric_step)
    unpatched = runs["unpatched"].seen
    assert unpatched and {s.where for s in unpatched} == {_line(metric_step, "update")}
    assert all("torchmetrics" in s.point.location for s in unpatched)
    assert runs["patched"].count == 0 and runs["patched"].states["nan_check"] == "applied"


@pytest.mark.once
def test_cli_text_and_json(capsys, tmp_path, monkeypatch):
    path = tmp_path / "mystep.py"
    path.write_text("import torch\n\n\ndef make(device):\n    x = torch.ones(3, device=device)\n"
                    "    return lambda: seen.append(float(x.sum()))\n\n\nseen = []\n")
    monkeypatch.chdir(tmp_path)
    assert cli.main(["--step", "mystep.py:make"]) == 0
    out = capsys.readouterr().out
    assert max(map(len, out.splitlines())) <= 120
    assert "sync points per step, unpatched -> patched: 1 -> 1" in out
    assert "mystep.py:6 in <lambda>: 1 -> 1   return lambda: seen.append(float(x.sum()))" in out
    assert "1 -> 1  device-to-host read (aten._local_scalar_dense) [your code]" in out
    assert cli.main(["--step", "mystep:make", "--json"]) == 0  # a module of the current directory
    data = json.loads(capsys.readouterr().out)
    assert data["patched"]["count"] == 1 and data["patched"]["points"][0]["at"].endswith("mystep.py:6")
    assert cli.main(["--step", "mystep:make", "--fail-on-sync"]) == 1
    assert "--fail-on-sync: the patched step still has 1 sync point(s)" in capsys.readouterr().err


@pytest.mark.once
@pytest.mark.parametrize("spec, message", [
    ("nocolon", "--step wants MODULE:FUNCTION or path/to/file.py:FUNCTION, got 'nocolon'"),
    ("missing.py:f", "--step: no file 'missing.py'"),
    ("no_such_module_x:f", "--step: cannot import module 'no_such_module_x' (No module named 'no_such_module_x')"),
    ("tests.audit.step.test_run:nope", "--step: module 'tests.audit.step.test_run' has no 'nope'"),
    ("tests.audit.step.test_run:values", "--step: 'tests.audit.step.test_run:values' is a list, not a function"),
    ("tests.audit.step.test_run:_line",
     "--step: '_line' wants 2 arguments; a step function takes the device, or nothing"),
    ("tests.audit.step.test_run:raising_step", "--step: the step raised ValueError: no data (at "),
    ("broken.py:f", "--step: importing file 'broken.py' raised NameError: name 'oops' is not defined (at broken.py:1)"),
])
def test_bad_steps_are_one_line_and_exit_2(capsys, tmp_path, monkeypatch, spec, message):
    (tmp_path / "broken.py").write_text("oops\n")
    if spec.startswith("broken"):
        monkeypatch.chdir(tmp_path)
    assert cli.main(["--step", spec]) == 2
    out, err = capsys.readouterr()
    assert not out and err.startswith("tmpatch audit: " + message) and len(err.splitlines()) == 1, err


@pytest.mark.once
def test_load_names_dotted_attributes_and_the_step_error_is_clear():
    assert load("tests.audit.step.test_run:metric_step") is metric_step
    assert load("os.path:join") is os.path.join
    with pytest.raises(StepError, match=r"raised ValueError: no data \(at .*step/test_run.py:\d+\) \(unpatched run\)$"):
        audit_step(raising_step)
    if not torch.cuda.is_available():
        with pytest.raises(StepError, match="--real needs a CUDA GPU"):
            audit_step(metric_step, real=True)


@pytest.mark.once
def test_an_op_the_simulation_cannot_size_stops_the_run_and_says_where(capsys):
    runs = audit_step(stopping_step)
    assert runs["patched"].count == 1 and runs["patched"].seen[0].where == _line(stopping_step, "seen")
    line = marked_line(stopping_step, "# <- stop")
    stopped = runs["patched"].stopped
    assert stopped.startswith("DynamicOutputShapeException: aten.nonzero.default (at ")
    assert stopped.endswith(f"step/test_run.py:{line})")
    assert cli.main(["--step", "tests.audit.step.test_run:stopping_step"]) == 0
    assert "patched: the simulation stopped early, DynamicOutputShapeException" in capsys.readouterr().out
    assert cli.main(["--step", "tests.audit.step.test_run:stopping_step", "--fail-on-sync"]) == 1
    assert "and stopped early" in capsys.readouterr().err


def test_the_readme_example(capsys):
    """examples/step_example.py: the two syncs of the user's own code stay, the metrics' go; on 1.9.0 the
    output is the manual's (docs/guide/audit.rst)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(HERE))))
    runs = audit_step(load(os.path.join(root, "examples", "step_example.py") + ":make_step"))
    patched = runs["patched"]
    assert patched.count == 2 and runs["unpatched"].count > 2
    assert [s.function for s in patched.seen] == ["log_value", "step"]
    if release_in("==1.9.0"):
        with open(os.path.join(root, "docs", "guide", "audit.rst")) as readme:
            text = readme.read()
        block = text.split("\n    sync points per step, unpatched -> patched: ")[1].split("\n")
        expected = ["sync points per step, unpatched -> patched: " + block[0]]
        for line in block[1:]:
            if line and not line.startswith("    "):
                break
            expected.append(line[4:])
        while not expected[-1]:
            expected.pop()
        old = os.getcwd()
        try:
            os.chdir(root)
            assert cli.main(["--step", "examples/step_example.py:make_step"]) == 0
        finally:
            os.chdir(old)
        out = capsys.readouterr().out.splitlines()
        assert out[out.index(expected[0]):] == expected


def test_a_training_step_with_backward_and_a_default_metric_collection(capsys):
    """examples/train_step.py, as a new user writes it: backward and the optimizer step run on
    simulated CUDA; the collection's compute-group check (first update only) is left out with
    the first call; validate_args=True runs; the user's own loss.item() is seen."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(HERE))))
    path = os.path.join(root, "examples", "train_step.py")
    runs = audit_step(load(path + ":make_step"))
    item = marked_line(load(path + ":make_step"), "progress.append(loss.item())")
    for mode in ("unpatched", "patched"):
        run = runs[mode]
        assert run.split and not run.stopped and run.backward + run.backward_left_out == 1
        assert any(s.point.op == "aten.allclose" for s in run.first)
        assert not any(s.point.op == "aten.allclose" for s in run.seen)
        assert [s.where for s in run.seen if s.point.is_sync][-1] == f"{path}:{item}"
    patched = [s for s in runs["patched"].seen if s.point.is_sync]
    assert all(s.where == f"{path}:{item}" or s.point.op == "aten._unique2" for s in patched)
    assert runs["unpatched"].count > runs["patched"].count
    assert cli.main(["--step", path + ":make_step"]) == 0
    out = capsys.readouterr().out
    assert "backward (1 pass per step): run by tmpatch's own walk of the autograd graph" in out or \
        "backward (1 pass per step): not run: this torch's autograd nodes" in out
    assert "first call (set-up, not counted), unpatched -> patched: " in out


def test_first_call_work_is_set_up_and_the_rest_of_the_step_is_seen():
    """A MetricCollection checks its compute groups on its first update (``allclose`` of the
    states, a read each): set-up, in the first call; the step goes on to the user's read."""
    runs = audit_step(collection_step)
    for run in runs.values():
        assert not run.stopped and run.split
        assert {s.point.op for s in run.first if s.point.op == "aten.allclose"} == {"aten.allclose"}
        assert [s.where for s in run.seen if s.function == "step" and "step/test_run" in s.point.location] == [
            _line(collection_step, "after")]
    assert runs["patched"].count == 1


def test_validation_runs_on_simulated_values_of_a_known_range(capsys):
    """Predicted labels (argmax) and targets from randint have a range: torch.unique of them keeps
    at most num_classes values, so the release's check passes, as on a GPU."""
    runs = audit_step(labels_step)
    assert {s.where for s in runs["unpatched"].seen} == {_line(labels_step, "labels")}
    assert cli.main(["--step", "tests.audit.step.test_run:unknown_labels_step"]) == 2
    err = capsys.readouterr().err
    assert re.search(r"\(unpatched run, first call; raised by torchmetrics' \w+ on simulated values: they have "
                     r"shapes, not values", err), err
    assert "validate_args=False leaves the check out, --real on a GPU runs it on real values)" in err
    # a check that fails on what the simulation has exactly (shapes) is the user's error, no hint
    assert cli.main(["--step", "tests.audit.step.test_run:wrong_shape_step"]) == 2
    err = capsys.readouterr().err
    assert err.rstrip().endswith("(unpatched run, first call)"), err


@pytest.mark.once
def test_a_step_file_imports_its_neighbours_and_may_hold_dataclasses(tmp_path):
    folder = tmp_path / "train"
    folder.mkdir()
    (folder / "neighbour.py").write_text("def read(t):\n    return t.item()\n")
    (folder / "loop.py").write_text("import dataclasses\nimport torch\nfrom neighbour import read\n\n\n"
                                    "@dataclasses.dataclass\nclass State:\n    x: object = None\n\n\n"
                                    "def make(device):\n    state = State(torch.ones(2, device=device))\n"
                                    "    return lambda: read(state.x.sum())\n")
    run = audit_step(load(f"{folder / 'loop.py'}:make"))["unpatched"]
    assert [(s.where, s.function) for s in run.seen] == [(f"{folder / 'neighbour.py'}:2", "read")]


def test_the_header_states_are_those_after_the_step(tmp_path):
    """A step that imports a module torchmetrics loads on demand: its patches read applied in
    the header (the states after the step), not pending (a fresh process: nothing imported it
    before). A pending patch is named with what pending means."""
    from tests.conftest import lazily_imported_patches, run_python

    lazy = sorted(lazily_imported_patches())
    if not lazy:
        pytest.skip("this release imports every patched module with torchmetrics")
    path = tmp_path / "lazystep.py"
    path.write_text("import torch\n\n\ndef make(device):\n    import torchmetrics.segmentation  # noqa: F401\n"
                    "    x = torch.ones(3, device=device)\n    return lambda: x + 1\n")
    code = f"from tmpatch.audit import cli; raise SystemExit(cli.main(['--step', {str(path) + ':make'!r}]))"
    header = run_python(code).stdout.split("\n\n")[0]
    assert "pending" not in header, header
    tail = " ".join(header.split()).split("after the step ", 1)[1]
    assert "applied" in tail and "tmpatch status names them" in tail
