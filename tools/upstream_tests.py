"""Run a torchmetrics release's own unit tests with tmpatch applied, and list every test that
passes on the release and fails patched.

    python tools/upstream_tests.py --release 1.9.0                          # every domain
    python tools/upstream_tests.py --release 1.9.0 --domains bases,classification
    python tools/upstream_tests.py --release 1.9.0 --ci                     # what CI runs
    python tools/upstream_tests.py --release 1.4.0 --both                   # the figures of docs/results.rst

The tests are torchmetrics' ``tests/`` folder at the release's tag, from
``shared/upstream/torchmetrics-<release>-tests.tar.gz`` (found in a ``shared/upstream`` folder
beside the checkout or above it; ``--archives`` names another), unpacked outside the checkout and
run from there, unchanged, with their folder first on PYTHONPATH. They run in a venv of their
own, ``.venvs/upstream-<release>``, made once from this interpreter with its torch, the
release, and the reference packages of the domains asked for (``tools/upstream/<release>/``:
``common.txt`` and one file per domain, from the tag's ``requirements/*_test.txt``, what installs
from PyPI; a domain's packages are added when it is first asked for).

Each domain runs in two parts: the tests not marked ``DDP`` (with pytest-xdist, ``--jobs``
workers) and those marked ``DDP`` (torchmetrics' pool of 2 processes, ``USE_PYTEST_POOL=1``, one
pytest process; ``--no-ddp`` leaves them out). Each part runs patched first (``TMPATCH=1``, the
default policies). Only the tests that fail there run again unpatched; a test that passes
unpatched is run patched once more (one that then passes is *flaky*, shown, not counted) and with
every policy that has an ``eager`` choice set to it (``TMPATCH_NAN_CHECK=eager``,
``TMPATCH_BINCOUNT=eager``, ...: the release's moment for every check). What is left fails only
patched: a *correction* where :data:`CORRECTIONS` names it (a deliberate change of README's
"Results and deliberate corrections"), else a *regression*. ``--both`` runs every test unpatched
too, for the figures (tests passing unpatched, tests only tmpatch makes pass). ``--sample N`` runs
every test function with a fixed 1/N of its parametrizations (the same ones on every run);
``--sample classification=10`` does so in that domain only.

The output ends with a table per domain (tests, failed patched, failed only patched, seconds) and
the line ``upstream <release>: N regression(s), N correction(s), N flaky``. Exit status: 0 when no
regression, 1 with one or more, 2 when a run could not be made (a venv, an archive, pytest
itself). ``--json FILE`` saves every figure and failure.
"""
from __future__ import annotations

import argparse
import configparser
import fnmatch
import json
import os
import resource
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from typing import Dict, Iterable, List, Mapping, NamedTuple, Optional, Sequence, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.join(ROOT, "tools", "upstream")
sys.path.insert(0, ROOT)

from tmpatch.bootstrap import DIRECTORY as BOOTSTRAP  # noqa: E402 - the checkout's tmpatch, not an installed one
from tmpatch.control.settings import POLICIES, PREFIX  # noqa: E402

#: the releases whose tests and reference packages are here (tools/upstream/<release>/)
RELEASES = ("1.9.0", "1.4.0")

#: each domain: the test paths it runs, relative to the release's ``tests/`` folder. Every folder
#: of ``tests/unittests`` that holds a patched target's tests; detection and text: only the files
#: of their patched metrics (the others need COCO tools, language models and data from the network)
DOMAINS: Dict[str, Tuple[str, ...]] = {
    "bases": ("unittests/bases",),  # aggregation, collections, the Metric class
    "utilities": ("unittests/utilities",),
    "wrappers": ("unittests/wrappers",),
    "classification": ("unittests/classification",),
    "regression": ("unittests/regression",),
    "retrieval": ("unittests/retrieval",),
    "nominal": ("unittests/nominal",),
    "image": ("unittests/image",),
    "segmentation": ("unittests/segmentation",),
    "audio": ("unittests/audio",),
    "detection": ("unittests/detection/test_panoptic_quality.py",
                  "unittests/detection/test_modified_panoptic_quality.py"),
    "text": ("unittests/text/test_perplexity.py",),
}

