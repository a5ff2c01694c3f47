"""tmpatch.engine.rewrite: a function's own code with some statements edited, on toy modules."""
from __future__ import annotations

import contextlib
import functools
import importlib
import sys
import textwrap
import traceback
import types

import pytest

from tmpatch.engine.rewrite import RewriteError, replacement, rewrite
from tmpatch.spec import INLINE, Edit, Rewrite, Route

pytestmark = pytest.mark.once  # nothing here depends on the torchmetrics release

TOY = '''
from __future__ import annotations

import math

SCALE = 10


def target(x, y=2, *, z=3):
    """Scale, check, add."""
    x = x * SCALE   # scaled
    if x > 100:
        raise ValueError("too big")
    total = x + y + z
    return total


def nested(values):
    out = []
    for v in values:
        try:
            if v < 0:
                v = -v
            out.append(v)
        except TypeError:
            out.append(None)
        else:
            out.append(0)
        finally:
            out.append(1)
    return out


def twice(x):
    x = x + 1
    if x:
        x = x + 1
    return x


def annotated(x: NotDefinedAnywhere) -> AlsoUndefined:
    return x


def fails_late(x):
    x = x + 1
    y = x * 2
    raise KeyError(y)


class Thing:
    def method(self, x):
        if not x:
            x = math.pi
        return self, x


def outer():
    k = 5

    def inner(x):
        return x + k

    return inner


@functools.lru_cache(maxsize=None)
def decorated(x):
    return x
'''.replace("@functools", "import functools\n\n\n@functools")


@pytest.fixture
def toy(tmp_path, monkeypatch):
    path = tmp_path / "rewrite_toy.py"
    path.write_text(TOY)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("rewrite_toy")
    yield module
    sys.modules.pop("rewrite_toy", None)


def _line(module, text: str) -> int:
    """1-based line number of the first line of ``module``'s file containing ``text``."""
    with open(module.__file__) as handle:
        for number, line in enumerate(handle, 1):
            if text in line:
                return number
    raise AssertionError(text)


# -- matching ---------------------------------------------------------------------------
def test_statements_are_matched_on_their_syntax_not_their_text(toy):
    # other spacing, parentheses, no comment: the same tree
    new = rewrite(toy.target, [Edit("x = (x*SCALE)", "x = x * SCALE * 2")])
    assert toy.target(1) == 15 and new(1) == 25
    new = rewrite(toy.target, [Edit("if x > 100:\n    raise ValueError('too big')\n")])  # removed
    assert new(20) == 205
    with pytest.raises(ValueError, match="too big"):
        toy.target(20)


def test_several_consecutive_statements_and_every_kind_of_block(toy):
    new = rewrite(toy.target, [Edit("total = x + y + z\nreturn total", "return -1")])
    assert new(1) == -1
    for statement, expected in [
        ("v = -v", [-3, 0, 1]),  # inside if inside try inside for
        ("out.append(0)", [3, 1]),  # the try's else
        ("out.append(1)", [3, 0]),  # finally
    ]:
        new = rewrite(toy.nested, [Edit(statement, "pass")])
        assert new([-3]) == expected and toy.nested([-3]) == [3, 0, 1], statement
    new = rewrite(toy.nested, [Edit("out.append(None)", "out.append('caught')")])  # an except handler
    assert new(["a"]) == ["caught", 1] and toy.nested(["a"]) == [None, 1]


def test_a_statement_not_found_or_found_twice_is_an_error(toy):
    with pytest.raises(RewriteError, match=r"target: statement 'x = x \* 3' not found"):
        rewrite(toy.target, [Edit("x = x * 3", "")])
    with pytest.raises(RewriteError, match="found 2 times"):
        rewrite(toy.twice, [Edit("x = x + 1", "x = x + 2")])
    with pytest.raises(RewriteError, match="at least one statement"):
        rewrite(toy.target, [Edit("  \n", "")])
    # a statement must match whole: part of a block, or an expression inside one, is not a statement
    with pytest.raises(RewriteError, match="not found"):
        rewrite(toy.target, [Edit("x * SCALE", "")])
    assert toy.twice(0) == 2  # nothing changed


def test_an_emptied_block_gets_a_pass(toy):
    new = rewrite(toy.twice, [Edit("if x:\n    x = x + 1\n", "")])
    assert new(0) == 1
    new = rewrite(toy.Thing.method, [Edit("x = math.pi", "")])  # the if's only statement
    assert new(None, 0) == (None, 0)


def test_edits_apply_in_order_on_the_edited_tree(toy):
    new = rewrite(toy.target, [Edit("total = x + y + z", "total = 0"), Edit("total = 0", "total = 7")])
    assert new(1) == 7


