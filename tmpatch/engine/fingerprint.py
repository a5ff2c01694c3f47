"""Fingerprints of Python functions: their code, without docstring or comments.

Two functions get the same fingerprint when their source has the same tokens
once the docstring, comments, blank lines and the indentation level of the
whole block are dropped. Line numbers and the Python version do not matter: from
Python 3.12 the tokenizer splits an f-string into parts (PEP 701), which are put
back together here into the one string token that earlier Pythons give.
"""
from __future__ import annotations

import ast
import hashlib
import importlib
import inspect
import io
import linecache
import sys
import textwrap
import tokenize
import types
from typing import Any, Callable, Dict, List, Set, Tuple

_SKIPPED = {tokenize.COMMENT, tokenize.NL, tokenize.ENCODING, tokenize.ENDMARKER}
_MARKERS = {tokenize.INDENT: "<in>", tokenize.DEDENT: "<out>", tokenize.NEWLINE: "<nl>"}
#: Python 3.12+ (f-strings) and 3.14+ (t-strings): the tokens that open and close a string in parts
_OPENS = {getattr(tokenize, name) for name in ("FSTRING_START", "TSTRING_START") if hasattr(tokenize, name)}
_CLOSES = {getattr(tokenize, name) for name in ("FSTRING_END", "TSTRING_END") if hasattr(tokenize, name)}


class FingerprintError(ValueError):
    """The object has no readable Python source."""


def _definitions(tree: ast.AST) -> List[ast.AST]:
    """Every statement in ``tree``, at any depth (the nodes of ``ast.walk`` that can be a ``def`` or
    a ``class``: only statements, and the handlers and cases that hold them, are walked)."""
    found: List[ast.AST] = []
    stack = [tree]
    while stack:
        node = stack.pop()
        found.append(node)
        for name in node._fields:
            value = getattr(node, name, None)
            if isinstance(value, list):
                stack.extend(child for child in value if isinstance(child, _NESTED))
    return found


#: what holds statements: statements, ``except`` handlers, ``case`` clauses
_NESTED = (ast.stmt, ast.excepthandler) + ((ast.match_case,) if hasattr(ast, "match_case") else ())


def _docstring_lines(source: str) -> Set[int]:
    tree = ast.parse(source)
    lines: Set[int] = set()
    for node in _definitions(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                end = first.end_lineno or first.lineno
                lines.update(range(first.lineno, end + 1))
    return lines


#: id(code) -> (the code, linecache's entry of its file then, ``inspect.getsource`` of its function)
_sources: Dict[int, Tuple[Any, Any, str]] = {}


def source(func: Callable) -> str:
    """``inspect.getsource(func)``, remembered per code object while ``linecache`` keeps the same
    entry for its file (the fingerprint and an edit of one function read it once); raises as
    ``inspect.getsource`` does."""
    code = getattr(func, "__code__", None)
    if type(code) is not types.CodeType:
        return inspect.getsource(func)
    known = _sources.get(id(code))
    if known is not None and known[0] is code and known[1] is not None and \
            linecache.cache.get(code.co_filename) is known[1]:
        return known[2]
    text = inspect.getsource(func)
    _sources[id(code)] = (code, linecache.cache.get(code.co_filename), text)
    return text


def tokens(func: Callable) -> List[str]:
    """The normalised token stream of ``func``'s source."""
    try:
        text = source(func)
    except (OSError, TypeError) as exc:
        raise FingerprintError(f"no source for {func!r}: {exc}") from None
    return source_tokens(text)


def source_tokens(source: str) -> List[str]:
    """The normalised token stream of one function's source text."""
    source = textwrap.dedent(source)
    skip_lines = _docstring_lines(source)
    lines = source.splitlines(keepends=True)
    out: List[str] = []
    depth, opened = 0, (0, 0)
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in _OPENS:
            depth += 1
            if depth == 1:
                opened = tok.start
            continue
        if depth:  # inside an f-string: its text is taken whole when it closes
            if tok.type in _CLOSES:
                depth -= 1
                if not depth and opened[0] not in skip_lines:
                    out.append(_text(lines, opened, tok.end))
            continue
        if tok.type in _SKIPPED or tok.start[0] in skip_lines:
            continue
        out.append(_MARKERS.get(tok.type, tok.string))
    return out


def _text(lines: List[str], start: Tuple[int, int], end: Tuple[int, int]) -> str:
    """The source between two token positions (1-based rows, 0-based columns)."""
    if start[0] == end[0]:
        return lines[start[0] - 1][start[1]:end[1]]
    return lines[start[0] - 1][start[1]:] + "".join(lines[start[0]:end[0] - 1]) + lines[end[0] - 1][:end[1]]


def _digest(parts: List[str]) -> str:
    return hashlib.sha256("\x1f".join(parts).encode("utf-8")).hexdigest()[:16]


_memo: Dict[int, Tuple[Callable, str]] = {}  # id(func) -> (func, fingerprint); func kept alive


def fingerprint(func: Callable) -> str:
    """A short stable hash of ``func``'s code (see the module docstring); remembered per
    function object, and on disk per source file's content (:mod:`tmpatch.engine.cache`), since
    reading and tokenizing its source is the costly part of apply()."""
    known = _memo.get(id(func))
    if known is not None and known[0] is func:
        return known[1]
    from tmpatch.engine import cache  # here: this module also runs alone (tests load it in other Pythons)

    key = cache.source_key(func)
    digest = cache.get(cache.FINGERPRINT, key) if key is not None else None
    if digest is None:
        digest = _digest(tokens(func))
        if key is not None and cache.read_as_inspect(key[0], key[1]):
            cache.put(cache.FINGERPRINT, key, digest)
    _memo[id(func)] = (func, digest)
    return digest


def held(func: Any) -> int:
    """How many references to ``func`` this module keeps (its fingerprint remembered: one)."""
    known = _memo.get(id(func))
    return 1 if known is not None and known[0] is func else 0


def source_fingerprint(source: str) -> str:
    """The fingerprint of one function's source text (as ``fingerprint``)."""
    return _digest(source_tokens(source))


def _main(argv: List[str]) -> int:
    """``python -m tmpatch.engine.fingerprint module:qualname``: print a fingerprint."""
    for spec in argv:
        module_name, _, qualname = spec.partition(":")
        obj = importlib.import_module(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        sys.stdout.write(f"{fingerprint(obj)}  {spec}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
