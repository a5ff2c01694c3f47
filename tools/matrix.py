"""Run the test suite against a matrix of torch builds and torchmetrics releases, in one command.

    python tools/matrix.py                         # this interpreter's torch, every release in RELEASES
    python tools/matrix.py -r 1.4.0 -r 1.9.0       # some of them
    python tools/matrix.py -- -k safe_divide       # arguments after -- go to pytest
    python tools/matrix.py --torch 2.5.1 -r 1.6.1  # another torch (its own venv, made once)
    python tools/matrix.py --plan                  # every torch of PLAN with its releases
                                                   # (older torch: the tests of TORCH_TESTS)
    python tools/matrix.py --plan --prune          # what CI runs: the same, each venv removed after
                                                   # its torch's last run (at most 3 at once on disk)
    python tools/matrix.py --explore -r 1.9.0      # hypothesis searches with fresh draws (not CI)

Each release is installed once, without dependencies, into ``.matrix/<release>``
(``pip install --no-deps --target``) and put first on ``PYTHONPATH``. Each torch other
than this interpreter's gets a venv, ``.venvs/torch-<version>``, made once with
``pip install torch==<version>`` (from PyPI: on Linux a CUDA build, which must work on a
machine without a GPU) and tmpatch's other requirements (setup.cfg); tmpatch itself is
the source tree, on ``PYTHONPATH``. Runs go 2 at a time (``-j``); the venvs are made
while this torch's runs go. A run fails on any pytest exit status but 0 (5, "no tests
collected", included). Tests marked ``once`` (nothing in them depends on the release) run
with each torch's first release only. The ANCHORS releases run the whole suite with every
hypothesis comparison's full count of examples; each other release runs the tests of the
patches whose targets' code changes there (:func:`changed_patches`: a target's variant differs
from the one of the release before it) and the tests of EVERY_RELEASE, with a tenth of the
examples (``TMPATCH_TEST_EXAMPLES`` set beforehand wins; ``--full``: the whole suite everywhere).
So each patch's tests run on every release where its code changed. Hypothesis draws the
same examples at every run and keeps no database
(tests/conftest.py), so a run's outcome depends on the code alone; ``--explore`` searches with
fresh draws instead, each run keeping what it finds in its own database
(``.hypothesis/<torch>-<release>``), which later ``--explore`` runs of that pair replay. Exits
non-zero if any run fails; the last line reads ``matrix: N passed, N failed`` (runs).
"""
from __future__ import annotations

import argparse
import configparser
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Dict, List, Optional, Sequence, Tuple

from packaging.version import Version

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CURRENT = "current"

#: every release where a target's code changed (tools/fingerprints.py shows them), and the ones the
#: core issues name. The first runs the ``once`` tests (packaging and start-up among them): 1.0.0. Then
#: 0.10.x-0.11.x, a release of each group of the same code: 0.10.1 (0.10.0-0.10.1), 0.10.3 (0.10.2-0.10.3),
#: 0.11.1 (0.11.0-0.11.1, and the stat-scores update of 0.11.0-0.11.2), 0.11.3, 0.11.4 (the common pin)
RELEASES = (
    "1.0.0", "0.10.1", "0.10.3", "0.11.1", "0.11.3", "0.11.4",
    "1.0.1", "1.0.2", "1.0.3", "1.1.2", "1.2.1", "1.3.2", "1.4.0", "1.4.1",
    "1.5.2", "1.6.0", "1.6.1", "1.6.2", "1.7.0", "1.7.2", "1.7.4", "1.8.0", "1.8.2", "1.9.0",
)

#: the releases the core issues name: every hypothesis comparison runs its full count of examples
#: there; the releases between them run a tenth (``TMPATCH_TEST_EXAMPLES``; at least 3), every test still runs
ANCHORS = ("0.11.4", "1.0.0", "1.0.3", "1.4.0", "1.6.1", "1.9.0")
BETWEEN = "0.1"

