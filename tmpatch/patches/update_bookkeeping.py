"""update_bookkeeping: an update's bookkeeping without the Python frames of torch's generic paths.

Defect (host time only; every release, not fixed upstream). Every ``update()`` runs
``Metric._wrap_update``'s ``wrapped_func``: it assigns ``self._computed = None`` and
``self._update_count += 1``, enters ``torch.set_grad_enabled(self._enable_grad)``, and the
update assigns each state it accumulates (``self.tp += tp``); ``forward()`` does more.

* Each assignment runs ``Metric.__setattr__`` (a check of six constant names), then
  ``nn.Module.__setattr__`` (its parameter, module and buffer branches, with
  ``isinstance`` checks of ``Parameter`` and ``Buffer`` whose metaclasses run Python
  ``__instancecheck__``): four Python frames for what ends as ``object.__setattr__``.
* ``set_grad_enabled`` is a Python context manager: an object and three Python frames
  per update around two calls of torch's C function that sets the grad mode.

On a small CPU update that is about a fifth of its host time (MulticlassConfusionMatrix,
64 rows: 9 of 45 us); on a launch-bound GPU step host time is step time.

Repair, where torch's own code provably does nothing more, and the release's code
everywhere else:

* ``Metric.__setattr__`` stores the value in the instance's ``__dict__`` when the value
  is ``None``, a ``bool``, ``int`` or ``float``, or a plain ``torch.Tensor`` (that type
  exactly) with no attributes of its own (so neither ``Parameter`` nor ``Buffer``, whose
  checks read an ``_is_param`` / ``_is_buffer`` attribute); the name is already an
  instance attribute, not a parameter, buffer or submodule, and no attribute of the class
  or its bases (no property or other descriptor, none of the constants the release
  protects, which are class attributes; ``compiled_update``'s ``_update_count`` is one that
  stores so while no compiled update's count is pending); and torch.compile is not tracing.
  Which names a class and its bases lack is remembered per class (a lookup that misses
  costs an exception): a class attribute added later under the name of an instance
  attribute already assigned is not seen.
* ``wrapped_func``'s ``with torch.set_grad_enabled(self._enable_grad):`` (an edit) does
  what the context manager's ``__init__`` and ``__exit__`` do, with torch's C functions:
  keep the grad mode found, set the metric's, run the block, and in ``finally`` put the
  mode found back; while torch.compile traces, the release's ``with`` runs. The block's
  body is the release's own statements in both branches.

Both stand for torch's code, so torch's ``Module.__setattr__``, the two metaclass checks
and ``set_grad_enabled``'s ``__init__``/``__enter__``/``__exit__`` are recognised by
fingerprint (every torch release from 2.1.2 to 2.15.0): with another torch, a target whose
torch code is not recognised is left alone and the other is repaired. No result, state, error or warning changes.

Releases: 0.10.0-1.9.0 (two implementations of ``Metric.__setattr__``: 0.10-0.11 protect
three constant names, 1.0.0+ six; one of ``Metric._wrap_update``, which ``compiled_update``
edits too).
"""
from __future__ import annotations

import weakref
from types import ModuleType
from typing import Any, Callable, Dict, Set

from tmpatch.runtime.compiled import PLAIN_SLOT, compiling, inline_only, pending
from tmpatch.spec import Edit, Patch, Requirement, Rewrite, Route, Target, Variant, inline, since, span

#: torch's code the repair stands for, by fingerprint: what ``nn.Module.__setattr__`` does with a value
#: that is neither a Parameter, a Module nor a Buffer, under a name that is none of theirs, and what the
#: release's ``torch.set_grad_enabled(mode)`` block does around its body. Read from the sources of every
#: torch release 2.1.2 to 2.15.0 (``tools/torch_fingerprints.py``); each change between them is in a
#: branch the repair never stands for (2.5: Buffer; 2.8 and 2.9: the buffer branch).
#: each target relies on the torch code it stands for only: a torch that changed the grad-mode
#: context manager costs the store its repair no more than the other way round
_SETATTR, _WRAP = ("Metric.__setattr__",), ("Metric._wrap_update",)
_TORCH = (
    Requirement("torch.nn.modules.module", "Module.__setattr__",
                ("2406e9aaa6d917fc", "49bd5f5bf54f09de", "88868aa5b9762db8", "eeeb8065cd4a2d65"), _SETATTR),
    Requirement("torch.nn.parameter", "_ParameterMeta.__instancecheck__",
                ("b7a04729bfdabf3b", "b4131a01db821147", "b3f4c8268a199dd0"), _SETATTR),
    Requirement("torch.nn.parameter", "_BufferMeta.__instancecheck__",
                (None, "2a949c272f244fe0", "fb0ff7ff0f8e118a"), _SETATTR),  # torch 2.5+ has Buffer
    Requirement("torch.autograd.grad_mode", "set_grad_enabled.__init__", ("a56adcb9c6181f8f", "d7ceb2ae69708e49"),
                _WRAP),
    Requirement("torch.autograd.grad_mode", "set_grad_enabled.__enter__", ("71e22c0a745b2eb3", "da420dce851354e1"),
                _WRAP),
    Requirement("torch.autograd.grad_mode", "set_grad_enabled.__exit__", ("760828d238434892",), _WRAP),
)


