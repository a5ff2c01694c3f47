"""A pytest plugin for tools/upstream_tests.py: one JSON line per test report and per failed
collection, written to ``--upstream-report FILE``; ``--upstream-only FILE`` keeps only the node
ids listed there (one a line), so a rerun runs exactly the tests it names; ``--upstream-sample N``
keeps every test function with a fixed 1/N of its parametrizations.

It is loaded into torchmetrics' own test runs with ``-p upstream_report`` (this folder on
PYTHONPATH); it changes no test and no outcome. Under pytest-xdist only the controller writes
(the workers' reports reach it). Kept free of anything but the standard library and pytest: it
runs in the release's venv, patched and unpatched alike.
"""
from __future__ import annotations

import json
import zlib
from typing import Any, Optional

import pytest


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("upstream_report")
    group.addoption("--upstream-report", metavar="FILE", default=None,
                    help="append one JSON line per test report and per failed collection to FILE")
    group.addoption("--upstream-only", metavar="FILE", default=None,
                    help="run only the node ids listed in FILE (one a line)")
    group.addoption("--upstream-sample", metavar="N", type=int, default=1,
                    help="run every test function, with a fixed 1/N of its parametrizations (by a hash of the id)")


def first_line(longrepr: Any) -> str:
    """The first line of a report's error: the crash message (``RuntimeError: ...``; with its next
    line where the first ends with a colon, as TorchScript's do) where the report has one, else the
    first ``E`` line of the text, else its last non-empty line."""
    if longrepr is None:
        return ""
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # a skip: (path, line, reason)
        return str(longrepr[2]).strip().splitlines()[0] if str(longrepr[2]).strip() else ""
    crash = getattr(longrepr, "reprcrash", None)
    message = getattr(crash, "message", None)
    if message and message.strip():
        lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
        if lines[0].endswith(":") and len(lines) > 1:  # "RuntimeError: " and the text on the next line
            return f"{lines[0]} {lines[1]}"
        return lines[0]
    text = str(longrepr)
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    marked = [line[1:].strip() for line in lines if line.startswith("E ")]
    if marked:
        return marked[0]
    return lines[-1].strip() if lines else ""


def _is_worker(config: Any) -> bool:
    return hasattr(config, "workerinput")


class Writer:
    def __init__(self, path: str) -> None:
        self.file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - closed at unconfigure

    def write(self, record: dict) -> None:
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


_writer: Optional[Writer] = None


def pytest_configure(config: Any) -> None:
    global _writer
    path = config.getoption("--upstream-report")
    if path and not _is_worker(config):
        _writer = Writer(path)


def pytest_unconfigure(config: Any) -> None:
    global _writer
    if _writer is not None:
        _writer.close()
        _writer = None


def sampled(nodeids: list, every: int) -> set:
    """The ids a sample of 1/``every`` keeps: those whose CRC-32 is a multiple of ``every``, and the
    first id of each test function (its id before ``[``) that has none of those, so every function runs.
    The same ids on every run and machine."""
    if every <= 1:
        return set(nodeids)
    kept = {nodeid for nodeid in nodeids if zlib.crc32(nodeid.encode()) % every == 0}
    functions = {nodeid.split("[")[0] for nodeid in kept}
    for nodeid in nodeids:
        function = nodeid.split("[")[0]
        if function not in functions:
            functions.add(function)
            kept.add(nodeid)
    return kept


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: Any, items: list) -> None:
    path = config.getoption("--upstream-only")
    every = config.getoption("--upstream-sample")
    if path:
        with open(path, encoding="utf-8") as handle:
            wanted = {line.rstrip("\n") for line in handle if line.strip()}
    elif every > 1:
        wanted = sampled([item.nodeid for item in items], every)
    else:
        return
    kept = [item for item in items if item.nodeid in wanted]
    dropped = [item for item in items if item.nodeid not in wanted]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
    items[:] = kept


def pytest_runtest_logreport(report: Any) -> None:
    if _writer is None:
        return
    _writer.write({
        "nodeid": report.nodeid,
        "when": report.when,
        "outcome": report.outcome,  # passed, failed, skipped; "rerun" from pytest-rerunfailures
        "xfail": bool(getattr(report, "wasxfail", None) is not None),
        "message": first_line(report.longrepr) if report.outcome != "passed" else "",
        "duration": round(float(getattr(report, "duration", 0.0)), 4),
    })


def pytest_collectreport(report: Any) -> None:
    if _writer is None or report.outcome != "failed":
        return
    _writer.write({"nodeid": report.nodeid, "when": "collect", "outcome": "failed", "xfail": False,
                   "message": first_line(report.longrepr), "duration": 0.0})