#: what CI runs on every change (1.9.0; the other domains and 1.4.0 before every merge)
CI_DOMAINS = ("bases", "wrappers", "regression", "classification")


class Correction(NamedTuple):
    """A test that fails patched because of a deliberate correction: the releases it applies to
    (a specifier), the test ids (fnmatch patterns, ``[``/``]`` taken literally), and the
    correction's name as README's corrections list it."""

    releases: str
    pattern: str
    name: str


#: every test known to fail patched because of a deliberate correction (never skipped: still run,
#: and marked so in the output)
CORRECTIONS: Tuple[Correction, ...] = (
    Correction(">=0.10", "unittests/bases/test_aggregation.py::test_nan_error[*",
               "nan_check, deferred: nan_strategy='error'/'warn' report at the next compute(), not in forward()"),
    Correction(">=1.0", "unittests/regression/test_tweedie_deviance.py::test_error_on_invalid_inputs*",
               "tweedie_checks, deferred: invalid values raise at the next compute(), not in update()"),
    Correction(">=1.0", "unittests/detection/test_*panoptic_quality.py::test_error_on_wrong_input",
               "panoptic_preprocess, deferred: unknown preds categories raise at the next compute(), not in update()"),
)

#: outcomes that count as failing
BAD = ("failed", "error")

#: a rerun of fewer tests than this runs in one process (no pytest-xdist workers)
SERIAL_RERUN = 40

#: one test still running after this many seconds is stopped (pytest-timeout) and fails
TEST_TIMEOUT = 900


class Result(NamedTuple):
    outcome: str  # passed, failed, error, skipped, xfailed
    message: str  # the first line of the error ("" when passed)


def fold(records: Iterable[Mapping]) -> Dict[str, Result]:
    """Each test's outcome from the report plugin's JSON records (one per phase; a collection error
    counts as an error of the node it names; a rerun of pytest-rerunfailures starts the test over)."""
    results: Dict[str, Result] = {}
    for record in records:
        node, when, outcome = record["nodeid"], record["when"], record["outcome"]
        message = record.get("message", "") or ""
        current = results.get(node)
        if when == "collect":
            results[node] = Result("error", message)
        elif outcome == "rerun":
            results.pop(node, None)
        elif when == "setup":
            if outcome == "failed":
                results[node] = Result("error", message)
            elif outcome == "skipped":
                results[node] = Result("xfailed" if record.get("xfail") else "skipped", message)
        elif when == "call":
            if outcome == "skipped":
                results[node] = Result("xfailed" if record.get("xfail") else "skipped", message)
            else:
                results[node] = Result(outcome, message if outcome == "failed" else "")
        elif when == "teardown" and outcome == "failed" and (current is None or current.outcome not in BAD):
            results[node] = Result("error", message)
    return results


def read_report(path: str) -> Dict[str, Result]:
    """:func:`fold` of a report file (missing or empty: no test ran)."""
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as handle:
        return fold(json.loads(line) for line in handle if line.strip())


def _literal(pattern: str) -> str:
    """``pattern`` for fnmatch with its brackets literal (test ids hold them; ``*``, ``?`` stay wild)."""
    return "".join({"[": "[[]", "]": "[]]"}.get(char, char) for char in pattern)


def correction_of(release: str, nodeid: str, table: Sequence[Correction] = CORRECTIONS) -> Optional[Correction]:
    """The entry of ``table`` that names ``nodeid`` on ``release``, if any."""
    from packaging.specifiers import SpecifierSet

    for entry in table:
        if SpecifierSet(entry.releases).contains(release) and fnmatch.fnmatchcase(nodeid, _literal(entry.pattern)):
            return entry
    return None


