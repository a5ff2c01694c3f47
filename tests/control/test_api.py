"""apply / revert / status against the torchmetrics release under test."""
from __future__ import annotations

import importlib
import json
import os
import sys
import types

import pytest
import torchmetrics  # noqa: E402  (the suite runs with torchmetrics imported)
import wrapt
from torchmetrics.utilities import compute, distributed

import tmpatch
from tests.conftest import (
    edited_release,
    fingerprints_under,
    lazily_imported_patches,
    release_in,
    run_python,
    torch_at_least,
)
from tmpatch import patches as catalogue
from tmpatch.control import gating
from tmpatch.spec import Variant

SAFE_DIVIDE_FIXED = release_in(">=1.9.0")
GATHER_FIXED = release_in(">=1.6.0")


def modules_binding(name: str):
    """Names of torchmetrics modules whose source does ``from ... import name``."""
    import ast

    root = os.path.dirname(torchmetrics.__file__)
    found = []
    for folder, _, files in os.walk(root):
        for file in files:
            if not file.endswith(".py"):
                continue
            path = os.path.join(folder, file)
            text = open(path, encoding="utf-8").read()
            if name not in text:
                continue
            tree = ast.parse(text)
            if any(
                isinstance(node, ast.ImportFrom) and any(alias.name == name for alias in node.names)
                for node in ast.walk(tree)
            ):
                module = "torchmetrics" + path[len(root):-3].replace(os.sep, ".")
                found.append(module[: -len(".__init__")] if module.endswith(".__init__") else module)
    return found


def test_unknown_names_are_a_clear_value_error():
    with pytest.raises(ValueError, match="valid names: deferred_reports, safe_divide, cumsum_device"):
        tmpatch.apply(["safe_divid"])
    with pytest.raises(ValueError, match="exclude"):
        tmpatch.apply(exclude="nope")
    assert set(tmpatch.status().states().values()) <= {"off", "reverted"}


def test_status_has_a_row_per_patch_and_prints_as_a_table():
    report = tmpatch.apply()
    assert [row.name for row in report] == list(catalogue.NAMES)
    assert all(row.release == torchmetrics.__version__ for row in report)
    text = str(report)
    assert text.splitlines()[0].split()[:3] == ["patch", "state", "release"]
    assert all(name in text for name in catalogue.NAMES)
    assert json.loads(json.dumps(report.to_dict()))[0]["name"] == catalogue.NAMES[0]


def test_states_follow_the_release():
    states = tmpatch.apply().states()
    assert states["safe_divide"] == ("not-needed" if SAFE_DIVIDE_FIXED else "applied")
    assert states["cumsum_device"] == ("applied" if release_in(">=1.0.0,<1.4.1") else "not-needed")
    assert states["mean_default_weight"] == "applied"
    assert states["gather_autograd"] == ("not-needed" if GATHER_FIXED else "applied")


#: 0.10.x and 0.11.x: what each patch does there (the rest are applied)
NOT_NEEDED_0X = {"cumsum_device", "fairness_groups", "vif_masks", "dice_weights", "panoptic_preprocess",
                 "panoptic_matching", "edge_distances", "pearson_update", "segmentation_format"}
NOT_NEEDED_0_10 = {"nominal_bincount"}
UNSUPPORTED_0_10 = {"legacy_dice_checks"}


@pytest.mark.skipif(release_in(">=1.0.0"), reason="0.10-0.11 only")
def test_0x_rows_say_what_each_patch_does_there(caplog):
    """On 0.10/0.11 every patch is applied, or not-needed / unsupported with a reason of its own
    (no generic "written for ..." and no patch left pending for a module the release lacks); a
    patch left alone on purpose is no warning at every start-up."""
    old = release_in("<0.11.0")
    with caplog.at_level("INFO", logger="tmpatch"):
        report = tmpatch.apply()
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == []
    for row in report:
        if row.name in NOT_NEEDED_0X or (old and row.name in NOT_NEEDED_0_10):
            assert row.state == "not-needed" and row.reason.startswith("nothing to repair"), row
        elif old and row.name in UNSUPPORTED_0_10:
            assert row.state == "unsupported" and "left alone" in row.reason, row
        else:
            assert row.state == "applied", row
        assert "written for" not in row.reason and row.state != "pending", row


