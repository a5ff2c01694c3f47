"""A layer: tmpatch's wrapper around one target, and how that wrapper is made.

The engine (:mod:`tmpatch.engine.core`) puts a layer's wrapper in place and takes it out;
this module makes it, and gives it its replacement:

* a plain Python function (no proxy object: ``torch.compile`` traces it like the release's
  own code) that calls the replacement while the layer is active and the original once it
  is not. Where the original is a plain Python function (no ``*args``/``**kwargs``,
  defaults of plain values) the wrapper has its parameters and passes them on by position
  (:func:`_matching`: no argument tuple and dict, a fixed-argument call the interpreter runs
  without a C call, about a microsecond less per layer in place); the replacement must take
  the target's arguments so, and is refused otherwise (:func:`_check_takes`). Either runs in
  the target's globals with the target's file and first line (:func:`_seated`): what
  TorchScript compiles through it is the target's own source, its names and its file;
* a replacement with a gate (``GATE``) is called only while the gate answers something;
* a replacement with an inline form (``spec.INLINE``: ``spec.inline``, and every edited
  function of ``tmpatch.engine.rewrite``) is installed itself: a copy of the form with the layer's
  :class:`~tmpatch.spec.Route` bound (:func:`_copy`), no wrapper at all.
"""
from __future__ import annotations

import functools
import inspect
import marshal
import sys
import types
import weakref
from typing import Any, Callable, Dict, List, Optional, Tuple

from tmpatch.engine import cache
from tmpatch.engine.references import PatchError, Place
from tmpatch.spec import INLINE, ROUTE, Route

Key = Tuple[str, str]
Replacement = Callable[..., Any]

#: the attribute of a replacement that holds its gate (``spec.gated``)
GATE = "_tmpatch_gate"


class Layer:
    """tmpatch's wrapper around one target and the places it was put in."""

    def __init__(self, key: Key, original: Any) -> None:
        self.key = key
        self.original = original
        self.wrapper: Any = None
        self.active = False
        self.replacement: Any = None
        self.gate: Any = None  # the replacement's gate (GATE), if it has one
        self.route: Optional[Route] = None  # an inline layer's route (its wrapper is the inline form's copy)
        self.places: List[Place] = []
        self.residue = ""
        #: after a removal, the places the wrapper was in (checked by :meth:`Engine.lingering`)
        self.watch: List[Place] = []
        #: an inline layer's earlier copies (replaced by :func:`give`) still held somewhere, a mock's
        #: saved value say: they lead to ``wrapper``, and a removal puts the original back for them too
        self.retired: "weakref.WeakSet[Any]" = weakref.WeakSet()

    def __repr__(self) -> str:
        return f"Layer({self.key[0]}.{self.key[1]}, active={self.active})"

    def ours(self) -> List[Any]:
        """The wrapper and its earlier copies still alive."""
        return [self.wrapper, *self.retired]

    def give(self, replacement: Replacement) -> None:
        """Make ``replacement`` the one the wrapper calls, with its gate (``GATE``), if any."""
        self.replacement, self.gate = replacement, getattr(replacement, GATE, None)

    def turn(self, active: bool) -> None:
        self.active = active
        if self.route is not None:
            self.route.on = active


def _generic(layer: Layer, method: bool) -> Callable[..., Any]:
    """The wrapper for any callable: the caller's arguments passed on as given. Its closure's
    names are tmpatch's own: TorchScript resolves the original's names in it (:func:`_seated`)."""
    _tmpatch_layer, _tmpatch_original = layer, layer.original
    if method:
        def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            if _tmpatch_layer.active and (_tmpatch_layer.gate is None or _tmpatch_layer.gate.get() is not None):
                return _tmpatch_layer.replacement(_tmpatch_original, self, *args, **kwargs)
            return _tmpatch_original(self, *args, **kwargs)
        return wrapper

    def function(*args: Any, **kwargs: Any) -> Any:
        if _tmpatch_layer.active and (_tmpatch_layer.gate is None or _tmpatch_layer.gate.get() is not None):
            return _tmpatch_layer.replacement(_tmpatch_original, *args, **kwargs)
        return _tmpatch_original(*args, **kwargs)
    return function


def _one_line(code: types.CodeType) -> Dict[str, Any]:
    """``code.replace`` arguments that put every instruction on the code's first line, without
    columns (no carets under a line that is not the wrapper's own)."""
    units = len(code.co_code) // 2
    if sys.version_info >= (3, 11):  # location entries: "no column" (code 13), line delta 0, 1-8 units each
        return {"co_linetable": b"".join(bytes((0xE8 | (min(8, units - n) - 1), 0)) for n in range(0, units, 8))}
    if sys.version_info >= (3, 10):  # (bytecode delta, line delta) pairs
        size = len(code.co_code)
        return {"co_linetable": b"".join(bytes((min(254, size - n), 0)) for n in range(0, size, 254))}
    return {"co_lnotab": b""}  # no increments: every instruction on co_firstlineno


