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
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

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
        if _ONE_PASS:
            read = _read(func)
            if read is not None:
                return _block_tokens(*read)
        text = source(func)
    except (OSError, TypeError) as exc:
        raise FingerprintError(f"no source for {func!r}: {exc}") from None
    return source_tokens(text)


#: before Python 3.12 the tokenizer is written in Python, and ``inspect.getsource`` tokenizes a
#: function's lines to find its end: :func:`_read` keeps those tokens for the fingerprint (a
#: third of the first ``apply()`` after an install), instead of tokenizing the text again
_ONE_PASS = sys.version_info < (3, 12)


def _read(func: Callable) -> Optional[Tuple[str, List[tokenize.TokenInfo]]]:
    """``inspect.getsource(func)`` (as ``inspect.getsourcelines`` finds it: the lines ``getblock``
    takes from the function's first line on) and the tokens of those lines; None where the
    tokenizer stopped on an error (the text is then tokenized again by :func:`source_tokens`).
    The text is remembered as :func:`source` remembers it."""
    code = getattr(func, "__code__", None)
    target = inspect.unwrap(func)
    lines, start = inspect.findsource(target)
    rest = lines[start:]
    finder = inspect.BlockFinder()
    seen: List[tokenize.TokenInfo] = []
    try:
        for token in tokenize.generate_tokens(iter(rest).__next__):
            seen.append(token)
            finder.tokeneater(*token)
    except inspect.EndOfBlock:
        pass
    except (IndentationError, tokenize.TokenError):
        return None  # inspect returns the lines up to there: tokenized as text, as ever
    text = "".join(rest[:finder.last])
    if type(code) is types.CodeType:
        _sources[id(code)] = (code, linecache.cache.get(code.co_filename), text)
    return text, [token for token in seen if token.start[0] <= finder.last]


def _block_tokens(text: str, raw: List[tokenize.TokenInfo]) -> List[str]:
    """:func:`source_tokens` of ``text`` from the tokens of its own lines, as they stand in the
    file (``raw``): the tokens of the dedented text are these, but for a first INDENT the
    dedented text lacks, the DEDENTs that close it at its end, and the text of a string that
    spans lines (dedenting takes the margin off its lines too)."""
    source = textwrap.dedent(text)
    skip_lines = _docstring_rows(raw)
    lines = source.splitlines(keepends=True)
    file_lines = text.splitlines(keepends=True)
    if raw and raw[0].type == tokenize.INDENT and lines and lines[0][:1] not in (" ", "\t"):
        raw = raw[1:]  # the file's first line is indented; the dedented one is not
    out: List[str] = []
    opened = 0
    for token in raw:
        kind = token.type
        if kind == tokenize.INDENT:
            opened += 1
        elif kind == tokenize.DEDENT:
            opened -= 1
        if kind in _SKIPPED or token.start[0] in skip_lines:
            continue
        (row, column), (end_row, end_column) = token.start, token.end
        if kind == tokenize.STRING and row != end_row:  # its text as dedenting leaves it
            cut = len(file_lines[row - 1]) - len(lines[row - 1])
            end_cut = len(file_lines[end_row - 1]) - len(lines[end_row - 1])
            out.append(_text(lines, (row, column - cut), (end_row, end_column - end_cut)))
        else:
            out.append(_MARKERS.get(kind, token.string))
    return out + ["<out>"] * opened  # the DEDENTs the end of the dedented text gives


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


#: string prefixes whose literal is not a ``str`` constant (bytes, f-strings): never a docstring
_NOT_TEXT = frozenset("bBfF")
_OPENERS, _CLOSERS = frozenset("([{"), frozenset(")]}")


def _docstring_rows(tokens: List[tokenize.TokenInfo]) -> Set[int]:
    """:func:`_docstring_lines` from a block's tokens (Python before 3.12, whose f-strings are one
    STRING token): the rows of the first statement of every ``def`` and ``class`` body that is
    nothing but string literals (concatenated, parenthesised), none of them bytes or f-strings:
    what the syntax tree calls a docstring, ``Expr(Constant(str))``, from its first row to its last."""
    rows: Set[int] = set()
    count = len(tokens)
    index = 0
    while index < count:
        token = tokens[index]
        index += 1
        if token.type != tokenize.NAME or token.string not in ("def", "class"):
            continue
        depth = 0  # the header: up to its ':' outside brackets
        while index < count:
            string = tokens[index].string
            index += 1
            if tokens[index - 1].type == tokenize.OP:
                if string in _OPENERS:
                    depth += 1
                elif string in _CLOSERS:
                    depth -= 1
                elif string == ":" and depth == 0:
                    break
        at = index  # the body's first statement: its tokens up to a NEWLINE or ';' outside brackets
        while at < count and tokens[at].type in (tokenize.NEWLINE, tokenize.NL, tokenize.COMMENT, tokenize.INDENT):
            at += 1
        first = last = None
        depth, strings, plain = 0, 0, True
        while at < count:
            kind, string = tokens[at].type, tokens[at].string
            if kind == tokenize.NEWLINE or (kind == tokenize.OP and string == ";" and depth == 0):
                break
            if kind in (tokenize.NL, tokenize.COMMENT):
                at += 1
                continue
            if kind == tokenize.STRING:
                strings += 1
                if _NOT_TEXT.intersection(string[:string.index(string[-1])]):
                    plain = False
            elif kind == tokenize.OP and string == "(":
                depth += 1
            elif kind == tokenize.OP and string == ")" and depth:
                depth -= 1
            else:
                plain = False
            if first is None:
                first = tokens[at].start[0]
            last = tokens[at].end[0]
            at += 1
        if plain and strings and first is not None and last is not None:
            rows.update(range(first, last + 1))
    return rows


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
        obj: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
        sys.stdout.write(f"{fingerprint(obj)}  {spec}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
