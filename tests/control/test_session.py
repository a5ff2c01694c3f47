"""tmpatch.control.session: the process state taken and put back as one."""
from __future__ import annotations

import pytest
import torchmetrics  # noqa: F401,E402  (apply() works on the imported release)

import tmpatch
from tests.conftest import run_python
from tmpatch.control import session


@pytest.fixture
def clean():
    before = session.snapshot()
    yield before
    session.restore(before)


def test_restore_puts_back_patches_policies_and_hooks():
    """In a fresh process (torch._dynamo not imported, so apply() arms its hook): revert()
    keeps that hook armed; restoring a state without it disarms it."""
    proc = run_python("""
        import sys, wrapt, torchmetrics, tmpatch
        from tmpatch.control import api, session
        from tmpatch.runtime import policies
        assert "torch._dynamo" not in sys.modules
        clean = session.snapshot()
        assert not clean.active() and not clean.armed
        tmpatch.apply(["nan_check"], nan_check="eager")
        assert "torch._dynamo" in api.armed() and policies.current["nan_check"] == "eager"
        session.restore(clean)
        assert not session.snapshot().active() and policies.current == clean.policies
        registry = getattr(wrapt.importer, "_post_import_hooks", {})
        hooks = [name for name, hooks in registry.items() for hook in (hooks or ())
                 if getattr(hook, "__module__", "").startswith("tmpatch")]
        print(api.armed(), hooks)
    """)
    assert proc.stdout.split("\n")[-2] == "[] []", proc.stdout


def test_restore_keeps_exclusions(clean):
    tmpatch.apply(["cumsum_device"])
    before = session.snapshot()
    assert before.excluded and set(before.excluded) == {name for name, state in before.rows.items()
                                                        if state == "excluded"}
    with_more = session.apply_exactly(["nan_check"])[1]
    session.restore(with_more)
    assert session.snapshot() == before


def test_apply_exactly_reverts_what_is_outside_the_selection(clean):
    tmpatch.apply(["nan_check", "safe_divide"])
    outer = session.snapshot()
    report, before = session.apply_exactly(["safe_divide"])
    assert before == outer
    assert report["nan_check"].state not in session.ACTIVE
    session.restore(before)
    assert session.snapshot().rows == outer.rows