@pytest.mark.skipif(release_in(">=1.0.0"), reason="0.10-0.11 only")
def test_0x_apply_before_import_arms_only_what_can_apply():
    """Before ``import torchmetrics`` the release is read from its metadata: a patch whose targets
    the release lacks is settled at once, not left waiting for a module that never comes."""
    proc = run_python("""
        import tmpatch
        rows = tmpatch.apply().states()
        print(rows["fairness_groups"], rows["pearson_update"], rows["nan_check"])
        import torchmetrics
        print(tmpatch.status().states()["nan_check"])
    """)
    assert proc.stdout.split() == ["not-needed", "not-needed", "pending", "applied"]


def _targets_here():
    """(target, the object it names) for every target of the catalogue that this release has; the
    targets it lacks are checked to be absent (or shared). Patches that decline the release
    (``Patch.declines``) claim nothing of its code."""
    from packaging.version import Version

    from tmpatch.control import gating

    version = Version(torchmetrics.__version__)
    for name in catalogue.NAMES:
        if gating.settled(catalogue.load(name), torchmetrics.__version__) is not None:
            continue
        for target in catalogue.load(name).targets:
            if target.present is not None and not target.present.contains(version, prereleases=True):
                owner = sys.modules.get(target.module)  # absent: the module, a class, or the attribute itself
                for part in target.qualname.split(".")[:-1]:
                    owner = vars(owner).get(part) if owner is not None else None
                assert owner is None or target.shared or target.qualname.split(".")[-1] not in vars(owner), \
                    target.path
                continue
            obj = importlib.import_module(target.module)
            for part in target.qualname.split("."):
                obj = vars(obj)[part] if isinstance(obj, (type, types.ModuleType)) else getattr(obj, part)
            yield target, obj


def test_every_target_is_recognised_as_the_variant_for_this_release():
    """The fingerprint table agrees with the release ranges it declares."""
    from packaging.version import Version

    from tmpatch.engine.fingerprint import fingerprint

    version = Version(torchmetrics.__version__)
    for target, obj in _targets_here():
        variant = target.variant_for(fingerprint(obj))
        assert variant is not None, f"{target.path} not recognised on {version}"
        assert variant.releases.contains(version, prereleases=True), (target.path, variant.releases, version)


def test_every_target_fingerprints_the_same_on_every_python(other_pythons):
    """Python 3.12 tokenizes f-strings in parts: the fingerprints must not change (see
    tests/engine/test_fingerprint.py); this is every target of the catalogue on this release."""
    import inspect

    from tmpatch.engine.fingerprint import source_fingerprint

    paths, sources = [], []
    for target, obj in _targets_here():
        paths.append(target.path)
        sources.append(inspect.getsource(obj))
    here = [source_fingerprint(s) for s in sources]
    assert len(sources) >= 10
    for python in other_pythons:
        there = fingerprints_under(python, sources)
        assert [p for p, a, b in zip(paths, here, there) if a != b] == [], python


@pytest.mark.skipif(SAFE_DIVIDE_FIXED, reason="safe_divide is not needed on this release")
def test_import_then_apply_reaches_every_binding_and_revert_restores_identity():
    original = compute._safe_divide
    user = types.ModuleType("user_module_imported_before")
    user._safe_divide = compute._safe_divide  # a user's `from ... import _safe_divide`
    sys.modules[user.__name__] = user
    try:
        holders = [m for m in modules_binding("_safe_divide") if m in sys.modules]
        assert len(holders) >= 10
        tmpatch.apply()
        wrapper = compute._safe_divide
        assert wrapper is not original and tmpatch.is_patched(wrapper)
        assert tmpatch.get_original(wrapper) is original
        for module in holders + [user.__name__]:
            assert vars(sys.modules[module]).get("_safe_divide") is wrapper, module
        tmpatch.apply()  # idempotent: still one layer
        assert compute._safe_divide is wrapper and wrapper.__wrapped__ is original
        tmpatch.revert()
        for module in holders + [user.__name__]:
            assert vars(sys.modules[module]).get("_safe_divide") is original, module
        tmpatch.apply()  # apply-revert-apply
        assert compute._safe_divide is wrapper and user._safe_divide is wrapper
    finally:
        tmpatch.revert()
        del sys.modules[user.__name__]
    assert compute._safe_divide is original


