"""Edits of a function's own code: the release's function with a few statements changed.

Where a defect sits inside a function (an ``if`` on a device value in the middle of a
formatter), wrapping the function cannot remove it and a copy of its body would put
code tmpatch has not fingerprinted in the release's place. :func:`rewrite` takes the
function's source as installed, replaces the statements an :class:`Edit` names
(matched on their syntax tree, so formatting and comments do not matter; each must be
found exactly once; a compound statement whose body is ``...`` matches any body, which
the replacement places where it has a ``__tmpatch_body__`` statement, as often as it
likes) and compiles the result in the function's own module namespace,
with its defaults, name and line numbers (tracebacks point at the release's file). The
rest of the function is the release's code, unchanged, but for one guard in front: the
edited function is an inline form (``spec.inline``) that the engine installs itself, and
once its patch is reverted it calls the release's function (:func:`_route`). Knows
nothing of torchmetrics.
"""
from __future__ import annotations
import __future__

import ast
import collections
import copy
import inspect
import marshal
import textwrap
import types
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, cast

from tmpatch.engine import cache, fingerprint
from tmpatch.spec import ROUTE, Route, inline

_FUTURE_FLAGS = 0
for _feature in __future__.all_feature_names:
    _FUTURE_FLAGS |= getattr(__future__, _feature).compiler_flag


#: ``id(code)`` of a release function, the edits' texts and the helpers' names -> that code
#: object (held, so the id stays its own) and the compiled factory: an apply after a revert
#: compiles nothing again
_COMPILED: Dict[Tuple[int, Tuple[Tuple[str, str], ...], Tuple[str, ...]],
                Tuple[types.CodeType, types.CodeType]] = {}


class RewriteError(ValueError):
    """The function cannot be rewritten as asked (a statement not found, or found twice)."""


def _statements(source: str) -> List[ast.stmt]:
    return ast.parse(textwrap.dedent(source)).body


#: an edit's ``find`` text -> its statements, parsed once (never changed: matches copy them)
_PATTERNS: Dict[str, List[ast.stmt]] = {}


def _pattern(source: str) -> List[ast.stmt]:
    found = _PATTERNS.get(source)
    if found is None:
        found = _PATTERNS[source] = _statements(source)
    return found


def _same(a: Any, b: Any, skip: str = "") -> bool:
    """Whether two nodes are the same code, line numbers aside (what their ``ast.dump`` without
    attributes tells, compared as the walk goes: a difference ends it). ``skip``: a field of the
    two nodes themselves left out."""
    if type(a) is not type(b):
        return False
    if isinstance(a, ast.AST):
        return all(_same(getattr(a, name, None), getattr(b, name, None)) for name in a._fields if name != skip)
    if isinstance(a, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b  # a constant, an identifier, None


#: in an edit's replacement, the statement that stands for the body a ``...`` body matched
BODY = "__tmpatch_body__"


def _any_body(pattern: ast.AST) -> bool:
    """A compound statement of ``find`` whose body is ``...``: it matches any body."""
    body = getattr(pattern, "body", None)
    return (isinstance(body, list) and len(body) == 1 and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant) and body[0].value.value is Ellipsis)


def _matches(node: ast.AST, pattern: ast.AST) -> bool:
    if not _any_body(pattern):
        return _same(node, pattern)
    return _same(node, pattern, skip="body")


def _splice(statements: List[ast.stmt], body: Optional[List[ast.stmt]]) -> None:
    """Replace every ``__tmpatch_body__`` statement in ``statements`` (at any depth) by a copy of
    ``body`` (the release's statements, with their own line numbers)."""
    holders: List[Any] = [statements]
    for statement in statements:
        holders.extend(getattr(owner, name) for owner, name in _blocks(statement))
    for block in holders:
        for i in reversed(range(len(block))):
            node = block[i]
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Name) and node.value.id == BODY:
                if body is None:
                    raise RewriteError(f"{BODY} in a replacement whose find has no `...` body")
                block[i:i + 1] = copy.deepcopy(body)


#: the fields of a node that hold statements, or nodes that hold them (``except`` handlers, ``case`` clauses)
_NESTED = (ast.stmt, ast.excepthandler) + ((ast.match_case,) if hasattr(ast, "match_case") else ())