#: what CI runs. The newest torch builds, CUDA builds on this GPU-less machine as many users run
#: them, carry the anchors with the whole suite (FULL): 2.15.0 on Python 3.13, 2.14.1 (on this
#: machine's disk, Python 3.11). torch 2.13.0, a CPU-only build and this interpreter's, runs every
#: other release (the tests of what changed there, :func:`selected_tests`) and, first, 1.0.0's tests
#: marked ``once`` or ``processes`` (1.0.0 runs whole on 2.14.1). Python 3.13 runs a test about half
#: again as long as 3.11: 2.15.0 carries the newest anchor, 2.14.1 the others. Each older torch (CUDA
#: builds) runs the torch-dependent tests (TORCH_TESTS) with the releases its users would have, with a
#: tenth of the examples (each anchor's full counts run on a torch of FULL)
PLAN: Dict[str, Tuple[str, ...]] = {
    CURRENT: tuple(r for r in RELEASES if r not in ANCHORS or r == RELEASES[0]),
    "2.15.0": ("1.9.0",),
    "2.14.1": ("1.0.0", "1.6.1", "1.4.0", "1.0.3", "0.11.4"),
    "2.5.1": ("1.6.1",),  # autumn 2024; 1.6.1 + 2.5.1: the best-known report of metric syncs
    # winter 2023: the oldest torch the audit supports (tmpatch.audit.support.MIN_TORCH); 0.11.4: the pin of
    # Lightning 1.9/2.0 projects, the last release before the 1.0 API change
    "2.1.2": ("0.11.4",),
    # spring 2023, below the audit's floor: the patches with 0.11.4, the pin of its time (the audit's tests
    # are not collected there, and a test that reaches the audit is skipped with its message)
    "2.0.1": ("0.11.4",),
}

#: the torches whose anchors run the whole suite in CI (:data:`PLAN`); the others run TORCH_TESTS
FULL: Tuple[str, ...] = (CURRENT, "2.15.0", "2.14.1")

#: the Python of each torch's venv (``python3.X`` on the PATH, or pyenv's); unlisted: this interpreter's
PYTHONS: Dict[str, str] = {"2.15.0": "3.13", "2.5.1": "3.12"}

#: tests a release outside ANCHORS runs whatever changed there: they cross every patch (apply and
#: revert of the whole catalogue, deferred reports, kernel counts of the audit panel) or choose
#: their own releases (the multi-process runs)
EVERY_RELEASE: Tuple[str, ...] = (
    "tests/control/test_api.py", "tests/control/test_adversarial.py", "tests/runtime/test_deferred.py",
    "tests/test_kernel_counts.py", "tests/patches/test_deferred_reports.py", "tests/runtime/test_device_tensors.py",
    "tests/distributed", "tests/runtime/test_deferred_landing.py", "tests/patches/test_deferred_timing.py",
    "tests/patches/test_differential.py",
)
#: a patch's tests: ``tests/patches/test_<patch>*.py`` and ``tests/patches/<patch>/``, and these
TESTS_OF: Dict[str, Tuple[str, ...]] = {
    "compiled_update": ("tests/patches/test_compiled_families.py", "tests/patches/test_compiled_older_torch.py"),
}

#: with an older torch, the tests whose outcome can depend on torch: the audit, every patch
#: (its hypothesis bit-identity comparisons and its sync tests), real process groups, the
#: deferred reports and the pytest plugin's fixtures; not the import-hook, environment and
#: packaging machinery, which torch does not touch (they run with the newest torch)
TORCH_TESTS: Tuple[str, ...] = ("tests/audit", "tests/patches", "tests/distributed", "tests/runtime/test_deferred.py",
                                "tests/runtime/test_deferred_landing.py",
                                "tests/runtime/test_device_tensors.py",
                                "tests/test_pytest_plugin.py")

#: a run (one torch, one release) takes 1-3 minutes on 2 idle cores and up to about 17 on a
#: loaded box; one still going after this is stuck: it is killed, its stacks printed, and it fails
#: (every test has its own bound too: ``faulthandler_timeout`` in setup.cfg prints the stacks of a
#: test that takes too long)
RUN_LIMIT = 2400.0