@pytest.mark.skipif(GATHER_FIXED, reason="gather_autograd is not needed on this release")
def test_default_arguments_are_rebound():
    from torchmetrics import metric

    original = distributed.gather_all_tensors
    assert metric.Metric._sync_dist.__defaults__[0] is original
    tmpatch.apply(["gather_autograd"])
    assert metric.Metric._sync_dist.__defaults__[0] is distributed.gather_all_tensors
    assert metric.gather_all_tensors is distributed.gather_all_tensors is not original
    tmpatch.revert()
    assert metric.Metric._sync_dist.__defaults__[0] is original and metric.gather_all_tensors is original


def test_selection_and_exclusion():
    report = tmpatch.apply(["mean_default_weight", "safe_divide"], exclude="safe_divide")
    assert report["safe_divide"].state == "excluded"
    assert report["cumsum_device"].state == "excluded"
    assert report["mean_default_weight"].state == "applied"
    report = tmpatch.revert()
    assert report["mean_default_weight"].state == "reverted"


def test_code_tmpatch_does_not_know_is_left_alone(monkeypatch):
    def _safe_divide(num, denom, zero_division=0.0):  # somebody's local fork
        return num / denom

    monkeypatch.setattr(compute, "_safe_divide", _safe_divide)
    report = tmpatch.apply(["safe_divide"])
    assert report["safe_divide"].state == "mismatch"
    assert "not recognised" in report["safe_divide"].reason
    assert compute._safe_divide is _safe_divide
    with pytest.raises(tmpatch.TmpatchError, match="safe_divide"):
        tmpatch.apply(["safe_divide"], strict=True)


def test_a_target_wrapped_by_another_tool_first_is_left_alone(monkeypatch):
    theirs = wrapt.FunctionWrapper(compute._safe_divide, lambda w, i, a, k: w(*a, **k))
    monkeypatch.setattr(compute, "_safe_divide", theirs)
    report = tmpatch.apply(["safe_divide"])
    assert report["safe_divide"].state == "mismatch" and "FunctionWrapper" in report["safe_divide"].reason
    assert compute._safe_divide is theirs


def test_releases_outside_the_known_range_are_unsupported(monkeypatch):
    monkeypatch.setattr(torchmetrics, "__version__", "0.9.3")
    report = tmpatch.apply()
    assert set(report.states().values()) == {"unsupported"}
    assert "0.9.3" in report["safe_divide"].reason


def test_a_failing_patch_leaves_the_original_and_says_why(monkeypatch):
    patch = catalogue.load("mean_default_weight")
    target = patch.targets[0]

    def broken(module):
        raise RuntimeError("replacement could not be built")

    saved = target.variants
    variants = tuple(Variant(v.releases, v.fingerprint, broken) for v in saved)
    object.__setattr__(target, "variants", variants)
    try:
        original = vars(torchmetrics.aggregation.MeanMetric)["update"]
        report = tmpatch.apply(["mean_default_weight"])
        assert report["mean_default_weight"].state == "failed"
        assert "could not be built" in report["mean_default_weight"].reason
        assert vars(torchmetrics.aggregation.MeanMetric)["update"] is original
    finally:
        object.__setattr__(target, "variants", saved)


APPLY_THEN_IMPORT = r"""
import sys, os
import tmpatch
report = tmpatch.apply()
assert set(report.states().values()) <= {"pending", "not-needed"} | SETTLED, report  # not-needed: no target here
assert "torch" not in sys.modules and "torchmetrics" not in sys.modules
import torchmetrics
from torchmetrics.utilities import compute
from torchmetrics.classification import MulticlassAccuracy
states = tmpatch.status().states()
assert {n for n, s in states.items() if s == "pending"} <= LAZY_PATCHES, states
wrapper = compute._safe_divide
if states["safe_divide"] == "applied":
    assert tmpatch.is_patched(wrapper)
    holders = [n for n, m in list(sys.modules.items()) if n.startswith("torchmetrics") and "_safe_divide" in vars(m)]
    assert len(holders) >= 10, holders
    assert all(vars(sys.modules[n])["_safe_divide"] is wrapper for n in holders)
    lazy = [n for n in LAZY if n not in sys.modules]
    for name in lazy:
        __import__(name)
        assert vars(sys.modules[name])["_safe_divide"] is wrapper, name
    original = tmpatch.get_original(wrapper)
    tmpatch.revert()
    assert compute._safe_divide is original
    assert all(vars(sys.modules[n])["_safe_divide"] is original for n in holders + lazy)
else:
    tmpatch.revert()
import wrapt
assert not any("torchmetrics" in k for k in wrapt.importer._post_import_hooks)
print("ok", len(holders) if states["safe_divide"] == "applied" else 0)
"""


