"""tmpatch.control.session: the process state taken and put back as one."""
from __future__ import annotations

import pytest
import wrapt

import tmpatch
from tmpatch.control import api, session
from tmpatch.runtime import policies
from tmpatch.runtime.compiled import DYNAMO

import torchmetrics  # noqa: F401,E402  (apply() works on the imported release)


def _tmpatch_hooks():
    registry = getattr(wrapt.importer, "_post_import_hooks", {})
    return [name for name, hooks in registry.items() for hook in (hooks or ())
            if getattr(hook, "__module__", "").startswith("tmpatch")]


@pytest.fixture
def clean():
    before = session.snapshot()
    yield before
    session.restore(before)


def test_restore_puts_back_patches_policies_and_hooks(clean):
    assert not clean.active() and not clean.armed
    tmpatch.apply(["nan_check"], nan_check="eager")
    assert DYNAMO in api.armed() and policies.current["nan_check"] == "eager"
    session.restore(clean)
    assert not session.snapshot().active()
    assert policies.current == clean.policies
    # revert() keeps torch._dynamo's hook armed; restoring a state without it disarms it
    assert api.armed() == [] and _tmpatch_hooks() == []


def test_apply_exactly_reverts_what_is_outside_the_selection(clean):
    tmpatch.apply(["nan_check", "safe_divide"])
    outer = session.snapshot()
    report, before = session.apply_exactly(["safe_divide"])
    assert before == outer
    assert report["nan_check"].state not in session.ACTIVE
    session.restore(before)
    assert session.snapshot().rows == outer.rows