def _seated(wrapper: Any, original: Any) -> types.FunctionType:
    """``wrapper`` (made by :func:`_matching` or :func:`_generic`) where TorchScript looks for
    the original. ``torch.jit.script`` compiles the source that ``inspect.getsourcelines``
    finds through ``__wrapped__`` (the original's), but names the file
    ``inspect.getsourcefile(wrapper)`` gives (the wrapper's ``co_filename``, not unwrapped) and
    resolves the source's names in the wrapper's globals and closure: so the wrapper runs in
    the original's globals and its code carries the original's file and first line, every
    instruction on that line: a traceback through it shows tmpatch's frame (``wrapper``,
    ``function``) on the target's first line (its ``def``, or its first decorator), no columns,
    no line of the target's body that is not running. Its code reads no global."""
    code, namespace = getattr(original, "__code__", None), getattr(original, "__globals__", None)
    if type(code) is not types.CodeType or type(namespace) is not dict:
        return wrapper
    own = wrapper.__code__
    seated = types.FunctionType(
        own.replace(co_filename=code.co_filename, co_firstlineno=code.co_firstlineno, **_one_line(own)),
        namespace, wrapper.__name__, wrapper.__defaults__, wrapper.__closure__)
    seated.__kwdefaults__ = wrapper.__kwdefaults__
    seated.__dict__.update(wrapper.__dict__)
    return seated


#: the wrapper of a plain Python function, with the function's own parameters (:func:`_matching`)
_MATCHING = """
def _tmpatch_make(_tmpatch_layer, _tmpatch_original):
    def wrapper({params}):
        if _tmpatch_layer.active and (_tmpatch_layer.gate is None or _tmpatch_layer.gate.get() is not None):
            return _tmpatch_layer.replacement(_tmpatch_original, {args})
        return _tmpatch_original({args})
    return wrapper
"""


#: the default values a matching wrapper copies (immutable, never a layer's place)
_CONSTANTS = frozenset({type(None), bool, int, float, str})


def _matching(layer: Layer) -> Optional[Callable[..., Any]]:
    """For a plain Python function (no ``*args`` or ``**kwargs``), a wrapper with its parameters
    and its very default objects, which passes them on by position (keyword-only ones by name):
    a call with a fixed argument list, which CPython runs in the same interpreter frame loop,
    where ``f(*args, **kwargs)`` costs a C call and the tuple and dict (about a microsecond in
    place, per layer). The replacement is given the target's arguments so, the defaults spelt
    out: it must take them (:meth:`Engine.install` checks). None for anything else."""
    original = layer.original
    if not isinstance(original, types.FunctionType):
        return None
    code = original.__code__
    if code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS):
        return None
    positional = code.co_varnames[:code.co_argcount]
    keyword = code.co_varnames[code.co_argcount:code.co_argcount + code.co_kwonlyargcount]
    defaults = list(original.__defaults__ or ()) + list((original.__kwdefaults__ or {}).values())
    if any(name.startswith("_tmpatch") for name in positional + keyword) or any(
            type(value) not in _CONSTANTS for value in defaults):
        return None  # a default another layer may rebind (a function) is left to the function itself
    params = list(positional)
    if code.co_posonlyargcount:
        params.insert(code.co_posonlyargcount, "/")
    if keyword:
        params += ["*"] + list(keyword)
    args = ", ".join(list(positional) + [f"{name}={name}" for name in keyword])
    namespace: Dict[str, Any] = {}
    exec(_compiled(_MATCHING.format(params=", ".join(params), args=args), f"<tmpatch wrapper of {layer.key[1]}>"),
         {}, namespace)  # noqa: S102 - tmpatch's own template
    wrapper = namespace["_tmpatch_make"](layer, original)
    wrapper._tmpatch_params = (positional, keyword)  # for _check_takes
    wrapper.__defaults__ = original.__defaults__
    wrapper.__kwdefaults__ = dict(original.__kwdefaults__) if original.__kwdefaults__ else None
    return wrapper


