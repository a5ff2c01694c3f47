"""Fingerprints see code, not docstrings, comments, layout or line numbers."""
import textwrap

import pytest

from tmpatch.fingerprint import FingerprintError, fingerprint, source_fingerprint

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


def test_no_source_is_a_clear_error():
    with pytest.raises(FingerprintError):
        fingerprint(len)
