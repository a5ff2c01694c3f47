"""Keep simulated CUDA away from the CUDA runtime, on every kind of torch build.

Python bindings such as ``Tensor.__getitem__``, ``float(t)`` and ``Tensor.to("cuda")``
open a C++ device guard for the tensor's device before dispatching to the fake mode.
On a CPU-only build no CUDA guard is registered ("PyTorch is not linked with support
for cuda devices"); on a CUDA build the registered guard calls the CUDA runtime, which
fails without a GPU or driver ("CUDA driver version is insufficient"). While a
simulation is active the CUDA slot of c10's guard registry therefore holds a no-op
guard, and the previous entry is put back after it:

* torch >= 2.10-ish has a Python-backed guard class (``torch._C._acc.DeviceGuard``, made
  for PrivateUse1 backends): one is created with ``type_() == CUDA`` through torch's
  PrivateUse1 entry point and its pointer moved into the CUDA slot (the PrivateUse1 slot
  is put back);
* older torch: the Meta device's guard (a no-op that reports no device index) is lent
  to the CUDA slot.

Older torch also calls ``torch.cuda._lazy_init()`` (which loads the driver) from the
bindings of CUDA factories, and FakeTensor asks ``torch.cuda.current_device()`` for a
CUDA device without an index. Both are shimmed while CUDA is not initialised: no lazy
init unless a GPU is really there, and the current device is 0 (what a real GPU
answers unless changed). ``torch.cuda.is_initialized()`` stays False.
"""
from __future__ import annotations

import ctypes
import logging
import os
import sys
import threading
from typing import Any, Callable, Dict, Optional

import torch

log = logging.getLogger("tmpatch")

_REGISTRY_SYMBOL = "_ZN3c104impl26device_guard_impl_registryE"
_lock = threading.Lock()
_state: Dict[str, Any] = {"ptr": None, "guard": None, "users": 0, "installed": False, "failed": False,
                          "saved": None, "kind": None, "shims": {}}


def _device_index(name: str) -> int:
    return int(getattr(torch._C._autograd.DeviceType, name).value)


def _registry() -> Any:
    names = {"linux": "libc10.so", "darwin": "libc10.dylib", "win32": "c10.dll"}
    lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", names.get(sys.platform, "libc10.so")))
    return (ctypes.c_void_p * (_device_index("PrivateUse1") + 1)).in_dll(lib, _REGISTRY_SYMBOL)


def _python_guard_ptr(reg: Any) -> Optional[int]:
    """A CUDA-typed no-op guard through torch's Python PrivateUse1 guard (None: not in this torch)."""
    acc = getattr(torch._C, "_acc", None)
    if acc is None or not hasattr(acc, "DeviceGuard") or not hasattr(acc, "register_python_privateuseone_device_guard"):
        return None
    pu1 = _device_index("PrivateUse1")
    cuda = torch._C._autograd.DeviceType.CUDA

    class _SimCudaGuard(acc.DeviceGuard):  # type: ignore[name-defined]  # a base found at run time
        def type_(self) -> Any:
            return cuda

    guard = _SimCudaGuard()
    previous = reg[pu1]
    try:
        acc.register_python_privateuseone_device_guard(guard)
        ptr = reg[pu1]
    finally:
        reg[pu1] = previous
    _state["guard"] = guard  # keep the Python object alive for the C++ side
    return ptr


def _guard_ptr(reg: Any) -> "tuple[int, str]":
    ptr = _python_guard_ptr(reg)
    if ptr:
        return ptr, "python"
    meta = reg[_device_index("Meta")]
    if not meta:
        raise RuntimeError("this torch registers no Meta device guard to lend")
    return meta, "meta"


def guard_kind() -> Optional[str]:
    """``"python"`` or ``"meta"``: the no-op guard in use (None before the first simulation)."""
    return _state["kind"]


# -- torch.cuda shims ---------------------------------------------------------------------------

def _lazy_init_shim(real: Callable[[], None]) -> Callable[[], None]:
    def _lazy_init() -> None:
        if torch.cuda.is_available():  # a real GPU: initialise it for real
            real()

    return _lazy_init


def _install_shims() -> None:
    if torch.cuda.is_initialized():
        return  # a real, initialised GPU: nothing would call the driver for the first time
    shims = {"_lazy_init": _lazy_init_shim(torch.cuda._lazy_init), "current_device": lambda: 0}
    _state["shims"] = {name: getattr(torch.cuda, name) for name in shims}
    for name, shim in shims.items():
        setattr(torch.cuda, name, shim)


def _remove_shims() -> None:
    for name, original in _state["shims"].items():
        setattr(torch.cuda, name, original)
    _state["shims"] = {}


# -- acquire / release --------------------------------------------------------------------------

def acquire() -> bool:
    """Install the no-op CUDA guard (and shims) for one more user; True when it is in place."""
    with _lock:
        _state["users"] += 1
        if _state["installed"]:
            return True
        if _state["failed"]:
            return False
        try:
            reg = _registry()
            if _state["ptr"] is None:
                _state["ptr"], _state["kind"] = _guard_ptr(reg)
            cuda = _device_index("CUDA")
            _state["saved"] = reg[cuda]
            reg[cuda] = _state["ptr"]
            _install_shims()
            _state["installed"] = True
            return True
        except Exception as exc:  # noqa: BLE001 - any failure only degrades the simulation
            _state["failed"] = True
            log.warning("tmpatch.audit: no simulated CUDA device guard (%s); indexing simulated CUDA "
                        "tensors will fail", exc)
            return False


def release() -> None:
    """Undo one :func:`acquire`; the registry and ``torch.cuda`` are restored with the last user."""
    with _lock:
        _state["users"] = max(0, _state["users"] - 1)
        if _state["users"] or not _state["installed"]:
            return
        reg = _registry()
        cuda = _device_index("CUDA")
        if reg[cuda] == _state["ptr"]:
            reg[cuda] = _state["saved"]
        _remove_shims()
        _state["installed"] = False
        _state["saved"] = None