#: per class (weakly held), the names found on neither the class nor its bases: a lookup that
#: misses costs an AttributeError inside ``getattr`` (240 ns), once per class and name here
_FREE: Dict["weakref.ref[type]", Set[str]] = {}
_MISSING = object()


def _free(cls: type, name: str) -> bool:
    """Whether ``name`` is no attribute of ``cls`` or its bases (so no descriptor, no constant), or one
    whose store is a plain one while nothing is pending (``compiled.PLAIN_SLOT``)."""
    found = getattr(cls, name, _MISSING)
    if found is not _MISSING and not getattr(type(found), PLAIN_SLOT, False):
        return False
    free = _FREE.get(weakref.ref(cls))
    if free is None:
        free = _FREE[weakref.ref(cls, lambda ref: _FREE.pop(ref, None))] = set()
    free.add(name)
    return True


#: bound by :func:`build` (no torch import here): torch.Tensor, and the plain value types
Tensor: Any = None
_PLAIN: Any = frozenset()
_EMPTY: Dict[str, Any] = {}


# installed itself (spec.inline: no wrapper frame); not named __setattr__: dynamo inlines a function
# of that name only when its first argument is the object (the joined form passes the release's first).
# Nor is it a frame dynamo compiles on its own (inline_only), as it never compiles a __setattr__ frame:
# in eager code of a compiled step it would guard on each name assigned (a recompile per name)
@inline_only
def assign(self: Any, name: str, value: Any, *, _tmpatch_route: Route) -> None:
    """``Metric.__setattr__``: the plain store where the release's chain ends in one (module docstring)."""
    kind = type(value)
    if _tmpatch_route.on and not compiling() and (kind in _PLAIN or kind is Tensor) and not pending.counts:
        attributes = self.__dict__
        free = _FREE.get(weakref.ref(type(self)), _EMPTY)
        if (name in attributes and (kind is not Tensor or not value.__dict__)
                and (name in free or _free(type(self), name))
                and name not in attributes.get("_parameters", _EMPTY)
                and name not in attributes.get("_buffers", _EMPTY)
                and name not in attributes.get("_modules", _EMPTY)):
            attributes[name] = value
            return None
    return _tmpatch_route.original(self, name, value)


_ASSIGN = inline(assign)


def build(module: ModuleType) -> Callable[..., Any]:
    """``Metric.__setattr__``'s replacement, :func:`assign` (one object: every apply installs the same)."""
    global Tensor, _PLAIN
    import torch

    if any(hasattr(torch.Tensor, name) for name in ("_is_param", "_is_buffer")):
        raise RuntimeError("torch.Tensor has a class attribute _is_param or _is_buffer")
    Tensor, _PLAIN = torch.Tensor, frozenset({type(None), bool, int, float})
    return _ASSIGN


def _grad_names(module: ModuleType) -> Dict[str, Any]:
    import torch

    if torch.set_grad_enabled is not torch.autograd.grad_mode.set_grad_enabled:
        raise RuntimeError("torch.set_grad_enabled is not torch's own (replaced by another tool?)")

    return {"_tmpatch_is_grad": torch.is_grad_enabled, "_tmpatch_set_grad": torch._C._set_grad_enabled,
            "_tmpatch_tracing": compiling}


#: the grad-mode block of ``wrapped_func``: what ``set_grad_enabled``'s ``__init__`` and ``__exit__`` do
#: (keep the mode found, set ``mode``, put the one found back on the way out), as calls of torch's
#: C functions; while torch.compile traces, the release's ``with``. The body is the release's in both.
GRAD_MODE = Rewrite(
    (Edit("with torch.set_grad_enabled(self._enable_grad):\n    ...\n",
          "_tmpatch_mode = self._enable_grad\n"
          "if _tmpatch_tracing():\n"
          "    with torch.set_grad_enabled(_tmpatch_mode):\n"
          "        __tmpatch_body__\n"
          "else:\n"
          "    _tmpatch_prev = _tmpatch_is_grad()\n"
          "    _tmpatch_set_grad(_tmpatch_mode)\n"
          "    try:\n"
          "        __tmpatch_body__\n"
          "    finally:\n"
          "        _tmpatch_set_grad(_tmpatch_prev)\n"),),
    _grad_names,
)


PATCH = Patch(
    name="update_bookkeeping",
    summary="every update() assigns its count, its cache flag and each state through nn.Module.__setattr__ "
            "(four Python frames for a plain store) and enters a grad-mode context manager (three more)",
    known=since("0.10.0"),
    upstream="not fixed upstream (host time only; no sync)",
    relies_on=_TORCH,
    targets=(
        Target(
            module="torchmetrics.metric",
            qualname="Metric.__setattr__",
            variants=(Variant(span("0.10.0", "0.11.4"), "3383230dc727b07d", build),  # three constants, not six
                      Variant(span("1.0.0", "1.9.0"), "0d04ad13fbd10ca1", build)),
        ),
        Target(
            module="torchmetrics.metric",
            qualname="Metric._wrap_update",
            variants=(Variant(span("0.10.0", "1.9.0"), "204d7412e16fe670", GRAD_MODE),),
        ),
    ),
)