def test_apply_before_import_arms_hooks_imports_nothing_and_reaches_lazy_modules():
    lazy = [m for m in modules_binding("_safe_divide") if m not in sys.modules and ".segmentation" in m]
    settled = {"unsupported"} if release_in("<0.11.0") else set()  # a patch 0.10 declines (legacy_dice_checks)
    proc = run_python(f"LAZY = {lazy!r}\nLAZY_PATCHES = {set(lazily_imported_patches())!r}\nSETTLED = {settled!r}\n"
                      + APPLY_THEN_IMPORT)
    assert proc.stdout.startswith("ok")


def test_revert_before_import_disarms_every_hook():
    proc = run_python(r"""
        import sys, wrapt, tmpatch
        tmpatch.apply()
        assert any(k.startswith("torchmetrics") for k in wrapt.importer._post_import_hooks)
        report = tmpatch.revert()
        assert set(report.states().values()) <= {"reverted", "not-needed", "off"}, report
        assert not any(k.startswith("torchmetrics") for k in wrapt.importer._post_import_hooks)
        import torchmetrics
        from torchmetrics.utilities import compute
        assert not tmpatch.is_patched(compute._safe_divide)
        print("ok")
    """)
    assert proc.stdout.strip() == "ok"


def test_missing_torchmetrics_warns_once_and_strict_raises():
    proc = run_python(r"""
        import sys, warnings
        sys.modules["torchmetrics"] = None   # as if not installed
        import tmpatch
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            report = tmpatch.apply()
            tmpatch.apply()
        ours = [w for w in caught if issubclass(w.category, tmpatch.TmpatchWarning)]
        assert len(ours) == 1, caught
        assert ours[0].filename == "<string>", ours[0].filename  # the caller's line, not tmpatch's
        assert "not installed" in report["safe_divide"].reason
        try:
            tmpatch.apply(strict=True)
        except tmpatch.TmpatchError as exc:
            assert "not installed" in str(exc)
        else:
            raise AssertionError("strict did not raise")
        print("ok")
    """)
    assert proc.stdout.strip() == "ok"


@pytest.mark.parametrize("collecting", [True, False])
def test_apply_and_revert_leave_the_collector_as_they_found_it(collecting, monkeypatch):
    """apply() pauses the cyclic collector while it works (nothing it drops reaches an old
    generation) and puts it back as it was: on only if it was on, thresholds untouched."""
    import gc

    seen = []
    real = catalogue.load

    def load(name):
        seen.append(gc.isenabled())
        return real(name)

    monkeypatch.setattr(catalogue, "load", load)
    thresholds, frozen = gc.get_threshold(), gc.get_freeze_count()
    was = gc.isenabled()
    (gc.enable if collecting else gc.disable)()
    try:
        tmpatch.revert()
        seen.clear()
        tmpatch.apply()
        assert seen and not any(seen)  # paused while apply() works
        assert gc.isenabled() is collecting
        seen.clear()
        tmpatch.revert()
        assert seen and not any(seen)
        assert gc.isenabled() is collecting
        assert (gc.get_threshold(), gc.get_freeze_count()) == (thresholds, frozen)
    finally:
        tmpatch.revert()
        (gc.enable if was else gc.disable)()


def test_concurrent_apply_gives_one_layer():
    import threading

    from torchmetrics import aggregation

    original = vars(aggregation.MeanMetric)["update"]
    barrier = threading.Barrier(8)
    errors = []

    def worker():
        try:
            barrier.wait()
            tmpatch.apply()
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    wrapper = vars(aggregation.MeanMetric)["update"]
    assert tmpatch.is_patched(wrapper) and wrapper.__wrapped__ is original