def eager_environ() -> Dict[str, str]:
    """Every run-time policy that has an ``eager`` choice, set to it: the release's moment for each
    check tmpatch defers."""
    return {setting.variable: "eager" for setting in POLICIES.values() if "eager" in setting.choices}


MODES = ("unpatched", "patched", "eager")


def environ(mode: str, tests_dir: str, base: Optional[Mapping[str, str]] = None, ddp: bool = False,
            threads: Optional[int] = None) -> Dict[str, str]:
    """The environment of a run: torchmetrics' tests first on PYTHONPATH, then the report plugin;
    ``patched`` and ``eager`` add tmpatch's bootstrap directory and checkout and ``TMPATCH=1``
    (``eager``: with :func:`eager_environ`); the caller's PYTHONPATH comes last. Every ``TMPATCH*``
    variable of ``base`` is dropped first, so a run's policies are its mode's alone."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}; got {mode!r}")
    env = {k: v for k, v in (os.environ if base is None else base).items() if not k.startswith(PREFIX)}
    paths = [tests_dir, HERE]
    if mode != "unpatched":
        paths = [BOOTSTRAP, tests_dir, ROOT, HERE]
        env[PREFIX] = "1"
        if mode == "eager":
            env.update(eager_environ())
    paths += [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in paths]  # the caller's last
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env["USE_PYTEST_POOL"] = "1" if ddp else "0"
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    env.pop("PYTHONSTARTUP", None)
    return env


# -- the tests and the venv ------------------------------------------------------------------------


def find_archives(start: str = ROOT) -> Optional[str]:
    """The first ``shared/upstream`` folder beside ``start`` or above it."""
    folder = os.path.abspath(start)
    while True:
        candidate = os.path.join(folder, "shared", "upstream")
        if os.path.isdir(candidate):
            return candidate
        parent = os.path.dirname(folder)
        if parent == folder:
            return None
        folder = parent


def unpack(release: str, archives: str, workdir: str) -> str:
    """The release's ``tests/`` folder, unpacked (once) under ``workdir``."""
    archive = os.path.join(archives, f"torchmetrics-{release}-tests.tar.gz")
    if not os.path.exists(archive):
        raise FileNotFoundError(f"no {os.path.basename(archive)} in {archives}")
    tests = os.path.join(workdir, f"torchmetrics-{release}", "tests")
    mark = os.path.join(workdir, f"torchmetrics-{release}", ".unpacked")
    if not os.path.exists(mark):
        shutil.rmtree(os.path.join(workdir, f"torchmetrics-{release}"), ignore_errors=True)
        os.makedirs(workdir, exist_ok=True)
        with tarfile.open(archive) as tar:
            tar.extractall(workdir, filter="data")
        open(mark, "w").close()
    return tests


def requirement_files(release: str, domains: Sequence[str]) -> List[str]:
    """``common.txt`` and each domain's file of ``tools/upstream/<release>/``."""
    folder = os.path.join(HERE, release)
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"no reference requirements for {release} (tools/upstream/{release}/)")
    return [os.path.join(folder, f"{name}.txt") for name in ("common", *domains)]


def own_requirements() -> List[str]:
    """tmpatch's install_requires (setup.cfg) but torch and torchmetrics: the venv imports the checkout."""
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(ROOT, "setup.cfg"))
    lines = [line.strip() for line in cfg.get("options", "install_requires").split("\n")]
    return [line for line in lines if line and not line.startswith(("torch", "#"))]


