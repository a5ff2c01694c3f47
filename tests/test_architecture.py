"""The rooms of tmpatch keep their contracts (setup.cfg, ``[importlinter]``): no room
imports a room above it, at any depth; patches never reach the engine, the control
layer or the public API; the engine knows nothing of torch or torchmetrics."""
from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.once  # the import graph does not depend on the torchmetrics release

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_every_import_contract_is_kept():
    pytest.importorskip("importlinter")  # import-linter: the test extra of setup.cfg
    # in its own process: lint-imports configures logging (every logger there is disabled), and
    # it reads the tree it is run in, the checkout under test, not an installed tmpatch
    script = ("import sys; from importlinter import cli; "
              "sys.exit(cli.lint_imports(config_filename='setup.cfg', no_cache=True, no_logo=True))")
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"an import contract of setup.cfg is broken:\n{done.stdout}{done.stderr}"


# -- imports inside functions (docs/design.rst, "Imports inside functions") ----------------------
#: why a function may import a module of tmpatch or of the standard library itself
START_UP = ("runs at interpreter start-up in every process with TMPATCH set: the bootstrap loads the "
            "environment's table only, the rest when torchmetrics is imported")
FOREIGN_PYTHON = "runs where tmpatch may be missing (another interpreter): the import is tried"
COMMAND_START = "tmpatch run and tmpatch --help start without the selection and the catalogue (about 25 ms)"
PYTEST_RUN = ("the pytest plugin loads in every pytest run: tmpatch's control layer comes when an option, "
              "marker or fixture asks for it")
AUDIT_FLOOR = "tmpatch audit checks torch's version before it imports the simulation (below: it says why)"
ALONE = "tmpatch/engine/fingerprint.py also runs as a file, without its package (tests, in other Pythons)"
METADATA = "importlib.metadata costs about 10 ms: read when a release's version is asked"
FREE_THREADED = "free-threaded builds exist from Python 3.13 on: sysconfig (about 2 ms) is asked there alone"
MULTIPROCESSING = ("multiprocessing.util costs about 40 ms where torch has not loaded it: imported when the first "
                   "metric gets a book of deferred reports (torch has loaded it then), for the exit hooks")

#: (module, function, module imported inside it) -> reason; torch, torchmetrics and other
#: third-party imports are not listed (the design's rule for them: tests/control/test_api.py
#: checks that apply() imports no torch)
LAZY_IMPORTS = {
    ("tmpatch", "__getattr__", "importlib"): START_UP,
    ("tmpatch", "__getattr__", "gc"): START_UP,
    ("tmpatch.bootstrap", "_spec_through_the_hooks", "importlib.util"): START_UP,
    ("tmpatch.bootstrap", "activate", "tmpatch.patches"): START_UP,
    ("tmpatch.bootstrap", "activate", "tmpatch.control.api"): START_UP,
    ("tmpatch.bootstrap", "_configure_logging", "logging"): START_UP,
    ("tmpatch.control.settings", "closest", "difflib"): START_UP,
    ("tmpatch.bootstrap.sitecustomize", "_apply", "tmpatch.bootstrap"): FOREIGN_PYTHON,
    ("tmpatch.engine.references", "_exact_counts", "sysconfig"): FREE_THREADED,
    ("tmpatch.cli", "_names", "tmpatch.control.selection"): COMMAND_START,
    ("tmpatch.cli", "_status", "tmpatch.control.selection"): COMMAND_START,
    ("tmpatch.cli", "_import_targets", "tmpatch.patches"): COMMAND_START,
    ("tmpatch.control.selection", "_catalogue", "tmpatch.patches"): COMMAND_START,
    ("tmpatch.pytest_plugin", "_apply", "tmpatch.control.session"): PYTEST_RUN,
    ("tmpatch.pytest_plugin", "_restore", "tmpatch.control.session"): PYTEST_RUN,
    ("tmpatch.pytest_plugin", "_option_names", "tmpatch.control.selection"): PYTEST_RUN,
    ("tmpatch.pytest_plugin", "_marker_options", "tmpatch.control.selection"): PYTEST_RUN,
    ("tmpatch.pytest_plugin", "_marker_options", "tmpatch.control.settings"): PYTEST_RUN,
    ("tmpatch.pytest_plugin", "_import_host", "tmpatch.patches"): PYTEST_RUN,
    ("tmpatch.pytest_plugin", "pytest_report_header", "tmpatch.control.report"): PYTEST_RUN,
    ("tmpatch.pytest_plugin", "no_sync", "tmpatch.audit.fixture"): PYTEST_RUN,
    ("tmpatch.audit.cli", "_run", "tmpatch.audit.step.cli"): AUDIT_FLOOR,
    ("tmpatch.audit.cli", "_run", "tmpatch.audit.panel.rows"): AUDIT_FLOOR,
    ("tmpatch.audit.cli", "_run", "tmpatch.audit.panel.run"): AUDIT_FLOOR,
    ("tmpatch.audit.cli", "_run", "tmpatch.audit.sweep.run"): AUDIT_FLOOR,
    ("tmpatch.audit.cli", "_run", "tmpatch.audit.panel.text"): AUDIT_FLOOR,
    ("tmpatch.audit.cli", "main", "tmpatch.audit.calibrate.cli"): AUDIT_FLOOR,
    ("tmpatch.audit.oracle.breaks", "graph_breaks", "tmpatch.audit.oracle.sim"): AUDIT_FLOOR,
    ("tmpatch.engine.fingerprint", "fingerprint", "tmpatch.engine.cache"): ALONE,
    ("tmpatch.patches", "release", "importlib.metadata"): METADATA,
    ("tmpatch.runtime.deferred.endings", "armed", "multiprocessing.util"): MULTIPROCESSING,
}


