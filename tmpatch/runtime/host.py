"""Where a patch may keep the release's plain statements: values that live in host memory.

Reading a CPU tensor's value (``.item()``, a Python ``if`` on it) is no host-device sync,
so on the CPU the patches keep the release's own statements where those are the cheaper
way (read a check at once, count a failing update alone, call ``torch.tensor``), and run
their device-side forms only where values live on an accelerator. These two functions
are that one decision, looked up at every call (the test suite replaces them to run the
device forms on the CPU, as a GPU does).
"""
from __future__ import annotations

from typing import Any


def on_host(tensor: Any) -> bool:
    """Whether ``tensor``'s values are in host memory (a CPU tensor)."""
    return tensor.is_cpu


def host_device(device: Any) -> bool:
    """Whether ``device`` (a ``torch.device``) is the host's."""
    return device.type == "cpu"