def drop_unloadable(python: str, package: str) -> bool:
    """Uninstall ``package`` from the venv of ``python`` if it is there and cannot be imported
    (PyPI's torchvision for a torch release is a CUDA build, which does not load beside a CPU
    torch; netcal pulls it in): torchmetrics imports an installed torchvision, and would fail
    whole. Returns whether it was removed."""
    probe = subprocess.run([python, "-c",
                            f"import importlib.util, sys; sys.exit(importlib.util.find_spec({package!r}) is None)"],
                           capture_output=True, check=False)
    if probe.returncode != 0:
        return False  # not installed
    if subprocess.run([python, "-c", f"import {package}"], capture_output=True, check=False).returncode == 0:
        return False
    subprocess.run([python, "-m", "pip", "uninstall", "--quiet", "--yes", package], check=True,
                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    say(f"{package} removed from {os.path.dirname(os.path.dirname(python))}: it cannot be imported there "
        "(a build for another torch)")
    return True


def venv_python(release: str) -> str:
    return os.path.join(ROOT, ".venvs", f"upstream-{release}", "bin", "python")


#: the venv's folder of links to this interpreter's torch (see :func:`borrow_torch`)
BORROWED = "borrowed-torch"


def torch_entries() -> List[str]:
    """The paths of this interpreter's torch: its packages (``top_level.txt``: torch, torchgen,
    functorch) and its ``.dist-info``."""
    from importlib import metadata

    dist = metadata.distribution("torch")
    info = os.path.abspath(str(dist._path))  # type: ignore[attr-defined] - PathDistribution's folder
    site = os.path.dirname(info)
    names = (dist.read_text("top_level.txt") or "torch").split()
    return [info] + [os.path.join(site, name) for name in names if os.path.exists(os.path.join(site, name))]


def borrow_torch(python: str, borrowed: str) -> None:
    """Make this interpreter's torch the venv's, without installing it again (a CPU torch is most of
    a venv's install time): links to it in ``borrowed``, a folder that a ``.pth`` file of the venv puts
    on its path, after its own site-packages. pip sees it installed (a pinned torch is kept), and, as it
    lies outside the venv, never uninstalls it."""
    os.makedirs(borrowed, exist_ok=True)
    for path in torch_entries():
        link = os.path.join(borrowed, os.path.basename(path))
        if not os.path.lexists(link):
            os.symlink(path, link)
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    with open(os.path.join(site, "tmpatch-borrowed-torch.pth"), "w", encoding="utf-8") as handle:
        handle.write(borrowed + "\n")


def make_venv(release: str, domains: Sequence[str], torch_version: str) -> str:
    """The venv of ``release`` with the packages of ``domains`` (made once, with this interpreter's
    torch: :func:`borrow_torch`; a domain's packages are added the first time it is asked for);
    returns its interpreter."""
    import fcntl

    python = venv_python(release)
    folder = os.path.dirname(os.path.dirname(python))
    stamp = os.path.join(folder, ".tmpatch-domains")
    os.makedirs(os.path.dirname(folder), exist_ok=True)
    with open(folder + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        have: List[str] = []
        if os.path.exists(stamp):
            with open(stamp, encoding="utf-8") as handle:
                have = handle.read().split()
        borrowed = os.path.join(folder, BORROWED)
        if os.path.isdir(borrowed) and not os.path.exists(os.path.join(borrowed, "torch", "__init__.py")):
            have = []  # the torch it borrowed is gone (this interpreter's venv made anew): made anew too
            os.remove(stamp)
        missing = [d for d in domains if d not in have]
        if os.path.exists(stamp) and not missing:
            return python
        start = time.monotonic()
        if not os.path.exists(stamp):
            subprocess.run([sys.executable, "-m", "venv", "--clear", folder], check=True)
            borrow_torch(python, borrowed)
        wanted = have + missing
        command = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                   f"torch=={torch_version}", *own_requirements()]
        for path in requirement_files(release, wanted):
            command += ["-r", path]
        proc = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"pip failed for {release} ({', '.join(missing)}):\n{proc.stdout[-4000:]}")
        drop_unloadable(python, "torchvision")
        with open(stamp, "w", encoding="utf-8") as handle:
            handle.write(" ".join(wanted) + "\n")
        say(f"venv {os.path.relpath(folder, ROOT)}: {', '.join(missing)} installed in {time.monotonic() - start:.0f}s")
    return python