def _blocks(node: ast.AST) -> List[Tuple[ast.AST, str]]:
    """Every statement list in ``node``: ``(owner, field)`` (``except`` handlers and ``case``
    clauses are nodes of the walk themselves). Only statements and the nodes that hold them
    are walked (no expression holds a statement), breadth first as ``ast.walk``."""
    found = []
    queue = collections.deque([node])
    while queue:
        owner = queue.popleft()
        for name in ("body", "orelse", "finalbody"):
            value = getattr(owner, name, None)
            if isinstance(value, list) and value and isinstance(value[0], ast.stmt):
                found.append((owner, name))
        for name in owner._fields:
            value = getattr(owner, name, None)
            if isinstance(value, list):
                queue.extend(child for child in value if isinstance(child, _NESTED))
    return found


def _keep_lines(statements: List[ast.stmt], release: List[ast.stmt]) -> None:
    """Every statement of a replacement (at any depth) that is one of the ``release``
    statements it replaces, unchanged, becomes that statement itself, with its own lines:
    a traceback or an audit points at the release's line of it, not at the first one's."""
    holders: List[Any] = [statements]
    for statement in statements:
        holders.extend(getattr(owner, name) for owner, name in _blocks(statement))
    placed = set()  # the release's statements put in already: a second place gets a copy
    for block in holders:
        for i, node in enumerate(block):
            same = next((kept for kept in release if _same(node, kept)), None)
            if same is not None:
                block[i] = copy.deepcopy(same) if id(same) in placed else same  # it leaves its own block
                placed.add(id(same))


def _apply(function: ast.FunctionDef, edit: Any) -> None:
    wanted = _pattern(edit.find)
    if not wanted:
        raise RewriteError("an edit must name at least one statement")
    spots = []
    for owner, name in _blocks(function):
        block = getattr(owner, name)
        for start in range(len(block) - len(wanted) + 1):
            if all(_matches(block[start + i], wanted[i]) for i in range(len(wanted))):
                spots.append((block, start))
    if len(spots) != 1:
        where = "not found" if not spots else f"found {len(spots)} times"
        raise RewriteError(f"{function.name}: statement {edit.find.strip().splitlines()[0]!r} {where}")
    block, start = spots[0]
    first = block[start]
    matched = [block[start + i] for i in range(len(wanted)) if _any_body(wanted[i])]
    new = _statements(edit.replace) if edit.replace.strip() else []
    for statement in new:
        ast.copy_location(statement, first)
        for child in ast.walk(statement):
            if hasattr(child, "lineno"):
                ast.copy_location(child, first)
    _keep_lines(new, block[start:start + len(wanted)])
    _splice(new, matched[0].body if len(matched) == 1 else None)
    block[start:start + len(wanted)] = new
    if not block:
        block.append(ast.copy_location(ast.Pass(), first))


#: generators and coroutines: a ``return`` in front of their body would not pass the call on
_NOT_PLAIN = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR | inspect.CO_ITERABLE_COROUTINE


def _route(function: ast.FunctionDef) -> None:
    """Make ``function`` an inline form (``spec.inline``): a keyword-only ``_tmpatch_route``
    and, before its first statement (after its docstring), ``if not _tmpatch_route.on:
    return _tmpatch_route.original(...)`` with every parameter passed on as it was taken."""
    arguments = function.args
    names = [a.arg for a in arguments.posonlyargs + arguments.args + arguments.kwonlyargs]
    names += [a.arg for a in (arguments.vararg, arguments.kwarg) if a is not None]
    if ROUTE in names:
        raise RewriteError(f"{function.name} already has a parameter {ROUTE}")
    arguments.kwonlyargs.append(ast.copy_location(ast.arg(arg=ROUTE), function))
    arguments.kw_defaults.append(None)  # the default is set on the function (a Route, always on)
    call: List[ast.expr] = [ast.Name(a.arg, ast.Load()) for a in arguments.posonlyargs + arguments.args]
    if arguments.vararg is not None:
        call.append(ast.Starred(ast.Name(arguments.vararg.arg, ast.Load()), ast.Load()))
    keywords = [ast.keyword(a.arg, ast.Name(a.arg, ast.Load())) for a in arguments.kwonlyargs[:-1]]
    if arguments.kwarg is not None:
        keywords.append(ast.keyword(None, ast.Name(arguments.kwarg.arg, ast.Load())))
    route = ast.Name(ROUTE, ast.Load())
    guard = ast.If(
        test=ast.UnaryOp(ast.Not(), ast.Attribute(route, "on", ast.Load())),
        body=[ast.Return(ast.Call(ast.Attribute(route, "original", ast.Load()), call, keywords))],
        orelse=[],
    )
    body = function.body
    first = 1 if (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                  and isinstance(body[0].value.value, str) and len(body) > 1) else 0
    anchor = body[first]
    for node in ast.walk(guard):
        ast.copy_location(node, anchor)
    body.insert(first, guard)


