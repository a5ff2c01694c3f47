"""The rooms of tmpatch keep their contracts (setup.cfg, ``[importlinter]``): no room
imports a room above it, at any depth; patches never reach the engine, the control
layer or the public API; the engine knows nothing of torch or torchmetrics."""
from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.once  # the import graph does not depend on the torchmetrics release

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_import_contract_is_kept():
    from importlinter import cli  # import-linter: the test extra of setup.cfg
    # lint-imports reads the tree it is run in: the checkout under test, not an installed tmpatch
    here = os.getcwd()
    os.chdir(ROOT)
    try:
        code = cli.lint_imports(config_filename=os.path.join(ROOT, "setup.cfg"), no_cache=True, no_logo=True)
    finally:
        os.chdir(here)
    assert code == 0, "an import contract of setup.cfg is broken: run lint-imports for the details"