# -- runs ------------------------------------------------------------------------------------------


class Part(NamedTuple):
    """One pytest invocation's selection: a domain's paths, its DDP tests or the others."""

    domain: str
    ddp: bool

    @property
    def label(self) -> str:
        return f"{self.domain}{' (DDP)' if self.ddp else ''}"


class Run(NamedTuple):
    results: Dict[str, Result]
    seconds: float
    code: int
    tail: str
    cpu: float = 0.0  # CPU seconds of pytest and its processes: about twice the wall time on 2 idle cores


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class Runner:
    """Runs parts of a release's tests in its venv, in a mode, optionally only some node ids."""

    def __init__(self, python: str, release: str, tests_dir: str, scratch: str, jobs: int,
                 sample: Optional[Mapping[str, int]] = None) -> None:
        self.python, self.release, self.tests_dir, self.scratch, self.jobs = python, release, tests_dir, scratch, jobs
        self.sample = dict(sample or {})  # domain (or "" for every domain): N
        self.count = 0

    def parallel(self, part: Part, only_count: Optional[int]) -> bool:
        """Whether a run goes to pytest-xdist workers: not the DDP tests (one pool of processes on one
        range of ports), nor a rerun of a few tests (the workers' start costs more than it saves)."""
        return not part.ddp and self.jobs > 1 and (only_count is None or only_count >= SERIAL_RERUN)

    def command(self, part: Part, report: str, only: Optional[str], paths: Sequence[str],
                only_count: Optional[int] = None) -> List[str]:
        command = [self.python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "upstream_report",
                   "--rootdir", self.tests_dir, "--upstream-report", report,
                   "-m", "DDP" if part.ddp else "not DDP", f"--timeout={TEST_TIMEOUT}",
                   "-o", "console_output_style=classic",
                   "--continue-on-collection-errors"]  # a file that cannot be imported is its own error
        if only:
            command += ["--upstream-only", only]
        elif self.sample.get(part.domain, self.sample.get("", 1)) > 1:
            command += ["--upstream-sample", str(self.sample.get(part.domain, self.sample.get("", 1)))]
        if self.parallel(part, only_count):
            command += ["-n", str(self.jobs)]
        return command + list(paths)

    def run(self, part: Part, mode: str, nodeids: Optional[Sequence[str]] = None) -> Run:
        """``part`` in ``mode``: all its tests, or only ``nodeids`` (their files are collected)."""
        self.count += 1
        stem = os.path.join(self.scratch, f"{self.count:03d}-{part.domain}{'-ddp' if part.ddp else ''}-{mode}")
        report, only = stem + ".jsonl", None
        paths: Sequence[str] = DOMAINS[part.domain]
        if nodeids is not None:
            if not nodeids:
                return Run({}, 0.0, 0, "")
            only = stem + ".ids"
            with open(only, "w", encoding="utf-8") as handle:
                handle.write("\n".join(nodeids) + "\n")
            paths = sorted({nodeid.split("::")[0] for nodeid in nodeids})
        count = None if nodeids is None else len(nodeids)
        threads = 1 if self.parallel(part, count) else None
        env = environ(mode, self.tests_dir, ddp=part.ddp, threads=threads)
        # torchmetrics' tests keep their references' results on disk (cachier): each mode its own, so
        # that no result computed patched is read back unpatched, or the other way; the patched modes'
        # only for this run (a reference may call torchmetrics, and the checkout changes between runs)
        folder = os.path.dirname(self.scratch) if mode == "unpatched" else self.scratch
        env["PYTEST_REFERENCE_CACHE"] = os.path.join(folder, f"references-{self.release}-{mode}")
        start, cpu = time.monotonic(), children_cpu()
        with open(stem + ".log", "w", encoding="utf-8") as log:
            code = subprocess.call(self.command(part, report, only, paths, count), cwd=self.tests_dir, env=env,
                                   stdout=log, stderr=subprocess.STDOUT)
        seconds = time.monotonic() - start
        with open(stem + ".log", encoding="utf-8", errors="replace") as log:
            tail = "".join(log.readlines()[-15:])
        return Run(read_report(report), seconds, code, tail, children_cpu() - cpu)