def _nodes(tree: ast.AST) -> List[ast.AST]:
    """Every node of ``tree`` (those of ``ast.walk``, in another order)."""
    found: List[ast.AST] = []
    stack = [tree]
    node_type = ast.AST
    while stack:
        node = stack.pop()
        found.append(node)
        for name in node._fields:
            value = getattr(node, name, None)
            if isinstance(value, node_type):
                stack.append(value)
            elif isinstance(value, list):
                stack.extend(item for item in value if isinstance(item, node_type))
    return found


def _compile(func: types.FunctionType, edits: Sequence[Any], helpers: Tuple[str, ...]) -> types.CodeType:
    """The module code that defines ``__tmpatch_rewrite__(*helpers)``, a factory returning the
    edited function."""
    code = func.__code__
    try:
        raw = fingerprint.source(func)  # inspect.getsource, read once for the fingerprint and the edit
    except (OSError, TypeError) as exc:
        raise RewriteError(f"no source for {func.__qualname__}: {exc}") from None
    source = textwrap.dedent(raw)
    tree = ast.parse("\n" * (code.co_firstlineno - 1) + source)  # the file's lines, as they are
    indent = len(raw) - len(raw.lstrip()) - (len(source) - len(source.lstrip()))
    if indent:  # a method: the file's columns (tracebacks underline by them), not the dedented ones
        for node in _nodes(tree):
            if getattr(node, "col_offset", None) is not None:
                node.col_offset += indent  # type: ignore[attr-defined]  # ast.AST declares no positions: checked above
            if getattr(node, "end_col_offset", None) is not None:
                node.end_col_offset += indent  # type: ignore[attr-defined]  # ast.AST declares no positions: checked above
    function = tree.body[0] if tree.body else None
    if not isinstance(function, ast.FunctionDef) or function.name != func.__name__:
        raise RewriteError(f"the source of {func.__qualname__} is not one plain function")
    if function.decorator_list:
        raise RewriteError(f"{func.__qualname__} is decorated")
    for edit in edits:
        _apply(function, edit)
    if not code.co_flags & _NOT_PLAIN:
        _route(function)
    # a factory whose parameters are the helpers: the edited function closes over them
    module = ast.parse(f"def __tmpatch_rewrite__({', '.join(helpers)}):\n    return {function.name}\n")
    factory = cast(ast.FunctionDef, module.body[0])  # the def parsed just above
    factory.body.insert(0, function)
    outside: List[ast.AST] = [module]  # the factory's own nodes take the function's place: not the function's
    while outside:
        node = outside.pop()
        if hasattr(node, "lineno"):
            ast.copy_location(node, function)
        outside.extend(child for child in ast.iter_child_nodes(node) if child is not function)
    flags = code.co_flags & _FUTURE_FLAGS  # e.g. ``from __future__ import annotations`` of the release's module
    return compile(module, code.co_filename, "exec", flags=flags, dont_inherit=True)