def test_an_exception_inside_a_patch_never_reaches_the_users_import():
    proc = run_python(r"""
        import tmpatch
        from tmpatch import patches
        from tmpatch.spec import Variant
        target = patches.load("mean_default_weight").targets[0]
        def broken(module):
            raise RuntimeError("boom in a replacement")
        object.__setattr__(target, "variants",
                           tuple(Variant(v.releases, v.fingerprint, broken) for v in target.variants))
        tmpatch.apply()
        import torchmetrics                     # must not raise
        row = tmpatch.status()["mean_default_weight"]
        assert row.state == "failed" and "boom" in row.reason, row
        assert not tmpatch.is_patched(vars(torchmetrics.aggregation.MeanMetric)["update"])
        assert torchmetrics.MeanMetric()(2.0).item() == 2.0
        print("ok")
    """)
    assert proc.stdout.strip() == "ok"


def test_the_reason_names_the_releases_every_target_shares():
    from tmpatch.control.gating import common as _common
    from tmpatch.spec import Variant, span

    def found(*ranges):
        return [(None, Variant(span(*r.split("-")), "x")) for r in ranges]

    assert _common(found("1.0.0-1.5.2", "1.4.0-1.6.1", "1.3.0.post0-1.9.0")) == "1.4.0-1.5.2"
    assert _common(found("1.6.0", "1.0.0-1.9.0")) == "1.6.0"
    assert _common(found("1.0.0-1.2.0", "1.4.0")) == "1.0.0-1.2.0, 1.4.0"  # no overlap: listed


# -- issue #11 item 8: another tool's wrapper, mock.patch, revert, re-apply ----------------------
def _bindings(module_name: str, name: str):
    """The loaded torchmetrics modules binding ``name`` (the defining one first)."""
    holders = [m for m in modules_binding(name) if m in sys.modules and name in vars(sys.modules[m])]
    return [module_name] + [m for m in holders if m != module_name]


def _ours(value) -> bool:
    return tmpatch.is_patched(value)


@pytest.mark.parametrize("module_name, name, patch", [
    ("torchmetrics.utilities.data", "_bincount", "bincount"),
    ("torchmetrics.utilities.compute", "_safe_divide", "safe_divide"),
])
def test_item8_a_foreign_wrapper_revert_and_apply_again_reach_every_binding(module_name, name, patch):
    module = sys.modules[module_name]
    original = vars(module)[name]
    holders = _bindings(module_name, name)
    assert len(holders) >= 3, holders
    report = tmpatch.apply(patch)
    if report[patch].state != "applied":
        pytest.skip(f"{patch} is {report[patch].state} on this release")
    wrapt.wrap_function_wrapper(module, name, lambda wrapped, instance, args, kwargs: wrapped(*args, **kwargs))
    theirs = vars(module)[name]
    try:
        report = tmpatch.revert()
        assert "wrapped on top of tmpatch" in report[patch].reason
        assert all(vars(sys.modules[m])[name] is original for m in holders[1:])
        report = tmpatch.apply(patch)
        assert report[patch].state == "applied"
        assert vars(module)[name] is theirs and _ours(theirs.__wrapped__)  # theirs on top, ours armed below
        left = [m for m in holders[1:] if not _ours(vars(sys.modules[m])[name])]
        assert left == [], f"{len(left)} of {len(holders) - 1} bindings not patched: {left}"
        tmpatch.revert()
        assert all(vars(sys.modules[m])[name] is original for m in holders[1:])
    finally:
        tmpatch.revert()
        setattr(module, name, original)


def test_item8_a_mock_around_revert_is_shown_in_status_and_apply_rearms_every_binding():
    from unittest import mock

    from torchmetrics.utilities import data

    original = data._bincount
    holders = _bindings("torchmetrics.utilities.data", "_bincount")
    assert tmpatch.apply("bincount")["bincount"].state == "applied"
    wrapper = data._bincount
    with mock.patch("torchmetrics.utilities.data._bincount"):
        report = tmpatch.revert()
        assert report["bincount"].reason == "originals restored"
    assert data._bincount is wrapper and not tmpatch.is_patched(wrapper)  # the mock put back what it found
    reason = tmpatch.status()["bincount"].reason
    assert reason.startswith("originals restored; tmpatch's inactive wrapper is in ") and \
        "torchmetrics.utilities.data._bincount" in reason, reason
    assert all(vars(sys.modules[m])["_bincount"] is original for m in holders[1:])
    assert tmpatch.apply("bincount")["bincount"].state == "applied"
    assert all(vars(sys.modules[m])["_bincount"] is wrapper for m in holders), holders
    assert tmpatch.is_patched(wrapper)
    report = tmpatch.revert()
    assert report["bincount"].reason == "originals restored"
    assert all(vars(sys.modules[m])["_bincount"] is original for m in holders)


