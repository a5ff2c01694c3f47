"""Fingerprints see code, not docstrings, comments, layout or line numbers."""
import textwrap

import pytest

from tests.conftest import fingerprints_under
from tmpatch.engine.fingerprint import FingerprintError, fingerprint, source_fingerprint

pytestmark = pytest.mark.once  # nothing here depends on the torchmetrics release

BASE = '''
def f(x, y=1):
    """Doc."""
    # a comment
    return x + y
'''


def fp(source: str) -> str:
    return source_fingerprint(textwrap.dedent(source))


def test_docstring_comments_blank_lines_and_indentation_do_not_count():
    other = '''
    def f(x, y=1):
        """Another docstring,
        on two lines."""

        return x + y  # trailing comment
    '''
    assert fp(BASE) == fp(other)


def test_code_changes_count():
    assert fp(BASE) != fp(BASE.replace("x + y", "x - y"))
    assert fp(BASE) != fp(BASE.replace("y=1", "y=2"))


def test_string_constants_in_code_count():
    a = 'def g():\n    warn("message one")\n'
    b = 'def g():\n    warn("message two")\n'
    assert fp(a) != fp(b)


def test_live_function_and_its_source_agree():
    def sample(a, b):
        """Docstring."""
        return a * b

    import inspect

    assert fingerprint(sample) == source_fingerprint(inspect.getsource(sample))


#: code whose layout the one pass over a function's lines (before Python 3.12) must see as the
#: dedented text's tokenization sees it: strings over several lines in methods (dedenting takes
#: the margin off them, and empties lines of blanks), decorators, nested blocks ending deep,
#: one-line definitions, comments at the body's column after it, a last line without a newline
TRICKY = '''
import functools


def deco(*args):
    return lambda f: f


class Holder:
    """A class."""

    def method(self, x):
        message = """first line
            indented more

        back at the margin"""
        if x:
            for i in range(3):
                if i:
                    return message + \\
                        "tail"
        # a comment at the body's column, after it

    @deco(1,
          2)
    def decorated(self):
        """Docstring
        on two lines."""
        return ("a"
                "b")

    def one(self): return 1

    @staticmethod
    def text():
        return f"""value {1 +
            2} and more
        """


def top(a, b=2, *, c=3):
    def inner():
        return a
    return inner() + b + c


def docstrings(x):
    (
        "a docstring"
        " in parentheses"
    )
    def f_string():
        f"not a docstring {x}"
    def raw_bytes():
        b"not a docstring"
    def two():
        "docstring"; return 2
    class Inner:
        u"docstring" \\
            "continued"
    def concatenated():
        "a" + "b"
    def listed():
        ["not a docstring"]
    return f_string, raw_bytes, two, Inner, concatenated, listed


def last(x):
    return x'''


def test_one_pass_and_the_dedented_text_agree_on_tricky_layout(tmp_path, monkeypatch):
    import importlib
    import inspect

    from tmpatch.engine import fingerprint as module

    (tmp_path / "tmpatch_tricky_layout.py").write_text(TRICKY)
    monkeypatch.syspath_prepend(str(tmp_path))
    tricky = importlib.import_module("tmpatch_tricky_layout")
    holder = tricky.Holder
    functions = [holder.method, holder.decorated, holder.one, holder.text, tricky.top, tricky.last, tricky.deco,
                 tricky.docstrings]
    for function in functions:
        text = inspect.getsource(function)
        read = module._read(function)
        assert read is not None and read[0] == text, function
        if module._ONE_PASS:  # before Python 3.12 only: from 3.12 f-strings come in parts (PEP 701)
            assert module._digest(module._block_tokens(*read)) == source_fingerprint(text), function
        assert fingerprint(function) == source_fingerprint(text), function


def test_no_source_is_a_clear_error():
    with pytest.raises(FingerprintError):
        fingerprint(len)



# --- the same fingerprint on every Python ---------------------------------------------------------
# From Python 3.12 the tokenizer splits an f-string into parts (PEP 701); seen on a GPU machine with
# Python 3.12, where 9 targets' fingerprints differed and their patches were left alone. The
# fingerprints are compared with those of every other Python found here (3.12 or newer; see
# tests/conftest.py); without one the test is skipped. tests/control/test_api.py does the same for every
# target of the catalogue on the release under test.

FSTRINGS = '''
def h(name, value, width=8):
    """Doc with an {f-string} look."""
    message = f"{name!r}: {value:>{width}.3f} ({'nested ' + f'{value}'})"
    other = f"""first {name}
    second {value!s:>10}"""
    plain = "a" f"b{name}" 'c'
    return message + other + plain + f"{{literal}}" + rf"\\d{name}"
'''


def test_fstrings_fingerprint_the_same_on_every_python(other_pythons):
    sources = [textwrap.dedent(FSTRINGS), BASE]
    here = [source_fingerprint(s) for s in sources]
    assert fp(FSTRINGS) != fp(FSTRINGS.replace("{value:>{width}.3f}", "{value:>{width}.2f}"))
    for python in other_pythons:
        assert fingerprints_under(python, sources) == here, python