# -- the comparison --------------------------------------------------------------------------------


class Finding(NamedTuple):
    """A test that failed patched and passed unpatched."""

    nodeid: str
    kind: str  # regression, correction, flaky
    message: str  # the first error line, patched
    eager: str  # its outcome under the eager policies ("" when not run)
    correction: str  # the correction's name, for kind == correction


class PartFigures(NamedTuple):
    part: Part
    tests: int  # every test with an outcome, patched
    skipped: int
    failed_patched: int
    passed_unpatched: Optional[int]  # --both only
    fixed: Optional[int]  # --both only: failed unpatched, passed patched
    findings: List[Finding]
    seconds: Dict[str, float]
    broken: str  # why pytest could not run the part ("" when it could)
    cpu: float = 0.0


#: pytest's exit codes of a run that ran (0 all passed, 1 some failed, 5 none collected)
RAN = (0, 1, 5)


def classify(release: str, failed_patched: Mapping[str, Result], unpatched: Mapping[str, Result],
             again: Mapping[str, Result], eager: Mapping[str, Result],
             table: Sequence[Correction] = CORRECTIONS) -> List[Finding]:
    """The findings among the tests that failed patched: those that passed unpatched; ``again``
    (the second patched run) tells flaky ones, ``eager`` how they fare under the eager policies."""
    findings = []
    for nodeid, result in sorted(failed_patched.items()):
        if unpatched.get(nodeid, Result("missing", "")).outcome != "passed":
            continue
        second = again.get(nodeid)
        eager_outcome = eager[nodeid].outcome if nodeid in eager else ""
        entry = correction_of(release, nodeid, table)
        if second is not None and second.outcome == "passed":
            kind = "flaky"
        elif entry is not None:
            kind = "correction"
        else:
            kind = "regression"
        findings.append(Finding(nodeid, kind, result.message, eager_outcome, entry.name if entry else ""))
    return findings


def compare(runner: Runner, part: Part, both: bool) -> PartFigures:
    seconds: Dict[str, float] = {}
    patched = runner.run(part, "patched")
    seconds["patched"] = patched.seconds
    if patched.code not in RAN:
        return PartFigures(part, len(patched.results), 0, 0, None, None, [], seconds,
                           f"pytest exit {patched.code}:\n{patched.tail}", patched.cpu)
    failed = {n: r for n, r in patched.results.items() if r.outcome in BAD}
    if both:
        unpatched = runner.run(part, "unpatched")
        seconds["unpatched"] = unpatched.seconds
    else:
        unpatched = runner.run(part, "unpatched", sorted(failed))
        seconds["unpatched (failures)"] = unpatched.seconds
    candidates = sorted(n for n in failed if unpatched.results.get(n, Result("", "")).outcome == "passed")
    again = runner.run(part, "patched", candidates)
    eager = runner.run(part, "eager", candidates)
    seconds["reruns"] = again.seconds + eager.seconds
    findings = classify(runner.release, failed, unpatched.results, again.results, eager.results)
    skipped = sum(r.outcome in ("skipped", "xfailed") for r in patched.results.values())
    passed_unpatched = fixed = None
    if both:
        passed_unpatched = sum(r.outcome == "passed" for r in unpatched.results.values())
        fixed = sum(r.outcome in BAD and patched.results.get(n, Result("", "")).outcome == "passed"
                    for n, r in unpatched.results.items())
    cpu = patched.cpu + unpatched.cpu + again.cpu + eager.cpu
    return PartFigures(part, len(patched.results), skipped, len(failed), passed_unpatched, fixed, findings,
                       seconds, "", cpu)