@pytest.mark.skipif(not torch_at_least(2, 5), reason="coalesced_sync needs torch 2.5 or later")
def test_two_patches_wrapping_one_target_are_joined_and_taken_off_one_at_a_time():
    """deferred_reports and coalesced_sync both wrap MetricCollection.compute: one layer runs
    both (the first in catalogue order outermost), and reverting one leaves the other's."""
    from torchmetrics import MetricCollection

    original = vars(MetricCollection)["compute"]
    calls = []
    patches = {name: catalogue.load(name) for name in ("deferred_reports", "coalesced_sync")}
    saved = {}
    for name, patch in patches.items():
        target = next(t for t in patch.targets if t.qualname == "MetricCollection.compute")

        def build(module, name=name):
            def compute(release, self, *args, **kwargs):
                calls.append(name)
                return release(self, *args, **kwargs)

            return compute

        saved[name] = (target, target.variants)
        object.__setattr__(target, "variants",
                           tuple(Variant(v.releases, v.fingerprint, build) for v in target.variants))
    try:
        report = tmpatch.apply(list(patches))
        assert {n: report[n].state for n in patches} == {n: "applied" for n in patches}
        collection = MetricCollection([torchmetrics.MeanMetric()])
        collection.update(torch_tensor())
        collection.compute()
        assert calls == ["deferred_reports", "coalesced_sync"]
        calls.clear()
        tmpatch.revert(["deferred_reports"])
        collection.compute()
        assert calls == ["coalesced_sync"]
        tmpatch.revert()
        assert vars(MetricCollection)["compute"] is original
    finally:
        for target, variants in saved.values():
            object.__setattr__(target, "variants", variants)


def torch_tensor():
    import torch

    return torch.tensor([1.0, 2.0])