#: with --prune (CI), the most venvs of other torches held at once
LIVE_VENVS = 3

#: torch releases built against numpy 1.x
NUMPY_1 = re.compile(r"^2\.[0-2]\.")


#: releases before 1.0 import ``pkg_resources`` (setuptools), gone from setuptools 81: they get
#: the setuptools that Python 3.11's venvs are made with, in their own folder
PKG_RESOURCES = "setuptools<66"


def extras(release: str) -> List[str]:
    """What ``release`` imports beyond the venv's packages, installed beside it."""
    return [PKG_RESOURCES] if Version(release) < Version("1.0") else []

def _variants(patch: Any, release: Version) -> Tuple[Optional[int], ...]:
    """Which variant of each of ``patch``'s targets ``release`` holds (None: none, or absent)."""
    held = []
    for target in patch.targets:
        if target.present is not None and not target.present.contains(release, prereleases=True):
            held.append(None)
            continue
        held.append(next((i for i, variant in enumerate(target.variants)
                          if variant.releases.contains(release, prereleases=True)), None))
    return tuple(held)


def changed_patches(release: str, releases: Sequence[str]) -> List[str]:
    """The patches of the catalogue whose targets' code differs between ``release`` and the release
    of ``releases`` just before it (every patch for the oldest)."""
    from tmpatch import patches as catalogue

    ordered = sorted(set(releases) | {release}, key=Version)
    index = ordered.index(release)
    before = Version(ordered[index - 1]) if index else None
    changed = []
    for name in catalogue.NAMES:
        patch = catalogue.load(name)
        if before is None or _variants(patch, Version(release)) != _variants(patch, before):
            changed.append(name)
    return changed


def patch_tests(names: Sequence[str]) -> List[str]:
    """The test paths of the patches ``names`` (relative to the checkout)."""
    folder = os.path.join(ROOT, "tests", "patches")
    paths: List[str] = []
    for name in names:
        own = sorted(f"tests/patches/{entry}" for entry in os.listdir(folder)
                     if (entry.startswith(f"test_{name}") and entry.endswith(".py"))
                     or (entry == name and os.path.isdir(os.path.join(folder, entry))))
        paths += [p for p in own + list(TESTS_OF.get(name, ())) if p not in paths]
    return paths


def selected_tests(release: str, releases: Sequence[str]) -> List[str]:
    """What a release outside ANCHORS runs: EVERY_RELEASE and the tests of its changed patches."""
    paths = list(EVERY_RELEASE)
    return paths + [p for p in patch_tests(changed_patches(release, releases)) if p not in paths]


def _names_paths(pytest_args: Sequence[str]) -> bool:
    """Whether ``pytest_args`` name tests to run (a path, or a node id)."""
    return any(not arg.startswith("-") and os.path.exists(os.path.join(ROOT, arg.split("::")[0]))
               for arg in pytest_args)


def install(release: str, folder: str) -> None:
    """torchmetrics ``release`` (and its :func:`extras`) into ``folder/release`` (once)."""
    target = os.path.join(folder, release)
    marks = [os.path.join(target, "torchmetrics", "__init__.py")]
    if extras(release):
        marks.append(os.path.join(target, "pkg_resources", "__init__.py"))
    if all(os.path.exists(mark) for mark in marks):
        return
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--disable-pip-version-check",
         "--target", target, "--upgrade", f"torchmetrics=={release}", *extras(release)],
        check=True,
    )


def requirements(torch_version: str) -> List[str]:
    """What a venv for ``torch_version`` needs besides torch: setup.cfg's install_requires and
    test extras (torch and torchmetrics left out), and torchmetrics' own lightning-utilities."""
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(ROOT, "setup.cfg"))
    lines = cfg.get("options", "install_requires").split("\n") + \
        cfg.get("options.extras_require", "test").split("\n")
    reqs = [line.strip() for line in lines if line.strip() and not line.strip().startswith(("torch", "#"))]
    reqs.append("lightning-utilities")
    if NUMPY_1.match(torch_version):
        reqs = [r for r in reqs if not r.startswith("numpy")] + ["numpy<2"]
    return reqs