def _imports_inside_functions():
    """``(module, function, imported module)`` of every import statement inside a function
    of tmpatch (``from a import b`` counts as ``a.b`` where that is a module of tmpatch)."""
    found = []
    for module, base, tree in _modules():

        def visit(node, qualname, in_function, module=module, base=base):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    name = f"{qualname}.{child.name}" if qualname else child.name
                    visit(child, name, in_function or not isinstance(child, ast.ClassDef))
                    continue
                if in_function and isinstance(child, ast.Import):
                    found.extend((module, qualname, alias.name) for alias in child.names)
                elif in_function and isinstance(child, ast.ImportFrom):
                    source = _source(child, base)
                    for alias in child.names:
                        name = f"{source}.{alias.name}"
                        found.append((module, qualname, name if _is_module(name) else source))
                visit(child, qualname, in_function)

        visit(tree, "", False)
    return found


def _modules():
    """``(module, base, syntax tree)`` of every module of tmpatch; ``base``: the package a relative
    import starts from."""
    package = os.path.join(ROOT, "tmpatch")
    for folder, _, files in os.walk(package):
        for file in sorted(files):
            if not file.endswith(".py"):
                continue
            path = os.path.join(folder, file)
            parts = os.path.relpath(path, ROOT)[:-3].split(os.sep)
            here = parts[:-1] if parts[-1] == "__init__" else parts
            base = here if parts[-1] == "__init__" else here[:-1]
            with open(path, encoding="utf-8") as handle:
                yield ".".join(here), base, ast.parse(handle.read(), path)


def _source(node, base):
    """The module a ``from ... import`` statement imports from (a relative one from ``base``)."""
    source = node.module or ""
    if node.level:
        source = ".".join(base[:len(base) - node.level + 1] + ([source] if source else []))
    return source


def _is_module(name):
    path = os.path.join(ROOT, *name.split("."))
    return os.path.isfile(path + ".py") or os.path.isfile(os.path.join(path, "__init__.py"))


def test_imports_inside_functions_have_a_stated_reason():
    """An import of tmpatch or of the standard library inside a function is listed in
    :data:`LAZY_IMPORTS`, with its reason; every other one belongs at the top of its module."""
    if not hasattr(sys, "stdlib_module_names"):
        pytest.skip("sys.stdlib_module_names: Python 3.10 or later")
    checked = [(module, function, name) for module, function, name in _imports_inside_functions()
               if name.split(".")[0] == "tmpatch" or name.split(".")[0] in sys.stdlib_module_names]
    unexplained = sorted(set(checked) - set(LAZY_IMPORTS))
    assert not unexplained, ("imports inside functions with no reason listed in LAZY_IMPORTS (move them "
                             "to the top of their module, or list them with the reason):\n"
                             + "\n".join(f"  {m}.{f}: import {n}" for m, f, n in unexplained))
    stale = sorted(set(LAZY_IMPORTS) - set(checked))
    assert not stale, "LAZY_IMPORTS lists imports that are gone: " + ", ".join(map(str, stale))


def test_no_contract_has_an_exception():
    """Every room keeps its contract whole: no import is excused (``ignore_imports``)."""
    import configparser

    config = configparser.ConfigParser()
    config.read(os.path.join(ROOT, "setup.cfg"))
    excused = {name: config[name]["ignore_imports"] for name in config.sections()
               if name.startswith("importlinter") and "ignore_imports" in config[name]}
    assert not excused, excused




def _module_imports():
    """``{module: {modules of tmpatch it imports}}``, at any depth (top-level and inside functions);
    ``from a import b`` counts as ``a.b`` where that is a module of tmpatch, else as ``a``."""
    graph = {}
    for module, base, tree in _modules():
        found = graph.setdefault(module, set())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names if alias.name.split(".")[0] == "tmpatch")
            elif isinstance(node, ast.ImportFrom):
                source = _source(node, base)
                if source.split(".")[0] != "tmpatch":
                    continue
                for alias in node.names:
                    name = f"{source}.{alias.name}"
                    found.add(name if _is_module(name) else source)
    return graph


def _room(module):
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _cycles(graph):
    """The strongly connected sets of more than one module of ``graph`` (Tarjan's algorithm)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_room_holds_a_circle_between_its_own_modules():
    """Inside each room (a top-level module or sub-package of tmpatch), its modules import one
    another in one direction: no two modules reach each other through imports at any depth."""
    graph = _module_imports()
    inside = {module: {name for name in names if name != module and _room(name) == _room(module)}
              for module, names in graph.items()}
    circles = _cycles(inside)
    assert not circles, "modules of one room that import each other:\n" + "\n".join(
        "  " + " <-> ".join(circle) for circle in circles)


def test_the_circle_check_sees_a_circle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
