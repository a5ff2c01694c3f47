"""Run the test suite against a matrix of torchmetrics releases, in one command.

    python tools/matrix.py                    # every release in RELEASES, 2 at a time
    python tools/matrix.py -r 1.4.0 -r 1.9.0  # some of them
    python tools/matrix.py -- -k safe_divide  # arguments after -- go to pytest

Each release is installed once, without dependencies, into ``.matrix/<release>``
(``pip install --no-deps --target``) and put first on ``PYTHONPATH``, so every
run shares the one torch of this interpreter. Exits non-zero if any release
fails; the last line reads ``N passed, N failed`` (releases).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import List, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: every release where a target's code changed (tools/fingerprints.py shows them), and the ones the
#: core issue names
RELEASES = (
    "1.0.0", "1.0.1", "1.0.2", "1.0.3", "1.2.1", "1.3.2", "1.4.0", "1.4.1",
    "1.5.2", "1.6.0", "1.6.1", "1.6.2", "1.7.2", "1.7.4", "1.8.2", "1.9.0",
)


def install(release: str, folder: str) -> None:
    target = os.path.join(folder, release)
    if os.path.exists(os.path.join(target, "torchmetrics", "__init__.py")):
        return
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--disable-pip-version-check",
         "--target", target, f"torchmetrics=={release}"],
        check=True,
    )


def run(release: str, folder: str, pytest_args: List[str]) -> Tuple[str, int, float, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.join(folder, release), ROOT, env.get("PYTHONPATH")) if p)
    env["TMPATCH_TEST_RELEASE"] = release
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *pytest_args],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    return release, proc.returncode, time.monotonic() - start, proc.stdout


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-r", "--release", action="append", help="a torchmetrics release (repeatable)")
    parser.add_argument("-j", "--jobs", type=int, default=2, help="releases tested at once (default 2)")
    parser.add_argument("--folder", default=os.path.join(ROOT, ".matrix"), help="where releases are installed")
    parser.add_argument("pytest_args", nargs="*", help="arguments for pytest (after --)")
    args = parser.parse_args(argv)
    releases = args.release or list(RELEASES)
    for release in releases:
        install(release, args.folder)
    failed = []
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for release, code, seconds, output in pool.map(lambda r: run(r, args.folder, args.pytest_args), releases):
            last = output.strip().splitlines()[-1] if output.strip() else "(no output)"
            sys.stdout.write(f"torchmetrics {release}: exit {code} in {seconds:.0f}s: {last}\n")
            if code != 0:
                failed.append(release)
                sys.stdout.write(output + "\n")
            sys.stdout.flush()
    sys.stdout.write(f"matrix: {len(releases) - len(failed)} passed, {len(failed)} failed\n")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