# -- output ----------------------------------------------------------------------------------------


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def finding_line(release: str, finding: Finding) -> str:
    eager = f" [eager policies: {finding.eager}]" if finding.eager else ""
    label = {"regression": "REGRESSION", "correction": "correction", "flaky": "flaky"}[finding.kind]
    named = f" ({finding.correction})" if finding.correction else ""
    return f"  {label}{named}{eager} {release} {finding.nodeid}\n      {finding.message or '(no message)'}"


def table(release: str, figures: Sequence[PartFigures]) -> List[str]:
    head = f"{'domain':<26}{'tests':>7}{'skipped':>9}{'failed patched':>16}{'passed unpatched':>18}" \
           f"{'only patched':>14}{'corrections':>13}{'flaky':>7}{'seconds':>9}{'CPU s':>8}"
    lines = [f"upstream {release}:", head]
    for fig in figures:
        count = {kind: sum(f.kind == kind for f in fig.findings) for kind in ("regression", "correction", "flaky")}
        unpatched = "-" if fig.passed_unpatched is None else str(fig.passed_unpatched)
        broken = "  (could not run)" if fig.broken else ""
        lines.append(f"{fig.part.label:<26}{fig.tests:>7}{fig.skipped:>9}{fig.failed_patched:>16}{unpatched:>18}"
                     f"{count['regression']:>14}{count['correction']:>13}{count['flaky']:>7}"
                     f"{sum(fig.seconds.values()):>9.0f}{fig.cpu:>8.0f}{broken}")
    return lines


def as_json(release: str, figures: Sequence[PartFigures]) -> dict:
    return {"release": release, "parts": [{
        "domain": fig.part.domain, "ddp": fig.part.ddp, "tests": fig.tests, "skipped": fig.skipped,
        "failed_patched": fig.failed_patched, "passed_unpatched": fig.passed_unpatched, "fixed_by_tmpatch": fig.fixed,
        "seconds": {k: round(v, 1) for k, v in fig.seconds.items()}, "cpu_seconds": round(fig.cpu, 1),
        "broken": fig.broken,
        "findings": [f._asdict() for f in fig.findings],
    } for fig in figures]}


def parse_domains(text: Optional[str], ci: bool) -> List[str]:
    if ci and not text:
        return list(CI_DOMAINS)
    if not text or text == "all":
        return list(DOMAINS)
    names = [name.strip() for name in text.split(",") if name.strip()]
    aliases = {"aggregation": "bases"}
    names = [aliases.get(name, name) for name in names]
    unknown = [name for name in names if name not in DOMAINS]
    if unknown:
        raise SystemExit(f"upstream_tests: unknown domain(s) {', '.join(unknown)}; domains: {', '.join(DOMAINS)}")
    return list(dict.fromkeys(names))