# -- what is kept ------------------------------------------------------------------------
def test_defaults_names_docstring_and_globals_are_the_functions(toy):
    toy.target.custom = "kept"
    new = rewrite(toy.target, [Edit("total = x + y + z", "total = x - y - z")])
    route = new.__kwdefaults__.pop("_tmpatch_route")  # an inline form (spec.inline): on, called as it is
    assert route.on and route.original is toy.target
    assert new.__defaults__ == (2,) and new.__kwdefaults__ == {"z": 3}
    new.__kwdefaults__["_tmpatch_route"] = route
    assert new.__name__ == "target" and new.__qualname__ == "target" and new.__module__ == "rewrite_toy"
    assert new.__doc__ == "Scale, check, add." and new.custom == "kept"
    assert new.__wrapped__ is toy.target
    assert new.__globals__ is vars(toy)  # the module's namespace: later changes are seen
    assert new(1) == 5
    toy.SCALE = 1
    assert new(1) == -4
    method = rewrite(toy.Thing.method, [Edit("x = math.pi", "x = 'none'")])
    assert method.__qualname__ == "Thing.method"
    thing = toy.Thing()
    assert method(thing, 0) == (thing, "none")


def test_helpers_are_closure_variables_and_the_module_is_untouched(toy):
    before = dict(vars(toy))
    seen = []
    new = rewrite(toy.target, [Edit("total = x + y + z", "total = _tmpatch_probe(x, y, z)")],
                  {"_tmpatch_probe": lambda *a: seen.append(a) or sum(a)})
    assert new(1) == 15 and seen == [(10, 2, 3)]
    assert new.__code__.co_freevars == ("_tmpatch_probe",)
    assert "_tmpatch_probe" not in vars(toy) and dict(vars(toy)) == before
    with pytest.raises(RewriteError, match="already uses the name"):
        rewrite(toy.target, [Edit("total = x + y + z", "total = 0")], {"SCALE": 1})


def test_line_numbers_and_file_are_the_releases(toy):
    new = rewrite(toy.fails_late, [Edit("x = x + 1", "x = x + 2")])
    assert new.__code__.co_filename == toy.fails_late.__code__.co_filename
    assert new.__code__.co_firstlineno == toy.fails_late.__code__.co_firstlineno
    with pytest.raises(KeyError) as caught:
        new(1)
    frame = traceback.extract_tb(caught.value.__traceback__)[-1]
    assert frame.filename == toy.__file__ and frame.name == "fails_late"
    assert frame.lineno == _line(toy, "raise KeyError(y)") and frame.line == "raise KeyError(y)"
    # an error inside a replacement statement points at the line it replaced
    new = rewrite(toy.fails_late, [Edit("y = x * 2", "y = x * undefined_name")])
    with pytest.raises(NameError) as caught:
        new(1)
    assert traceback.extract_tb(caught.value.__traceback__)[-1].lineno == _line(toy, "y = x * 2")


def test_every_instruction_lies_on_a_line_of_the_function(toy):
    """The route's guard included (its name was once shifted twice: a line past the function)."""
    lines = range(toy.target.__code__.co_firstlineno, _line(toy, "return total") + 1)
    new = rewrite(toy.target, [Edit("total = x + y + z", "total = x - y")])
    positions = [p for p in new.__code__.co_positions() if p[0] is not None]
    assert positions and all(p[0] in lines and p[1] in lines for p in positions), positions


def test_release_statements_kept_inside_a_replacement_keep_their_own_lines(toy):
    """A replacement that keeps the release's statements (behind a test, say) runs each at its
    own line, not at the first replaced one's: a traceback or an audit names the right line."""
    keep = "if flag:\n    x = -1\nelse:\n    x = x + 1\n    y = x * 2\n"
    new = rewrite(toy.fails_late, [Edit("x = x + 1\ny = x * 2", keep)], {"flag": False})
    lines = {}

    def tracer(frame, event, arg):
        if frame.f_code is new.__code__ and event == "line":
            lines.setdefault(frame.f_lineno, len(lines))
        return tracer

    sys.settrace(tracer)
    try:
        with pytest.raises(KeyError):
            new(1)
    finally:
        sys.settrace(None)
    first = _line(toy, "def fails_late")
    expected = [first + 1, first + 2, first + 3]  # x = x + 1, y = x * 2, raise KeyError(y)
    assert [line for line in sorted(lines, key=lines.get) if line in expected] == expected


@pytest.mark.skipif(not hasattr(types.CodeType, "co_positions"), reason="column positions from Python 3.11")
def test_column_positions_match_the_source_in_methods(toy):
    """Python 3.11+ tracebacks underline the failing expression by its columns: in a
    method (indented source) they must be the file's columns, not the dedented ones."""
    original = toy.Thing.method.__code__
    new = rewrite(toy.Thing.method, [Edit("x = math.pi", "x = math.e")]).__code__
    positions = {(p[0], p[2]) for p in original.co_positions() if p[0] is not None and p[2] is not None}
    line = _line(toy, "return self, x")
    kept = {p for p in positions if p[0] == line}
    assert kept and kept <= {(p[0], p[2]) for p in new.co_positions() if p[0] is not None}


def test_future_flags_of_the_module_are_kept(toy):
    """The toy module has ``from __future__ import annotations``: annotations stay strings
    (compiled without the flag, the undefined names would be evaluated and fail)."""
    new = rewrite(toy.annotated, [Edit("return x", "return (x,)")])
    assert new.__annotations__ == {"x": "NotDefinedAnywhere", "return": "AlsoUndefined"}
    assert new(1) == (1,)