@pytest.fixture
def with_setting(tmp_path, monkeypatch):
    """mean_default_weight given a setting of ``toysetting.Box.value`` (a module not imported yet)
    and an ``after_revert`` that records what it sees there."""
    from tmpatch.spec import LEAVE, Setting

    (tmp_path / "toysetting.py").write_text("class Box:\n    pass\n\nvalue = 'release'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    patch = catalogue.load("mean_default_weight")
    seen = []
    choice = {"value": "ours"}

    def value(module):
        if choice["value"] is Exception:
            raise RuntimeError("no value here")
        return choice["value"]

    def after_revert():
        seen.append(vars(sys.modules["toysetting"].Box).get("value", "absent"))

    saved = (patch.settings, patch.after_revert)
    object.__setattr__(patch, "settings", (Setting("toysetting", "Box.value", value),
                                           Setting("toysetting", "value", lambda module: LEAVE)))
    object.__setattr__(patch, "after_revert", after_revert)
    try:
        yield patch, seen, choice
    finally:
        tmpatch.revert()
        object.__setattr__(patch, "settings", saved[0])
        object.__setattr__(patch, "after_revert", saved[1])
        sys.modules.pop("toysetting", None)


def test_a_setting_waits_for_its_module_and_goes_after_after_revert(with_setting):
    patch, seen, _ = with_setting
    report = tmpatch.apply(["mean_default_weight"])
    row = report["mean_default_weight"]
    assert row.state == "pending" and "toysetting" in row.reason, row  # nothing done before it is loaded
    assert "toysetting" in tmpatch.control.api.armed()
    import toysetting

    assert tmpatch.status()["mean_default_weight"].state == "applied"
    assert vars(toysetting.Box)["value"] == "ours" and toysetting.value == "release"  # LEAVE: left as it is
    report = tmpatch.revert(["mean_default_weight"])
    assert seen == ["ours"]  # after_revert ran while the setting was still in place
    assert "value" not in vars(toysetting.Box) and toysetting.value == "release"
    assert report["mean_default_weight"].reason == "originals restored"


def test_a_setting_replaced_by_another_tool_is_left_and_said(with_setting):
    patch, seen, _ = with_setting
    import toysetting

    assert tmpatch.apply(["mean_default_weight"])["mean_default_weight"].state == "applied"
    toysetting.Box.value = "theirs"
    row = tmpatch.revert(["mean_default_weight"])["mean_default_weight"]
    assert row.state == "reverted" and "toysetting.Box.value was set again by another tool" in row.reason, row
    assert vars(toysetting.Box)["value"] == "theirs"


def test_a_setting_that_cannot_be_made_leaves_the_patch_out_whole(with_setting):
    patch, seen, choice = with_setting
    import toysetting
    from torchmetrics.aggregation import MeanMetric

    original = vars(MeanMetric)["update"]
    choice["value"] = Exception
    row = tmpatch.apply(["mean_default_weight"])["mean_default_weight"]
    assert row.state == "failed" and "no value here" in row.reason, row
    assert vars(MeanMetric)["update"] is original and "value" not in vars(toysetting.Box)


#: a target of image_constants whose code a release yet to come changes (upstream's main branch did)
SSIM_UPDATE = "torchmetrics.functional.image.ssim:_ssim_update"
#: retrieval_check's check, which the class updates mark for: they go with it
RETRIEVAL_CHECK = "torchmetrics.utilities.checks:_check_retrieval_target_and_prediction_types"


def _child_path(folder: str) -> dict:
    return {"PYTHONPATH": os.pathsep.join([folder] + [p for p in sys.path if p and os.path.isdir(p)])}


def test_a_changed_target_costs_its_own_repair_only(tmp_path):
    """One of image_constants' targets changed: PSNR, whose code did not, keeps its repair (1 -> 0 syncs on
    simulated CUDA); the row is partial and names the target left alone, which keeps the release's code."""
    folder = edited_release(str(tmp_path), {SSIM_UPDATE: "preds = preds  # changed upstream",
                                            RETRIEVAL_CHECK: "preds = preds  # changed upstream"})
    proc = run_python("""
        import json, torch, tmpatch
        from torchmetrics.functional.image import ssim
        from torchmetrics.image import PeakSignalNoiseRatio
        from tmpatch.audit import audit
        from tmpatch.audit.panel.rows import update_all

        def syncs():
            g = torch.Generator().manual_seed(0)
            images = torch.rand(2, 3, 8, 8, generator=g), torch.rand(2, 3, 8, 8, generator=g)
            return audit(update_all, [(PeakSignalNoiseRatio(data_range=1.0), images, {})], device="cuda:0").count

        before = syncs()
        release = ssim._ssim_update
        report = tmpatch.apply(["image_constants", "retrieval_check", "safe_divide"], strict=["safe_divide"])
        row, marks = report["image_constants"], report["retrieval_check"]
        try:
            tmpatch.apply(["image_constants", "safe_divide"], strict="image_constants")
            strict = ""
        except tmpatch.TmpatchError as exc:
            strict = str(exc)
        print(json.dumps({"state": row.state, "reason": row.reason, "before": before, "after": syncs(),
                          "marks": [marks.state, marks.reason], "strict": strict, "release": report.release,
                          "first": str(report).splitlines()[0],
                          "differs": {r["name"]: r["code_differs"] for r in report.to_dict() if r["code_differs"]},
                          "compared": sorted({r["code_compared_with"] for r in report.to_dict()}),
                          "ssim_left": ssim._ssim_update is release and not tmpatch.is_patched(release)}))
    """, env=_child_path(folder))
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (found["state"], found["before"], found["after"], found["ssim_left"]) == ("partial", 1, 0, True), found
    assert "left alone: torchmetrics.functional.image.ssim._ssim_update (code not recognised" in found["reason"]
    assert found["strict"].startswith("tmpatch: could not apply image_constants (partial: ") and \
        "torchmetrics.functional.image.ssim._ssim_update (code not recognised" in found["strict"], found["strict"]
    release = torchmetrics.__version__  # status() says how far the code is the release's, in its first line
    assert found["release"].startswith(f"{release} (code differs from the {release} wheel in 2 of ") and \
        found["release"].endswith(" targets: torchmetrics.utilities.checks._check_retrieval_target_and_prediction_"
                                  "types, torchmetrics.functional.image.ssim._ssim_update)"), found["release"]
    assert found["first"] == f"torchmetrics {found['release']}"[:len(found["first"])]
    # status --json says it per row: the wheel compared with, and which of the patch's targets differ
    assert found["compared"] == [release]
    check = "torchmetrics.utilities.checks._check_retrieval_target_and_prediction_types"
    assert found["differs"]["image_constants"] == ["torchmetrics.functional.image.ssim._ssim_update"], found
    assert found["differs"]["retrieval_check"] == [check], found
    assert all(check in paths or "_ssim_update" in paths[0] for paths in found["differs"].values()), found
    state, reason = found["marks"]  # the updates that mark for the check are left alone with it, and said so
    assert state == "mismatch" and reason.startswith(
        "torchmetrics.utilities.checks._check_retrieval_target_and_prediction_types (code not recognised"), reason
    assert ("torchmetrics.retrieval.base.RetrievalMetric.update, torchmetrics.retrieval.precision_recall_curve."
            "RetrievalPrecisionRecallCurve.update left alone with torchmetrics.utilities.checks.") in reason, reason


def test_a_pending_row_names_the_imports_that_apply_it():
    """After ``import torchmetrics``, each pending row names the modules it waits for; importing exactly
    those (in a fresh process each) applies it: the row says what is true."""
    proc = run_python("""
        import json, torchmetrics, tmpatch
        print(json.dumps({r.name: r.reason for r in tmpatch.apply() if r.state == "pending"}))
    """)
    pending = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(pending) == set(lazily_imported_patches())
    for name, reason in pending.items():
        assert reason.startswith("armed: applies when ") and reason.endswith(" imported"), reason
        named = reason[len("armed: applies when "):].rsplit(" ", 2)[0].replace(" and ", ", ").split(", ")
        proc = run_python(f"""
            import importlib, torchmetrics, tmpatch
            tmpatch.apply()
            for module in {named!r}:
                importlib.import_module(module)
            print(tmpatch.status()[{name!r}].state)
        """)
        assert proc.stdout.strip().splitlines()[-1] not in ("pending", "off"), (name, reason, proc.stdout)


@pytest.mark.parametrize("strict", [True, False])
def test_strict_about_an_armed_patch_raises_in_the_import_that_finds_its_code_changed(tmp_path, strict):
    """apply(strict=...) before a patch's modules are imported: the patch is armed, and the import that
    installs it raises TmpatchError where its code is not recognised (as apply() would have, had the
    modules been imported then); not strict about it, the import goes on and the row says why. A
    revert() in between takes the strictness back."""
    lazy = sorted(lazily_imported_patches())
    if not lazy:
        pytest.skip("every patch applies at `import torchmetrics` on this release")
    name = lazy[0]
    target = gating.here(catalogue.load(name), catalogue.release())[0]
    folder = edited_release(str(tmp_path), {f"{target.module}:{target.qualname}": "pass  # changed upstream"})
    proc = run_python(f"""
        import importlib, json, tmpatch
        tmpatch.apply([{name!r}, "safe_divide"], strict={[name] if strict else ["safe_divide"]!r})
        tmpatch.apply(["safe_divide"], strict=["safe_divide"])  # a later strict apply of others keeps it
        import torchmetrics
        pending = tmpatch.status()[{name!r}].state
        try:
            importlib.import_module({target.module!r})
            error = ""
        except tmpatch.TmpatchError as exc:
            error = str(exc)
        print(json.dumps({{"pending": pending, "error": error, "state": tmpatch.status()[{name!r}].state}}))
    """, env=_child_path(folder))
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert found["pending"] == "pending" and found["state"] in ("mismatch", "partial"), found
    if strict:
        assert found["error"].startswith(f"tmpatch: could not apply {name} ({found['state']}: "), found
        assert f"{target.path} (code not recognised" in found["error"], found
        assert "safe_divide" not in found["error"]
    else:
        assert found["error"] == ""
    # reverted before its modules came: nothing is strict about it any more
    proc = run_python(f"""
        import importlib, tmpatch
        tmpatch.apply([{name!r}], strict=True)
        tmpatch.revert([{name!r}])
        tmpatch.apply([{name!r}])
        import torchmetrics
        importlib.import_module({target.module!r})
        print(tmpatch.status()[{name!r}].state)
    """, env=_child_path(folder))
    assert proc.stdout.strip().splitlines()[-1] in ("mismatch", "partial")
