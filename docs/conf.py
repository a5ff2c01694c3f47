"""Sphinx configuration of tmpatch's manual (``sphinx-build -W -n -b html docs OUT``).

No network access: no intersphinx. The patch catalogue is made from the code by
``docs/_ext/catalogue.py`` (with ``tools/patch_table.py``, which also writes the README's table).
"""
from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(HERE, "_ext"))

import tmpatch  # noqa: E402

project = "tmpatch"
author = "the tmpatch authors"
copyright = "the tmpatch authors, Apache License 2.0"
release = version = tmpatch.__version__

extensions = ["sphinx.ext.autodoc", "catalogue"]
exclude_patterns = ["_build"]
html_theme = "alabaster"
html_static_path: list = []
nitpicky = True
autodoc_typehints = "description"
autodoc_member_order = "bysource"
# types from outside tmpatch (no intersphinx: the build makes no network access) and names a
# docstring mentions without documenting them here
nitpick_ignore_regex = [
    ("py:class", r"(typing|collections\.abc|types|packaging|torch|torchmetrics|_pytest|pytest)\..*"),
    ("py:class", r"(Any|Callable|Iterable|Optional|Union|Sequence|Mapping|Dict|List|Tuple|Iterator)"),
    ("py:class", r"(str|int|float|bool|bytes|object|None|dict|list|tuple|set|frozenset|type)"),
    ("py:class", r"(NoneType|ellipsis)"),
    # the library's docstrings name its internals (tmpatch.<module>.<name>, or a name of the same
    # module): only the public API is documented here, and its references are checked
    ("py:.*", r"tmpatch\.[a-z_]+\..*"),
    ("py:.*", r"[A-Za-z_]+"),
]