# -- what is refused ---------------------------------------------------------------------
def test_closures_decorated_functions_and_non_functions_are_refused(toy):
    with pytest.raises(RewriteError, match=r"closure \(k\)"):
        rewrite(toy.outer(), [Edit("return x + k", "return x")])
    with pytest.raises(RewriteError, match="not a Python function"):
        rewrite(toy.decorated, [Edit("return x", "return 0")])  # an lru_cache object
    with pytest.raises(RewriteError, match="decorated"):
        rewrite(toy.decorated.__wrapped__, [Edit("return x", "return 0")])
    with pytest.raises(RewriteError, match="not a Python function"):
        rewrite(len, [Edit("return x", "")])
    with pytest.raises(RewriteError, match="not a Python function"):
        rewrite(functools.partial(toy.target, 1), [Edit("return total", "")])
    square = eval("lambda x: x * x")  # noqa: S307 - no source file
    with pytest.raises(RewriteError, match="no source"):
        rewrite(square, [Edit("return x", "")])
    namespace = {}
    exec(textwrap.dedent("def made(x):\n    return x\n"), namespace)  # noqa: S102
    with pytest.raises(RewriteError, match="no source"):
        rewrite(namespace["made"], [Edit("return x", "")])


def test_an_edited_function_whose_route_is_off_calls_the_original_with_its_arguments_as_taken(tmp_path):
    """What a reference to an edited function kept across revert() does: the release's function,
    given every argument as the edited one took it (positional-only, *args, keyword-only, **kwargs)."""
    namespace = {}
    source = textwrap.dedent('''
        def shaped(a, /, b=1, *rest, c, d=4, **more):
            """Doc."""
            total = a + b + c + d
            return total, rest, more
    ''')
    path = tmp_path / "shaped.py"
    path.write_text(source)
    exec(compile(source, str(path), "exec"), namespace)  # noqa: S102 - a source on disk, for getsource
    shaped = namespace["shaped"]
    new = rewrite(shaped, [Edit("total = a + b + c + d", "total = 0")])
    assert new(1, 2, 3, c=4, e=5) == (0, (3,), {"e": 5}) and new.__doc__ == "Doc."
    calls = []

    def spy(*args, **kwargs):
        calls.append((args, kwargs))
        return shaped(*args, **kwargs)

    new.__kwdefaults__["_tmpatch_route"] = Route(spy)  # off: what revert() leaves
    assert new(1, 2, 3, c=4, e=5) == (11, (3,), {"e": 5})
    assert calls == [((1, 2, 3), {"c": 4, "d": 4, "e": 5})]


# -- replacement(): several rewrites joined, for the engine ---------------------------------
def test_replacement_joins_the_edits_of_several_rewrites(toy):
    first = Rewrite((Edit("x = x * SCALE", "x = _tmpatch_double(x)"),),
                    lambda module: {"_tmpatch_double": lambda v: 2 * v})
    second = Rewrite((Edit("total = x + y + z", "total = x"),))
    run = replacement(toy.target, toy, [first, second])
    assert run(toy.target, 3) == 6  # the engine passes the release's function first; it is not called
    assert run.edited.__wrapped__ is toy.target
    assert getattr(run, INLINE) is run.edited  # the engine installs the edited function itself
    with pytest.raises(RewriteError, match="start with _tmpatch_"):
        replacement(toy.target, toy, [Rewrite((Edit("return total", "return 0"),), lambda module: {"double": 1})])
    clash = Rewrite((Edit("return total", "return _tmpatch_double(total)"),),
                    lambda module: {"_tmpatch_double": lambda v: v})
    with pytest.raises(RewriteError, match="unique"):
        replacement(toy.target, toy, [first, clash])
    with pytest.raises(RewriteError, match="not found"):  # two rewrites editing the same statement
        replacement(toy.target, toy, [second, Rewrite((Edit("total = x + y + z", "total = 0"),))])


def _guarded(x):
    total = 0
    with contextlib.suppress(ZeroDivisionError):
        total = 10 // x
        total += 1
    return total


def test_a_compound_statement_with_an_ellipsis_body_matches_any_body_and_is_spliced():
    edit = Edit("with contextlib.suppress(ZeroDivisionError):\n    ...\n",
                "if _tmpatch_plain(x):\n    __tmpatch_body__\nelse:\n"
                "    with contextlib.suppress(ZeroDivisionError):\n        __tmpatch_body__\n")
    edited = rewrite(_guarded, [edit], {"_tmpatch_plain": lambda x: x != 0})
    assert [edited(x) for x in (1, 2, 0)] == [_guarded(x) for x in (1, 2, 0)] == [11, 6, 0]
    with pytest.raises(RewriteError, match="__tmpatch_body__"):
        rewrite(_guarded, [Edit("total = 0\n", "__tmpatch_body__\n")])
    with pytest.raises(RewriteError, match="not found"):
        rewrite(_guarded, [Edit("with contextlib.suppress(ValueError):\n    ...\n", "pass\n")])
