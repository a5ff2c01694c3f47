"""What patched code may ask about tmpatch's own wrappers while it runs: whether a
function is one of them and in effect, and what the release's function under it is.

The control layer owns the engine that knows the wrappers; it answers these questions
by handing its lookup to :func:`answer_with` when it makes the engine. Until then
nothing is a wrapper. A patch asks here, never the public API or the engine.
"""
from __future__ import annotations

from typing import Any, Callable

#: ``obj`` -> the engine's layer whose wrapper ``obj`` is (``.active``, ``.original``), or None
LayerOf = Callable[[Any], Any]


def _none(obj: Any) -> None:
    return None


_layer_of: LayerOf = _none


def answer_with(layer_of: LayerOf) -> None:
    """Answer :func:`is_patched` and :func:`get_original` with ``layer_of`` (the engine's)."""
    global _layer_of
    _layer_of = layer_of


def is_patched(obj: Any) -> bool:
    """Whether ``obj`` is one of tmpatch's wrappers, in effect."""
    layer = _layer_of(obj)
    return layer is not None and layer.active


def get_original(obj: Any) -> Any:
    """The release's own function under a tmpatch wrapper (``obj`` otherwise)."""
    layer = _layer_of(obj)
    return obj if layer is None else layer.original