def _compiled(source: str, name: str) -> types.CodeType:
    """The code of a wrapper's source (:data:`_MATCHING` filled in), compiled once and kept in
    the disk cache (:mod:`tmpatch.engine.cache`: a compile per layer is a tenth of a millisecond)."""
    key = ("<tmpatch wrapper>", name, source)
    data = cache.get(cache.COMPILED, key)
    if data is not None:
        try:
            code = marshal.loads(data)
        except (EOFError, ValueError, TypeError):
            code = None
        if type(code) is types.CodeType:
            return code
    code = compile(source, name, "exec")
    cache.put(cache.COMPILED, key, marshal.dumps(code))
    return code


def _check_takes(layer: Layer, wrapper: Any, replacement: Replacement) -> None:
    """Raise :class:`PatchError` unless a matching wrapper can call ``replacement`` with the
    target's arguments (the defaults spelt out: every positional one by position)."""
    params = getattr(wrapper, "_tmpatch_params", None)
    if params is None:
        return
    positional, keyword = params
    try:
        inspect.signature(replacement).bind(layer.original, *positional, **{name: name for name in keyword})
    except (TypeError, ValueError) as exc:
        raise PatchError(f"{layer.key[0]}.{layer.key[1]}: the replacement does not take the target's "
                         f"arguments {positional + keyword}: {exc}") from None


def give(layer: Layer, replacement: Replacement) -> None:
    """``layer.give``, for a wrapping layer (a plain replacement) or an inline one (an
    inline form: another one is copied into the layer's places)."""
    inline = getattr(replacement, INLINE, None)
    if (layer.route is None) != (inline is None):
        kind = "an inline form" if inline is not None else "a plain replacement"
        raise PatchError(f"{layer.key[0]}.{layer.key[1]}: {kind} given to a layer of the other kind")
    _check_takes(layer, layer.wrapper, replacement)
    if inline is not None and inline is not getattr(layer.wrapper, INLINE, None) and not _refill(layer, inline):
        old, layer.wrapper = layer.wrapper, _copy(layer, inline)
        # where the old copy is still held, or put back (by a mock that held the place meanwhile),
        # it runs the layer's one installed copy: its route is off and leads there
        old.__kwdefaults__ = {**(old.__kwdefaults__ or {}), ROUTE: Route(layer.wrapper, False)}
        layer.retired.add(old)
        for place in layer.places:
            if place.get() is old:
                place.set(layer.wrapper)
    layer.give(replacement)


def _refill(layer: Layer, inline: Callable[..., Any]) -> bool:
    """Make the inline layer's installed copy run ``inline`` (a form rebuilt by a later apply,
    of the same code): its closure cells take the new values, so the layer keeps its one
    function object (what :meth:`Engine.install` promises of every layer). False where the
    code differs (the caller makes a new copy)."""
    copy = layer.wrapper
    cells, new = copy.__closure__ or (), inline.__closure__ or ()
    if copy.__code__ is not inline.__code__ or len(cells) != len(new):
        return False
    for cell, value in zip(cells, new):
        cell.cell_contents = value.cell_contents
    copy.__defaults__ = inline.__defaults__
    _bind(copy, layer, inline)
    return True


def _bind(copy: Any, layer: Layer, inline: Callable[..., Any]) -> None:
    """``inline``'s keyword defaults with the layer's route, and the mark of the form it runs."""
    copy.__kwdefaults__ = {**(inline.__kwdefaults__ or {}), ROUTE: layer.route}
    setattr(copy, INLINE, inline)


def wrap(layer: Layer, replacement: Replacement, method: bool) -> Any:
    """A plain Python function (no proxy object): ``torch.compile`` traces it like the
    release's own code. A ``wrapt.FunctionWrapper`` there is taken for the function it
    wraps (its ``__code__``), so compiled code ran the original, or failed on its
    ``__defaults__``; and a method's bound wrapper was a graph break."""
    original = layer.original
    layer.give(replacement)
    inline = getattr(replacement, INLINE, None)
    if inline is not None:
        layer.route = Route(original)
        return _copy(layer, inline)
    wrapper = _seated(_matching(layer) or _generic(layer, method), original)
    _check_takes(layer, wrapper, replacement)
    functools.update_wrapper(wrapper, original)  # name, qualname, module, doc, __wrapped__
    wrapper._self_tmpatch_key = layer.key  # type: ignore[attr-defined]  # marks tmpatch's own layer
    return wrapper


def _copy(layer: Layer, inline: Callable[..., Any]) -> Any:
    """The function an inline layer installs: ``inline`` with the layer's route bound."""
    copy = types.FunctionType(inline.__code__, inline.__globals__, inline.__name__, inline.__defaults__,
                              inline.__closure__)
    functools.update_wrapper(copy, layer.original)
    _bind(copy, layer, inline)
    copy._self_tmpatch_key = layer.key  # type: ignore[attr-defined]  # marks tmpatch's own layer
    return copy
