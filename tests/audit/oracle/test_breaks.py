"""The audit's graph-break report (tmpatch/audit/oracle/breaks.py): break sites, calls left out of
the graph, recompiles and crashes of a compiled call, on the panel and the command line.
torch 2.5+ (the compiled paths' floor, docs/guide/compile.rst)."""
from __future__ import annotations

import json
import os

import pytest
import torch

from tests.conftest import torch_at_least
from tests.patches.test_compiled_update import heavy  # COMPILE_RELEASES with torch 2.6+ (CI time)
from tmpatch.audit import cli
from tmpatch.audit.oracle.breaks import Breaks, describe, graph_breaks

pytestmark = pytest.mark.skipif(not torch_at_least(2, 5), reason="torch.compile support starts at torch 2.5")


def _branchy(x: torch.Tensor) -> torch.Tensor:
    if x.sum() > 0:  # a data-dependent branch: a graph break here
        return x + 1
    return x - 1


def _clean(x: torch.Tensor) -> torch.Tensor:
    return torch.where(x.sum() > 0, x + 1, x - 1)


class _Counter(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1  # an int attribute of a module: guarded on, a recompile per call
        return x * 2


@pytest.mark.once
def test_a_data_dependent_branch_is_one_site_with_its_line_and_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))))
    found = graph_breaks(_branchy, torch.ones(3))
    line = _branchy.__code__.co_firstlineno + 1
    # the site is this file relative to the current directory, whatever the checkout's folder is called
    assert len(found.sites) == 1 and found.sites[0].startswith(f"tests/audit/oracle/test_breaks.py:{line}: ")
    assert not found.error and found.outside == 0
    assert found.cell() == "1"


@pytest.mark.once
def test_traceable_code_has_no_site() -> None:
    found = graph_breaks(_clean, torch.ones(3))
    assert (found.sites, found.outside, found.recompiles, found.error) == ([], 0, 0, "")
    assert found.cell() == "0"


@pytest.mark.once
def test_a_disabled_call_counts_as_outside_the_graph() -> None:
    eager = torch.compiler.disable(lambda x: x + 1)
    found = graph_breaks(lambda x: eager(x) * 2, torch.ones(3))
    assert found.sites == [] and found.outside == 1 and found.cell() == "0+1"


@pytest.mark.once
def test_recompiles_are_counted_and_the_callers_module_is_left_as_it_was() -> None:
    module = _Counter()
    found = graph_breaks(module, torch.ones(3), steps=3)
    assert found.recompiles >= 1 and f"rc{found.recompiles}" in found.cell()
    assert module.calls == 0  # every call ran on a copy


@pytest.mark.once
def test_a_crash_is_reported_not_raised() -> None:
    def broken(x: torch.Tensor) -> torch.Tensor:
        raise ValueError("boom")

    found = graph_breaks(broken, torch.ones(3))
    assert found.error == "ValueError: boom" and found.cell() == "crash"
    assert describe(found, Breaks()) == ["compiled unpatched: crash, ValueError: boom"]


@heavy
def test_the_panel_shows_the_nan_checks_break_gone_when_patched() -> None:
    """MeanMetric's update: the release's ``if nans.any()`` is a break site; patched, none, and
    nothing runs outside the graph (the update count is added on the device)."""
    from tmpatch.audit.panel.run import run_panel

    row = run_panel(["MeanMetric (default weight)"], real=False, breaks=True).rows[0]
    before, after = row.breaks["unpatched"], row.breaks["patched"]
    assert any("aggregation.py" in site for site in before.sites), before
    assert after.sites == [] and after.outside == 0 and not after.error and after.recompiles == 0, after
    assert row.to_dict()["graph_breaks"]["patched"]["sites"] == []


@heavy
def test_no_tmpatch_code_breaks_a_wrapped_aggregations_update() -> None:
    """RunningMean's update runs inside deferred_reports' internal scope: a ContextVar there
    was a graph break in tmpatch's own code."""
    from tmpatch.audit.panel.run import run_panel

    row = run_panel(["RunningMean"], real=False, breaks=True).rows[0]
    if not row.available:
        pytest.skip(row.why_na)
    assert not [site for site in row.breaks["patched"].sites if site.startswith("tmpatch/")], row.breaks


def test_the_audit_compiles_copies_and_leaves_the_originals_count() -> None:
    """The copies keep their originals' own update functions: the tally those hold (the count of
    compiled updates) must be the copy's, or the audit's compiled calls count for the original."""
    from torchmetrics.classification import MulticlassAccuracy

    import tmpatch
    from tmpatch.audit.panel.rows import update_all

    tmpatch.apply()
    metric = MulticlassAccuracy(num_classes=3, validate_args=False)
    found = graph_breaks(update_all, [(metric, (torch.rand(8, 3), torch.randint(0, 3, (8,))), {})])
    assert not found.error and found.count == 0, found
    assert metric._update_count == 0  # update_called reads it (1.0.0+)


@pytest.mark.once
def test_the_command_line_adds_the_column_and_the_json_its_field(capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["--graph-breaks", "--metric", "SumMetric", "--simulated"]) == 0
    text = capsys.readouterr().out
    assert "graph breaks" in text and "1 -> 0 " in text
    assert cli.main(["--graph-breaks", "--metric", "SumMetric", "--simulated", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["rows"][0]["graph_breaks"]["patched"] == {"sites": [], "outside": 0, "recompiles": 0, "steps": 3,
                                                          "error": None}


@pytest.mark.once
def test_graph_breaks_goes_with_the_panel_only(capsys: pytest.CaptureFixture) -> None:
    assert cli.main(["--graph-breaks", "--all"]) == 2
    assert "--graph-breaks goes with the panel" in capsys.readouterr().err
