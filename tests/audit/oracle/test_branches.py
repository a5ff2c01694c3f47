"""Branch coverage: audit(answers=...) and audit_branches run the code behind both outcomes
of a value read (validation errors, warnings, deferred reports) that one plausible answer hides."""
import pytest
import torch

from tests.audit.helpers import marked_line
from tmpatch.audit import SyncKind, audit, audit_branches
from tmpatch.runtime.deferred import AUDIT_TAG


def validated(x):
    if (x < 0).any():  # <- read 0
        raise ValueError("negative values")
    if x.sum() == 0:  # <- read 1
        return torch.zeros(3, device=x.device)
    kept = x[x > 0]  # <- sync behind both checks
    return kept.sum().item()


def test_default_answers_take_one_branch_and_are_logged():
    report = audit(validated, torch.rand(5))
    assert [r.value for r in report.reads] == [False, False, 1.0]
    assert [r.alternatives for r in report.reads] == [(True,), (True,), (0.0,)]
    assert report.reads[0].location.endswith(f":{marked_line(validated, '# <- read 0')}")
    assert report.count == 4


def test_answers_choose_the_branch():
    report = audit(validated, torch.rand(5), answers=[None, True], real=False)  # None: the default answer
    assert report.count == 2 and [r.value for r in report.reads] == [False, True]
    assert report.result.shape == (3,)
    with pytest.raises(ValueError):  # audit() lets the function's own errors through
        audit(validated, torch.rand(5), answers=[True])


def test_every_branch_is_audited_once():
    result = audit_branches(validated, torch.rand(5))
    answers = sorted(p.answers for p in result.paths)
    assert answers == sorted([(False, False, 1.0), (True,), (False, True), (False, False, 0.0)])
    assert result.count == 4 and not result.truncated
    raised = [p for p in result.paths if p.raised is not None]
    assert len(raised) == 1 and isinstance(raised[0].raised, ValueError) and raised[0].report.count == 1
    line = marked_line(validated, "# <- sync behind both checks")
    assert [p.kind for p in result.sync_points if p.location.endswith(f":{line}")] == [SyncKind.DATA_DEPENDENT_SHAPE]
    assert "a run ended with ValueError: negative values" in str(result)
    data = result.to_dict()
    assert data["runs"] == 4 and data["count"] == 4 and len(data["paths"]) == 4


def only_on_the_other_branch(x):
    if x.isnan().any():
        print(f"nan in {x}")  # formatting a CUDA tensor: a sync the default answer never reaches
    return x.sum()


def test_a_sync_only_on_the_other_branch_is_found():
    assert audit(only_on_the_other_branch, torch.rand(4)).of_kind(SyncKind.FORMAT) == []
    result = audit_branches(only_on_the_other_branch, torch.rand(4))
    (point, answers), = [(p, a) for p, a in result.reached_by() if p.kind is SyncKind.FORMAT]
    assert answers == (True,) and point.function == "only_on_the_other_branch"


def reports_a_deferred_record(x):
    record = (x < 0).sum()
    setattr(record, AUDIT_TAG, True)
    if int(record):  # a deferred record: 0 (nothing to report) unless asked otherwise
        raise RuntimeError(f"{int(record)} negative values")
    return x


def test_a_deferred_record_is_explored_with_a_report():
    result = audit_branches(reports_a_deferred_record, torch.rand(4))
    assert sorted(p.answers for p in result.paths) == [(0,), (1, 0), (1, 1)]  # the message reads it again
    assert any(isinstance(p.raised, RuntimeError) for p in result.paths)


def loops(x):
    total = 0.0
    for _ in range(40):
        if x.sum() > 0:
            total += 1
    return total


def test_runs_and_reads_are_bounded():
    result = audit_branches(loops, torch.rand(3), max_runs=5, max_reads=3)
    assert len(result.paths) == 5 and result.truncated
    assert "truncated" in str(result)


@pytest.mark.filterwarnings("ignore:Encount")  # the NaN branch, explored ("Encounted" before 1.1)
def test_the_callers_metric_is_left_alone():
    from torchmetrics import MeanMetric

    metric = MeanMetric()
    result = audit_branches(metric.update, torch.randn(4))
    assert len(result.paths) >= 2 and metric.device == torch.device("cpu")
    assert result.default.count == audit(metric.update, torch.randn(4)).count
