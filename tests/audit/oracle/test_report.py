"""AuditReport, SyncPoint, SyncKind and SyncError."""
import json

import pytest
import torch

from tmpatch.audit import AuditReport, SyncError, SyncKind, SyncPoint

pytestmark = pytest.mark.once  # nothing here depends on the torchmetrics release


def _points():
    return [
        SyncPoint(SyncKind.D2H_READ, "aten._local_scalar_dense", "/x/a.py:3", "f", "value read"),
        SyncPoint(SyncKind.H2D_COPY, "aten._to_copy", "/x/a.py:4", "f"),
        SyncPoint(SyncKind.D2H_READ, "aten.equal", "/x/b.py:9", "g"),
    ]


def test_kind_values_are_the_user_facing_texts():
    assert [k.value for k in SyncKind] == [
        "device-to-host read", "host-to-device copy", "device-to-host copy",
        "data-dependent shape", "implicit host-to-device copy (CPU index)",
        "implicit host-to-device copy (CPU value)", "linalg error check", "tensor formatted on the host",
        "explicit synchronize", "device mismatch", "non-blocking copy (pinned memory)"]
    assert SyncKind("device mismatch") is SyncKind.DEVICE_MISMATCH
    assert SyncKind.D2H_READ == "device-to-host read"
    assert [k.name for k in SyncKind if not k.is_sync] == ["DEVICE_MISMATCH", "PINNED_COPY"]


def test_non_syncs_are_filed_apart_and_not_counted():
    mismatch = SyncPoint(SyncKind.DEVICE_MISMATCH, "aten.add", "/x/a.py:5", "f", "cuda:0, cuda:1")
    pinned = SyncPoint(SyncKind.PINNED_COPY, "aten._to_copy", "/x/a.py:6", "f")
    report = AuditReport(device=torch.device("cuda:0"))
    for point in _points()[:1] + [mismatch, pinned]:
        report.add(point)
    assert report.count == 1 and report.sync_points == _points()[:1]
    assert report.non_syncs == [mismatch, pinned] and not mismatch.is_sync
    assert report.by_kind() == {"device-to-host read": 1}
    assert report.of_kind("device mismatch") == [mismatch] and len(report.points) == 3
    text = str(report)
    assert text.splitlines()[0] == "1 sync point(s) [simulated cuda:0]" and "2 other event(s), not syncs:" in text
    data = report.to_dict()
    assert data["count"] == 1 and [p["kind"] for p in data["non_syncs"]] == ["device mismatch",
                                                                              "non-blocking copy (pinned memory)"]


def test_sync_error_hint_is_a_second_line():
    err = SyncError(_points()[1], "move it before the block")
    assert str(err).splitlines()[1] == "move it before the block" and err.hint == "move it before the block"


def test_count_by_kind_of_kind():
    report = AuditReport(_points(), result=torch.zeros(2), device=torch.device("cuda:0"))
    assert report.count == 3
    assert report.by_kind() == {"device-to-host read": 2, "host-to-device copy": 1}
    assert [p.op for p in report.of_kind("device-to-host read")] == ["aten._local_scalar_dense", "aten.equal"]
    assert report.complete and report.result_devices == [torch.device("cpu")]


def test_str_has_one_line_per_sync_point():
    text = str(AuditReport(_points(), device=torch.device("cuda:1")))
    lines = text.splitlines()
    assert lines[0] == "3 sync point(s) [simulated cuda:1]"
    assert len(lines) == 4
    assert "device-to-host read" in lines[1] and "aten._local_scalar_dense" in lines[1]
    assert "/x/a.py:3 in f" in lines[1]


def test_to_dict_is_json():
    report = AuditReport(_points(), result=(torch.zeros(1), 3), device=torch.device("cuda:0"))
    data = json.loads(json.dumps(report.to_dict()))
    assert data["count"] == 3 and data["device"] == "cuda:0" and data["complete"]
    assert data["sync_points"][1] == {"kind": "host-to-device copy", "op": "aten._to_copy",
                                      "location": "/x/a.py:4", "function": "f", "detail": ""}
    assert data["result_devices"] == ["cpu"]


def test_sync_error_names_kind_op_and_location():
    err = SyncError(_points()[0])
    assert isinstance(err, RuntimeError)
    assert "device-to-host read" in str(err) and "aten._local_scalar_dense" in str(err)
    assert "/x/a.py:3" in str(err) and err.point.function == "f"