def parse_sample(text: Optional[str]) -> Dict[str, int]:
    """``--sample``: ``N`` (every domain: key "") or ``DOMAIN=N,...``; 1 is every test."""
    if not text:
        return {}
    sample: Dict[str, int] = {}
    for item in text.split(","):
        domain, _, number = item.strip().rpartition("=")
        domain = {"aggregation": "bases"}.get(domain.strip(), domain.strip())
        if domain and domain not in DOMAINS:
            raise SystemExit(f"upstream_tests: --sample: unknown domain {domain!r}; domains: {', '.join(DOMAINS)}")
        try:
            value = int(number)
        except ValueError:
            raise SystemExit(f"upstream_tests: --sample: {item.strip()!r} is not N or DOMAIN=N") from None
        if value < 1:
            raise SystemExit(f"upstream_tests: --sample: {item.strip()!r}: N must be 1 or more")
        if value > 1:
            sample[domain] = value
    return sample


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--release", required=True, choices=RELEASES, help="the torchmetrics release")
    parser.add_argument("--domains", help=f"comma-separated (default: all): {', '.join(DOMAINS)}")
    parser.add_argument("--ci", action="store_true",
                        help=f"what CI runs: {', '.join(CI_DOMAINS)} (unless --domains), the DDP tests left out")
    parser.add_argument("--both", action="store_true",
                        help="run every test unpatched too (the figures: passed unpatched, fixed by tmpatch)")
    parser.add_argument("--no-ddp", action="store_true", help="leave out the tests marked DDP")
    parser.add_argument("--sample", metavar="N|DOMAIN=N,...",
                        help="every test function, with a fixed 1/N of its parametrizations, in every domain or in "
                             "those named (default: every test)")
    parser.add_argument("--ddp-only", action="store_true", help="only the tests marked DDP")
    parser.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1,
                        help="pytest-xdist workers for the tests not marked DDP (default: the cores)")
    parser.add_argument("--archives",
                        help="the folder of torchmetrics-<release>-tests.tar.gz (default: shared/upstream)")
    parser.add_argument("--workdir", help="where the tests are unpacked and the runs' reports go "
                                          "(default: a folder under the system's temporary directory)")
    parser.add_argument("--json", metavar="FILE", help="save every figure and finding as JSON")
    args = parser.parse_args(argv)
    domains = parse_domains(args.domains, args.ci)
    sample = parse_sample(args.sample)
    archives = args.archives or find_archives()
    if not archives:
        say("upstream_tests: no shared/upstream folder beside the checkout or above it; name one with --archives")
        return 2
    workdir = args.workdir or os.path.join(tempfile.gettempdir(), f"tmpatch-upstream-{os.getuid()}")
    import torch  # the venv gets this interpreter's torch

    try:
        tests_dir = unpack(args.release, archives, workdir)
        python = make_venv(args.release, domains, torch.__version__)
    except (OSError, RuntimeError, subprocess.CalledProcessError) as exc:
        say(f"upstream_tests: {exc}")
        return 2
    scratch = tempfile.mkdtemp(prefix=f"runs-{args.release}-", dir=workdir)
    runner = Runner(python, args.release, tests_dir, scratch, max(1, args.jobs), sample)
    ddp_modes = [True] if args.ddp_only else [False] if (args.no_ddp or args.ci) else [False, True]
    sampled = ", ".join(f"{d or 'every domain'} 1/{n}" for d, n in sample.items())
    sampled = f" (every test function, a share of the parametrizations: {sampled})" if sampled else ""
    say(f"upstream {args.release}: {', '.join(domains)}"
        f"{'' if True in ddp_modes else ' (DDP tests left out)'}{sampled}; "
        f"tests in {tests_dir}, runs' logs in {scratch}")
    figures: List[PartFigures] = []
    for domain in domains:
        for ddp in ddp_modes:
            fig = compare(runner, Part(domain, ddp), args.both)
            figures.append(fig)
            say(f"{fig.part.label}: {fig.tests} tests, {fig.failed_patched} failed patched, "
                f"{sum(f.kind == 'regression' for f in fig.findings)} only patched "
                f"({', '.join(f'{k} {v:.0f}s' for k, v in fig.seconds.items())}; CPU {fig.cpu:.0f}s)")
            if fig.broken:
                say(f"  could not run: {fig.broken}")
            for finding in fig.findings:
                say(finding_line(args.release, finding))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            json.dump(as_json(args.release, figures), handle, indent=1)
    for line in table(args.release, figures):
        say(line)
    findings = [f for fig in figures for f in fig.findings]
    regressions = sum(f.kind == "regression" for f in findings)
    say(f"upstream {args.release}: {regressions} regression(s), {sum(f.kind == 'correction' for f in findings)} "
        f"correction(s), {sum(f.kind == 'flaky' for f in findings)} flaky")
    if any(fig.broken for fig in figures):
        return 2
    return 1 if regressions else 0


if __name__ == "__main__":
    raise SystemExit(main())
