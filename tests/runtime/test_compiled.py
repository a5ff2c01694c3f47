"""tmpatch.runtime.compiled and the engine's layers under torch.compile (no torchmetrics involved)."""
from __future__ import annotations

import sys
import textwrap

import pytest
import torch

from tmpatch.engine.core import Engine
from tmpatch.runtime import compiled

#: nothing here depends on the torchmetrics release: the matrix runs it with each torch's first
pytestmark = pytest.mark.once

dynamo = pytest.importorskip("torch._dynamo")
from torch._dynamo.utils import counters  # noqa: E402


@pytest.fixture
def toy(tmp_path, monkeypatch):
    pkg = tmp_path / "toycompile"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "core.py").write_text(textwrap.dedent('''
        def target(x, scale=2):
            return x * scale

        def plain(x):
            return x * 3

        class Thing:
            def method(self, x, shift=1):
                return x + shift
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    for name in [n for n in sys.modules if n.split(".")[0] == "toycompile"]:
        del sys.modules[name]


def _compile(fn):
    compiled.reset_dynamo()
    counters.clear()
    return torch.compile(fn, backend="eager")


def test_compiled_code_calls_the_replacement_and_breaks_nowhere(toy):
    """A wrapt proxy was taken for the function it wraps (compiled code ran the original),
    or failed on its ``__defaults__``: the engine's layers are plain functions."""
    import toycompile.core as core

    engine = Engine()
    engine.install(("toycompile.core", "target"), lambda original, x, scale=2: original(x, scale) + 100,
                   method=False, scope="toycompile", sweep=True)
    engine.install(("toycompile.core", "Thing.method"),
                   lambda original, self, x, shift=1: original(self, x, shift) * 10,
                   method=True, scope="toycompile", sweep=True)
    engine.install(("toycompile.core", "plain"), lambda original, x: original(x) + 1000,
                   method=False, scope="toycompile", sweep=True)
    thing = core.Thing()
    plain = _compile(lambda x: core.plain(x))
    assert torch.equal(plain(torch.ones(1)), torch.full((1,), 1003.0))  # a proxy: 3.0, silently
    step = _compile(lambda x: core.target(x) + thing.method(x))
    x = torch.ones(3)
    assert torch.equal(step(x), core.target(x) + thing.method(x))
    assert torch.equal(step(x), torch.full((3,), 102.0 + 20.0))
    assert counters["graph_break"] == {}
    engine.remove(("toycompile.core", "target"), scope="toycompile")
    engine.remove(("toycompile.core", "Thing.method"), scope="toycompile")
    assert torch.equal(step(x), torch.full((3,), 2.0 + 2.0))  # passes through once reverted (guards recompile)


def test_compiling_is_true_only_while_tracing():
    compiled.prepare(lambda name, callback: None)
    seen = []

    def probe(x):
        return x + (1 if compiled.compiling() else 0)

    assert compiled.compiling() is False
    assert torch.equal(_compile(probe)(torch.zeros(1)), torch.ones(1))
    seen.append(compiled.compiling())
    assert seen == [False]


def test_outside_runs_eagerly_and_nothing_it_touches_is_guarded():
    compiled.prepare(lambda name, callback: None)

    class Box(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.count = 0

    def bump(box):
        box.count += 1

    outside = compiled.Outside(bump)
    box = Box()
    step = _compile(lambda x: (outside(box), x + 1)[1])
    with dynamo.config.patch(error_on_recompile=True):
        for _ in range(4):
            step(torch.zeros(1))
    assert box.count == 4
    assert any("bump" in reason for reason in counters["graph_break"])


def _helpers():
    """Two copies of one function (a tensor in its frame: dynamo compiles it as a frame of its own)."""
    def helper(x):
        return x + (2 if compiled.compiling() else 1)

    def twin(x):
        return x + (2 if compiled.compiling() else 1)

    return helper, twin


def test_an_inline_only_function_is_inlined_in_traced_code_and_no_frame_of_its_own_in_eager_code():
    """Called from eager code that a compiled step reaches (a frame dynamo does not compile),
    a function marked ``inline_only`` runs as plain Python: no graph, no guard; its unmarked twin
    is compiled there as a frame of its own. Traced code still inlines it (``fullgraph=True``)."""
    compiled.prepare(lambda name, callback: None)
    helper, twin = _helpers()
    compiled.inline_only(helper)
    for fn, traced in ((twin, True), (helper, False)):
        eager = dynamo.disable(lambda x, fn=fn: fn(x) * 1, recursive=False)  # its own frame eager, not its calls
        step = _compile(lambda x, eager=eager: eager(x))
        assert torch.equal(step(torch.zeros(1)), torch.full((1,), 2.0 if traced else 1.0))
        assert (counters["stats"]["unique_graphs"] > 0) is traced
    compiled.reset_dynamo()
    assert torch.equal(torch.compile(lambda x: helper(x) * 1, backend="eager", fullgraph=True)(torch.zeros(1)),
                       torch.full((1,), 2.0))


def test_compiling_before_dynamo_is_imported_reads_torchs_flag_and_follows_its_import():
    """Before ``torch._dynamo`` is imported, compiling() is torch.compiler's flag (an attribute read);
    once it is imported (after a partial revert too), torch's check again, and tracing sees True."""
    from tests.conftest import run_python

    run_python("""
        import sys, torch, tmpatch, torchmetrics
        from tmpatch.runtime import compiled
        from tmpatch.runtime.compiled import ContextSlot
        assert "torch._dynamo" not in sys.modules
        tmpatch.apply()
        tmpatch.revert(["bincount"])  # a partial revert keeps the hook that follows dynamo's import
        slot = ContextSlot("probe")
        slot.set(1)
        flags = getattr(torch, "compiler", None)
        if hasattr(flags, "_is_compiling_flag"):
            assert compiled._state.dynamo_absent and compiled.compiling() is False and slot.get() == 1
            flags._is_compiling_flag = True  # a non-strict torch.export: Python runs eagerly
            assert compiled.compiling() is True and slot.get() == 1  # the ContextVar still
            flags._is_compiling_flag = False
            assert slot.get == slot._var.get  # no Python frame
        import torch._dynamo
        assert not compiled._state.dynamo_absent and compiled.compiling() is False
        assert slot.get() == 1 and slot.get != slot._var.get
        seen = []
        def probe(x):
            seen.append(compiled.compiling())
            return x + 1
        torch.compile(probe, backend="eager")(torch.zeros(1))
        assert seen == [True], seen
    """)


@pytest.mark.parametrize("reset", ["torch._dynamo.reset", "reset_dynamo"])
def test_reset_dynamo_survives_a_backend_whose_reset_imports_a_module_that_caches_a_backend(reset):
    """A ``reduce-overhead`` backend's reset imports ``torch._inductor.cudagraph_trees`` the first time;
    where that import caches a backend, torch's own reset fails ("dictionary changed size during
    iteration": seen after the audit's graph-break run). Modelled in a fresh process by a backend whose
    reset does just that; :func:`compiled.reset_dynamo` imports the module before torch walks the dict."""
    from tests.conftest import run_python

    proc = run_python(f"""
        import sys, torch, torch._dynamo
        from torch._dynamo import eval_frame
        from tmpatch.runtime.compiled import reset_dynamo
        name = "torch._inductor.cudagraph_trees"
        assert name not in sys.modules

        class Backend:
            def reset(self):
                fresh = name not in sys.modules
                __import__(name)
                if fresh:  # what the import did in the failing run
                    eval_frame.cached_backends.setdefault(id(object()), object())

        eval_frame.cached_backends[id(Backend)] = Backend()
        try:
            {reset}()
            print("ok")
        except RuntimeError as exc:
            print(exc)
    """)
    expected = "ok" if reset == "reset_dynamo" else "dictionary changed size during iteration"
    assert proc.stdout.strip().splitlines()[-1] == expected, proc.stdout + proc.stderr
