"""The logic of the pytest plugin's ``no_sync`` fixture (:mod:`tmpatch.pytest_plugin`).

The plugin runs the test body inside :meth:`NoSyncFixture.guard` (and only the body: the
fixtures run outside). Inside, the first sync fails the test with a :class:`SyncError`;
nothing the body does can crash the process: a Metric built inside (its ``__init__``
deep-copies tensors) is built for real, and moving it to the device there is reported as
the host-to-device copy it is, with a hint to move it with :meth:`NoSyncFixture.put`.
"""
from __future__ import annotations

import contextlib
from typing import Any, Optional

import torch
from torch.utils._pytree import tree_map

from tmpatch.audit import support

support.require()  # below the range: an ImportError saying so (the plugin skips with it)

from tmpatch.audit.oracle.api import move_hint, no_sync  # noqa: E402
from tmpatch.audit.oracle.report import SyncPoint  # noqa: E402
from tmpatch.audit.oracle.sim import active, to_sim_cuda  # noqa: E402

HOW = "metric = no_sync.put(MeanMetric()); values = no_sync.put(values)"


def _hint(point: SyncPoint) -> str:
    return move_hint(point, HOW)


class NoSyncFixture:
    """What the ``no_sync`` fixture yields. In the test body, ``device`` is the CUDA device
    watched (a real GPU, else simulated); :meth:`put` moves metrics and tensors there
    without counting it as a sync."""

    def __init__(self, device: Any = "cuda:0", real: Optional[bool] = None) -> None:
        self.watched = torch.device(device)
        self.real = real
        self.device: Any = None  #: set by the plugin while the body runs

    def guard(self) -> "contextlib.AbstractContextManager[torch.device]":
        """The context the plugin runs the body in: :func:`tmpatch.audit.no_sync`."""
        return no_sync(self.watched, real=self.real, hint=_hint)

    def put(self, obj: Any) -> Any:
        """Move a tensor, a Metric/module, or a container of them to :attr:`device`, as set-up
        (not counted); returns it (modules are moved in place). Only inside the test body."""
        if self.device is None:
            raise RuntimeError("no_sync.put() works inside the test body (the fixtures run outside it)")
        if active() is not None:
            return to_sim_cuda(obj, self.device)
        return self._put_real(obj)

    def _put_real(self, obj: Any) -> Any:
        previous = torch.cuda.get_sync_debug_mode()
        torch.cuda.set_sync_debug_mode(0)  # set-up: the copies are not the code under test
        try:
            return tree_map(lambda v: v.to(self.device) if isinstance(v, (torch.Tensor, torch.nn.Module)) else v, obj)
        finally:
            torch.cuda.set_sync_debug_mode(previous)