def venv_python(torch_version: str) -> str:
    """The interpreter of the venv for ``torch_version``."""
    return os.path.join(ROOT, ".venvs", f"torch-{torch_version}", "bin", "python")


def make_venv(torch_version: str) -> str:
    """The venv for ``torch_version``, made (once) if missing; returns its interpreter. ``.venvs``
    may be shared by several checkouts: the making holds a lock beside the venv, so that a second
    caller waits for the first instead of clearing the venv it is filling."""
    import fcntl

    python = venv_python(torch_version)
    folder = os.path.dirname(os.path.dirname(python))
    done = os.path.join(folder, ".tmpatch-ready")
    if os.path.exists(done):
        return python
    os.makedirs(os.path.dirname(folder), exist_ok=True)
    with open(folder + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(done):  # made by another caller while this one waited
            _fill_venv(torch_version, python, done)
    return python


def base_python(torch_version: str) -> str:
    """The interpreter a venv for ``torch_version`` is made with (:data:`PYTHONS`): ``python3.X`` on
    the PATH, else pyenv's newest 3.X; this interpreter where none is listed."""
    wanted = PYTHONS.get(torch_version)
    if wanted is None:
        return sys.executable
    pyenv = os.path.join(os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv")), "versions")
    found = sorted((v for v in (os.listdir(pyenv) if os.path.isdir(pyenv) else ()) if v.startswith(wanted + ".")),
                   key=lambda v: Version(v) if re.fullmatch(r"[0-9.]+", v) else Version("0"))
    candidates = [os.path.join(pyenv, v, "bin", "python" + wanted) for v in reversed(found)]
    candidates.append(shutil.which("python" + wanted) or "")
    for candidate in candidates:
        if candidate and subprocess.run([candidate, "-c", "pass"], capture_output=True).returncode == 0:
            return candidate
    raise RuntimeError(f"torch {torch_version} runs on Python {wanted}, and no python{wanted} was found")


#: what a venv with a CUDA build of torch takes on disk (about 5.5 GiB), with the download beside it
VENV_GIB = 8.0


def _fill_venv(torch_version: str, python: str, done: str) -> None:
    start = time.monotonic()
    folder = os.path.dirname(os.path.dirname(python))
    free = shutil.disk_usage(os.path.dirname(folder)).free / 2**30
    if free < VENV_GIB:
        raise RuntimeError(f"{free:.1f} GiB free on the disk of {os.path.dirname(folder)}; a venv for torch "
                           f"{torch_version} takes about {VENV_GIB:.0f} GiB while it is made (a CUDA build and "
                           "its download): free some space, or leave that torch out (--torch)")
    subprocess.run([base_python(torch_version), "-m", "venv", "--clear", folder], check=True)
    # a constraints file of the run's own: it pins the torch asked for, and replaces the machine's pip
    # configuration, which may cap torch below it (the pip of the venv still reads that file otherwise)
    constraints = folder + ".constraints"
    with open(constraints, "w") as out:
        out.write(f"torch=={torch_version}\n")
    env = dict(os.environ, PIP_CONSTRAINT=constraints)
    pip = subprocess.run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                          f"torch=={torch_version}", *requirements(torch_version)], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if pip.returncode != 0:
        shutil.rmtree(folder, ignore_errors=True)  # a half-made venv holds gigabytes and is never used
        tail = "\n".join("    " + line for line in pip.stdout.strip().splitlines()[-15:])
        free = shutil.disk_usage(os.path.dirname(folder)).free / 2**30
        raise RuntimeError(f"pip install torch=={torch_version} exited {pip.returncode} ({free:.1f} GiB free "
                           f"now); pip's last lines:\n{tail}")
    open(done, "w").close()
    sys.stdout.write(f"torch {torch_version}: venv made in {time.monotonic() - start:.0f}s\n")
    sys.stdout.flush()


def run(python: str, release: str, folder: str, pytest_args: Sequence[str],
        first: bool = False, explore: str = "", processes: bool = True,
        full_counts: Optional[bool] = None) -> Tuple[int, float, str]:
    """One pytest run of ``release`` with ``python``; ``explore``: the label of the run's own
    hypothesis database (fresh draws), or empty for the reproducible draws; ``processes``: False
    leaves out the tests marked ``processes`` (real child processes: they test tmpatch's own
    machinery, which the whole-suite runs and the older torches' runs cover); ``full_counts``: the
    hypothesis comparisons' full counts of examples (default: for the ANCHORS)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.join(folder, release), ROOT, env.get("PYTHONPATH")) if p)
    env["TMPATCH_TEST_RELEASE"] = release
    env["TMPATCH_TEST_TORCH_FIRST"] = "1" if first else "0"  # tests marked `once` run once per torch
    full = release in ANCHORS if full_counts is None else full_counts
    env.setdefault("TMPATCH_TEST_EXAMPLES", "1" if full else BETWEEN)
    if not processes:
        env["TMPATCH_TEST_PROCESSES"] = "0"
    env.pop("TMPATCH_HYPOTHESIS", None)
    if explore:
        env["TMPATCH_HYPOTHESIS"] = "explore"
        env["TMPATCH_HYPOTHESIS_DB"] = os.path.join(ROOT, ".hypothesis", explore)
    start = time.monotonic()
    proc = subprocess.Popen(
        [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", *pytest_args],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,  # its own process group: a run past RUN_LIMIT is killed whole
    )
    try:
        output, _ = proc.communicate(timeout=RUN_LIMIT)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGABRT)  # pytest's faulthandler prints every thread's stack
        time.sleep(5)
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        output += f"\nmatrix: still running after {RUN_LIMIT:.0f}s; killed (the stacks above show where)\n"
        return 124, time.monotonic() - start, output
    return proc.returncode, time.monotonic() - start, output


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _torch_of(python: str) -> str:
    out = subprocess.run([python, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True)
    return out.stdout.strip() or "?"


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-r", "--release", action="append", help="a torchmetrics release (repeatable)")
    parser.add_argument("--torch", action="append", metavar="VERSION",
                        help=f"a torch release, or '{CURRENT}' for this interpreter's (repeatable; default {CURRENT})")
    parser.add_argument("--plan", action="store_true", help="every torch of PLAN with its releases (what CI runs)")
    parser.add_argument("--explore", action="store_true",
                        help="hypothesis searches with fresh draws, a database per run (not what CI runs)")
    parser.add_argument("--full", action="store_true",
                        help="the whole suite on every release (default: outside ANCHORS, what changed there)")
    parser.add_argument("--prune", action="store_true",
                        help=f"remove each other torch's venv after its last run, and hold at most {LIVE_VENVS} "
                             "at once (CI: a venv takes about 5.5 GiB)")
    parser.add_argument("-j", "--jobs", type=int, default=2, help="runs at once (default 2)")
    parser.add_argument("--folder", default=os.path.join(ROOT, ".matrix"), help="where releases are installed")
    parser.add_argument("pytest_args", nargs="*", help="arguments for pytest (after --)")
    args = parser.parse_args(argv)
    if args.plan:
        plan = {t: list(r) for t, r in PLAN.items() if not args.torch or t in args.torch}
        if args.release:
            plan = {t: [r for r in rels if r in args.release] for t, rels in plan.items()}
    else:
        plan = {t: list(args.release or RELEASES) for t in (args.torch or [CURRENT])}
    # each torch's first release first (it runs the `once` tests too), then its anchors (full hypothesis
    # counts: the longest runs), then the rest: the short runs come last and fill both slots to the end
    jobs = [(t, r) for t, rels in plan.items()
            for r in rels[:1] + sorted(rels[1:], key=lambda r: r not in ANCHORS)]
    for release in sorted({r for _, r in jobs}):
        install(release, args.folder)

    venvs: Dict[str, Future] = {}
    # --prune: a venv is made only while fewer than LIVE_VENVS are held; the last run of its torch
    # removes it. The venvs are made in the order of the jobs, so the torch whose runs come next always
    # has one (or is making it): the wait cannot close a circle
    live = threading.Semaphore(LIVE_VENVS) if args.prune else None
    remaining = {t: sum(1 for job in jobs if job[0] == t) for t in plan}

    def make(torch_version: str) -> str:
        if torch_version == CURRENT:
            return sys.executable
        if live is not None:
            live.acquire()
        try:
            return make_venv(torch_version)
        except BaseException:
            if live is not None:
                live.release()
            raise

    maker = ThreadPoolExecutor(max_workers=1)  # one venv at a time, while this torch's runs go
    for torch_version in plan:
        venvs[torch_version] = maker.submit(make, torch_version)
    lock = threading.Lock()

    def done_with(torch_version: str) -> None:
        """After a run of ``torch_version`` (under ``lock``): its venv goes with its last run (--prune)."""
        remaining[torch_version] -= 1
        if live is None or remaining[torch_version] or torch_version == CURRENT:
            return
        if venvs[torch_version].exception() is None:
            shutil.rmtree(os.path.dirname(os.path.dirname(venv_python(torch_version))), ignore_errors=True)
            live.release()
    failed: List[str] = []
    labels = {t: (_torch_of(sys.executable) if t == CURRENT else t) for t in plan}

    def one(job: Tuple[str, str]) -> None:
        torch_version, release = job
        label = labels[torch_version]
        try:
            python = venvs[torch_version].result()
        except Exception as exc:  # noqa: BLE001 - no venv: every run of that torch fails
            code, seconds, output = 1, 0.0, f"cannot make the venv for torch {torch_version}: {exc}"
        else:
            try:
                code, seconds, output = _one_run(python, torch_version, release, label)
            except Exception:  # noqa: BLE001 - a run that cannot start fails alone; the others go on
                code, seconds, output = 1, 0.0, traceback.format_exc()
        last = output.strip().splitlines()[-1] if output.strip() else "(no output)"
        with lock:
            sys.stdout.write(f"torch {label} torchmetrics {release}: exit {code} in {seconds:.0f}s: {last}\n")
            if code != 0:  # 5 ("no tests collected") too
                failed.append(f"{label}/{release}")
                sys.stdout.write(output + "\n")
            done_with(torch_version)
            sys.stdout.flush()

    def _one_run(python: str, torch_version: str, release: str, label: str) -> Tuple[int, float, str]:
        paths = list(TORCH_TESTS) if args.plan and torch_version not in FULL else []
        first = release == plan[torch_version][0]
        selected = not (paths or first or args.full or release in ANCHORS or _names_paths(args.pytest_args))
        if selected:
            paths = selected_tests(release, RELEASES)
        # an anchor that also runs whole on a newer torch of the plan takes its full hypothesis counts
        # there; here (the CPU-only build, its first release) the tests of this torch's machinery alone
        elsewhere = args.plan and any(release in PLAN.get(other, ()) for other in FULL if other != torch_version)
        if args.plan and first and torch_version == CURRENT and elsewhere and not args.pytest_args:
            paths = ["-m", "once or processes"]
        # the anchors' full counts run on the torches of FULL; an older torch's (TORCH_TESTS) take a tenth
        return run(python, release, args.folder, paths + list(args.pytest_args),
                   first=first, explore=f"{label}-{release}" if args.explore else "", processes=not selected,
                   full_counts=release in ANCHORS and torch_version in FULL
                   and not (torch_version == CURRENT and elsewhere))

    start, cpu = time.monotonic(), _children_cpu()
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        list(pool.map(one, jobs))
    maker.shutdown()
    # CPU time of every run and venv made (children): on an idle machine with N cores the
    # wall time is about this divided by N, whatever else was running here
    sys.stdout.write(f"matrix: {len(jobs)} runs, {time.monotonic() - start:.0f}s wall, "
                     f"{_children_cpu() - cpu:.0f}s CPU\n")
    sys.stdout.write(f"matrix: {len(jobs) - len(failed)} passed, {len(failed)} failed\n")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