def _stored(func: types.FunctionType, edits: Sequence[Any], helpers: Tuple[str, ...]) -> types.CodeType:
    """:func:`_compile`, through the disk cache (:mod:`tmpatch.engine.cache`): keyed by the source
    file's content and everything else the compiled code depends on."""
    code = func.__code__
    source = cache.source_key(func)
    key = None
    if source is not None:
        key = source + (func.__name__, code.co_flags & _FUTURE_FLAGS,
                        tuple((edit.find, edit.replace) for edit in edits), helpers)
        data = cache.get(cache.COMPILED, key)
        if data is not None:
            try:
                stored = marshal.loads(data)
            except (EOFError, ValueError, TypeError):
                stored = None
            if type(stored) is types.CodeType:
                return stored
    compiled = _compile(func, edits, helpers)
    if key is not None and cache.read_as_inspect(source[0], source[1]):  # type: ignore[index]  # a key only with a source
        cache.put(cache.COMPILED, key, marshal.dumps(compiled))
    return compiled


def rewrite(func: Callable[..., Any], edits: Sequence[Any], names: Optional[Mapping[str, Any]] = None
            ) -> types.FunctionType:
    """``func`` with ``edits`` applied: a new function of the same module, defaults and name,
    and (but for a generator) an inline form (``spec.inline``): a keyword-only
    ``_tmpatch_route``, by default a route that is on, which the engine replaces by its layer's.

    ``edits``: objects with ``find`` and ``replace`` source texts (:class:`tmpatch.spec.Edit`).
    ``names``: objects the replacement statements use (bound as closure variables, so the
    module's namespace is not touched). Raises :class:`RewriteError` when an edit does not
    match exactly once, and for functions it cannot rebuild faithfully (closures, decorators).
    """
    if not isinstance(func, types.FunctionType):
        raise RewriteError(f"{func!r} is not a Python function")
    code = func.__code__
    if code.co_freevars:
        raise RewriteError(f"{func.__qualname__} is a closure ({', '.join(code.co_freevars)})")
    helpers = dict(names or {})
    clash = set(helpers) & (set(code.co_varnames) | set(code.co_names))
    if clash:
        raise RewriteError(f"{func.__qualname__} already uses the name(s) {', '.join(sorted(clash))}")
    key = (id(code), tuple((edit.find, edit.replace) for edit in edits), tuple(helpers))
    cached = _COMPILED.get(key)
    if cached is not None and cached[0] is code:
        compiled = cached[1]
    else:
        compiled = _stored(func, edits, tuple(helpers))
        _COMPILED[key] = (code, compiled)
    namespace: Dict[str, Any] = {}
    exec(compiled, func.__globals__, namespace)  # noqa: S102 - the release's own code, edited
    new = namespace["__tmpatch_rewrite__"](*helpers.values())
    new.__defaults__ = func.__defaults__
    if ROUTE in new.__code__.co_varnames[new.__code__.co_argcount:][:new.__code__.co_kwonlyargcount]:
        new.__kwdefaults__ = {**(func.__kwdefaults__ or {}), ROUTE: Route(func, True)}  # called as it is: on
    else:
        new.__kwdefaults__ = func.__kwdefaults__
    new.__qualname__ = func.__qualname__
    new.__module__ = func.__module__
    new.__doc__ = func.__doc__
    new.__dict__.update(func.__dict__)
    new.__wrapped__ = func
    return new


def replacement(original: Callable[..., Any], module: Any, rewrites: Sequence[Any]) -> Callable[..., Any]:
    """A replacement for the engine (``spec.inline``: installed itself) that runs ``original``
    with the edits of every one of ``rewrites`` (:class:`tmpatch.spec.Rewrite`) applied
    together; the helpers each rewrite's ``names(module)`` gives are bound as closure
    variables (names starting with ``_tmpatch_``, unique across the rewrites)."""
    edits: List[Any] = []
    names: Dict[str, Any] = {}
    for item in rewrites:
        edits.extend(item.edits)
        given = dict(item.names(module)) if item.names is not None else {}
        odd = [n for n in given if not n.startswith("_tmpatch_")]
        clash = set(given) & set(names)
        if odd or clash:
            raise RewriteError(f"helper names must start with _tmpatch_ and be unique: {sorted(set(odd) | clash)}")
        names.update(given)
    edited = rewrite(original, edits, names)
    if ROUTE in (edited.__kwdefaults__ or {}):
        made = inline(edited)  # the engine installs the edited function itself: no wrapper's frame
    else:  # a generator: called through the replacement
        def made(release: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            return edited(*args, **kwargs)
    made.edited = edited  # type: ignore[attr-defined]  # a mark on the function
    return made
