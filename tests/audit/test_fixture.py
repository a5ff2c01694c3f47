"""The ``no_sync`` fixture never brings the process down (issue 15): the misuse of building
and moving a metric inside the body fails that one test, with a hint; ``no_sync.put`` is the
intended use. Run in a subprocess, so that an abort would show as its exit status."""
from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

pytest.importorskip("torchmetrics")

BODY = '''
import pytest
import torch
from torchmetrics import MeanMetric, SumMetric

@pytest.fixture
def built():
    return SumMetric()

def test_metric_moved_inside_the_body(no_sync):
    metric = MeanMetric().to(no_sync.device)
    metric.update(torch.ones(3, device=no_sync.device))

def test_fixture_metric_moved_inside_the_body(built, no_sync):
    built.to(no_sync.device)

def test_module_moved_inside_the_body(no_sync):
    torch.nn.Linear(3, 3).to(no_sync.device)

def test_put_is_the_intended_use(no_sync):
    layer = no_sync.put(torch.nn.Linear(3, 3))
    metric = no_sync.put(MeanMetric())
    assert metric.device == no_sync.device and layer.weight.device == no_sync.device
    out = layer(no_sync.put(torch.ones(2, 3)))
    assert out.shape == (2, 3) and out.device == no_sync.device

def test_the_readme_example(tmpatch, no_sync):
    from torchmetrics.classification import MulticlassAccuracy

    metric = no_sync.put(MulticlassAccuracy(num_classes=5, validate_args=False))
    preds, target = no_sync.put((torch.randn(8, 5), torch.randint(0, 5, (8,))))
    metric.update(preds, target)

def test_after_them_all():
    import gc
    gc.collect()
    metric = MeanMetric()
    metric.update(torch.ones(3))
    assert metric.compute() == 1
'''


@pytest.mark.once  # the fixture's handling of a misuse; each release's sync-free updates are the patch tests'
def test_misuse_fails_one_test_with_a_hint_and_never_aborts(pytester, pytestconfig):
    pytester.makepyfile(test_inner=BODY)
    plugin = [] if pytestconfig.pluginmanager.has_plugin("tmpatch") else ["-p", "tmpatch.pytest_plugin"]
    result = pytester.runpytest_subprocess(*plugin, "-p", "no:cacheprovider", "-p", "no:hypothesispytest", "-rf")
    assert result.ret == 1, result.stdout.str()[-3000:]  # test failures, not a signal (134/139 before)
    result.assert_outcomes(passed=3, failed=3)
    result.stdout.fnmatch_lines(["*SyncError: host-to-device copy*", "*no_sync.put(MeanMetric())*"])


def test_put_needs_the_body():
    from tmpatch.audit.fixture import NoSyncFixture

    with pytest.raises(RuntimeError, match="inside the test body"):
        NoSyncFixture().put(object())
