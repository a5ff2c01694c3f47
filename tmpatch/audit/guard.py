"""A CUDA device guard for CPU-only torch builds, so fake CUDA tensors index and convert.

Python bindings such as ``Tensor.__getitem__``, ``float(t)``, ``torch.nonzero`` and
``Tensor.to("cuda")`` open a C++ device guard for the tensor's device before
dispatching. A CPU-only build registers no CUDA guard, so on a fake CUDA tensor they
fail with "PyTorch is not linked with support for cuda devices", and
``torch._C._ensureCUDADeviceGuardSet()`` (what FakeTensorMode calls) only replaces a
guard that exists. Here torch's own Python-backed guard class
(``torch._C._acc.DeviceGuard``, made for PrivateUse1 backends) is created with
``type_() == CUDA``, registered through torch's PrivateUse1 entry point, and its
pointer moved into the CUDA slot of c10's guard registry (the PrivateUse1 slot is put
back). The guard is a no-op that always reports device index 0, which is why
``.cuda()`` and ``.to("cuda")`` land on ``cuda:0`` (the current device on a real GPU
unless changed). It is installed only while a simulation is active and only where no
CUDA guard is registered.
"""
from __future__ import annotations

import ctypes
import logging
import os
import sys
import threading
from typing import Any, Optional

import torch

log = logging.getLogger("tmpatch")

_REGISTRY_SYMBOL = "_ZN3c104impl26device_guard_impl_registryE"
_lock = threading.Lock()
_state: dict = {"ptr": None, "guard": None, "users": 0, "installed": False, "failed": False}


def _registry() -> Any:
    names = {"linux": "libc10.so", "darwin": "libc10.dylib", "win32": "c10.dll"}
    lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", names.get(sys.platform, "libc10.so")))
    size = int(torch._C._autograd.DeviceType.PrivateUse1.value) + 1
    return (ctypes.c_void_p * size).in_dll(lib, _REGISTRY_SYMBOL)


def _make_guard_ptr(reg: Any) -> Optional[int]:
    pu1 = int(torch._C._autograd.DeviceType.PrivateUse1.value)
    cuda = torch._C._autograd.DeviceType.CUDA

    class _SimCudaGuard(torch._C._acc.DeviceGuard):
        def type_(self) -> Any:
            return cuda

    guard = _SimCudaGuard()
    previous = reg[pu1]
    try:
        torch._C._acc.register_python_privateuseone_device_guard(guard)
        ptr = reg[pu1]
    finally:
        reg[pu1] = previous
    _state["guard"] = guard  # keep the Python object alive for the C++ side
    return ptr


def acquire() -> bool:
    """Make sure a CUDA device guard is registered; True when fake CUDA tensors can be indexed."""
    if torch.cuda.is_available() or torch.cuda._is_compiled():
        return True  # a real CUDA guard exists; FakeTensorMode handles the no-GPU case itself
    with _lock:
        _state["users"] += 1
        if _state["failed"]:
            return False
        try:
            reg = _registry()
            cuda = int(torch._C._autograd.DeviceType.CUDA.value)
            if reg[cuda]:
                return True
            if _state["ptr"] is None:
                _state["ptr"] = _make_guard_ptr(reg)
            reg[cuda] = _state["ptr"]
            _state["installed"] = True
            return True
        except Exception as exc:  # noqa: BLE001 - any failure only degrades the simulation
            _state["failed"] = True
            log.warning("tmpatch.audit: no simulated CUDA device guard (%s); indexing fake CUDA "
                        "tensors will fail", exc)
            return False


def release() -> None:
    """Undo one :func:`acquire`; the guard leaves the registry with its last user."""
    if torch.cuda.is_available() or torch.cuda._is_compiled():
        return
    with _lock:
        _state["users"] = max(0, _state["users"] - 1)
        if _state["users"] == 0 and _state["installed"]:
            reg = _registry()
            cuda = int(torch._C._autograd.DeviceType.CUDA.value)
            if reg[cuda] == _state["ptr"]:
                reg[cuda] = None
            _state["installed"] = False
