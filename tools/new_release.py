"""What a torchmetrics release tmpatch has not seen changes for tmpatch, in one command.

Maintainers' tool::

    python tools/new_release.py torchmetrics-1.10.0-py3-none-any.whl
    python tools/new_release.py ~/src/torchmetrics            # a source tree (src/torchmetrics inside)
    python tools/new_release.py .matrix/1.9.0 --json          # a release folder (pip install --target)

Reads the release's files (imports nothing of it), fingerprints every target and every
torchmetrics function a patch relies on, and prints:

* the release and the wheel it is compared with (its own where tmpatch knows it, else the newest);
* the targets whose fingerprint is new (no variant has it: the code changed), gone (absent, where
  the wheel compared with has them), or that went back to an older known implementation;
* what each patch would do there, from the same gating as ``apply()`` (``tmpatch.control.gating``):
  applied, partial (naming the targets left alone), not-needed, mismatch;
* the tests to run: those of every patch with a new or gone target (``tools/matrix.py``'s
  ``patch_tests``) and the tests every release runs (``EVERY_RELEASE``), with the command.

To add the release: read each new target's code against the known one (``tools/fingerprints.py``
DIR... prints the table), add a ``Variant`` (or extend a range) where the repair still holds, and run
the tests named. Exits 0; 1 for a path that holds no torchmetrics.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import textwrap
import zipfile
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
WIDTH = 120  #: the text's lines fit this many columns
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

from fingerprints import _release, _source  # noqa: E402
from matrix import EVERY_RELEASE, patch_tests  # noqa: E402

from tmpatch import patches as catalogue  # noqa: E402
from tmpatch.control import gating, likeness  # noqa: E402
from tmpatch.control.report import State  # noqa: E402
from tmpatch.engine.fingerprint import source_fingerprint  # noqa: E402
from tmpatch.spec import Target, describe  # noqa: E402


def folder_of(path: str, scratch: str) -> Optional[str]:
    """The folder that holds the ``torchmetrics`` package of ``path``: a wheel (unpacked into
    ``scratch``), a source tree (``src/torchmetrics``), a release folder, or the package itself."""
    if os.path.isfile(path) and path.endswith(".whl"):
        with zipfile.ZipFile(path) as wheel:
            wheel.extractall(scratch)
        path = scratch
    path = os.path.abspath(path)
    for folder in (path, os.path.join(path, "src"), os.path.dirname(path)):
        if os.path.isfile(os.path.join(folder, catalogue.HOST, "__init__.py")):
            return folder
    return None


def _code(folder: str, module: str, qualname: str) -> Optional[str]:
    """The fingerprint of ``module.qualname`` in the release's files (None: not there)."""
    source = _source(folder, module, qualname)
    return source_fingerprint(source) if source else None


def study(folder: str, release: str) -> Dict[str, Any]:
    """Every target and relied-on function of the catalogue in the release at ``folder``: what is new,
    what each patch would do, which tests to run (the JSON of ``--json``)."""
    against, seen = likeness.wheel(release)
    codes: Dict[str, Optional[str]] = {}
    targets: Dict[str, Dict[str, Any]] = {}
    patches: Dict[str, Dict[str, str]] = {}
    touched: List[str] = []
    for name in catalogue.NAMES:
        patch = catalogue.load(name)
        settled = gating.settled(patch, release)
        looked = []
        for target in gating.here(patch, release) if settled is None else ():
            code = codes[target.path] = codes.get(target.path, _code(folder, target.module, target.qualname))
            variant = target.variant_for(code) if code is not None else None
            why = "" if variant is not None else ("not found" if code is None else
                                                  f"code not recognised, fingerprint {code}")
            looked.append((target, variant, why))
            entry = targets.setdefault(target.path, _target(target, code, against))
            entry["patches"] = sorted(set(entry.get("patches", [])) | {name}, key=catalogue.NAMES.index)
            if entry["change"] in ("new", "gone") and name not in touched:
                touched.append(name)
        needs = []
        for requirement in patch.relies_on if settled is None else ():
            if requirement.module.split(".")[0] != catalogue.HOST:
                continue  # torch's code: tools/torch_fingerprints.py; the torch at hand decides at apply()
            code = _code(folder, requirement.module, requirement.qualname)
            entry = targets.setdefault(requirement.path, {"path": requirement.path, "fingerprint": code,
                                                         "change": "known" if code in requirement.fingerprints
                                                         else ("gone" if code is None else "new")})
            entry["relied on by"] = sorted(set(entry.get("relied on by", [])) | {name}, key=catalogue.NAMES.index)
            needs.append((requirement, gating.unmet(requirement, code)))
            if entry["change"] != "known" and name not in touched:
                touched.append(name)
        looked, problem = gating.relying(patch, looked, needs)
        state, reason = settled if settled is not None else gating.judge(patch, release, looked, problem)[:2]
        patches[name] = {"state": state, "reason": reason}
    paths = patch_tests(touched) + [p for p in EVERY_RELEASE if p not in patch_tests(touched)]
    return {"release": release, "compared with": against, "seen": seen,
            "code": likeness.describe(release, codes), "targets": list(targets.values()), "patches": patches,
            "patches with changed targets": touched, "tests": paths}


def _target(target: Target, code: Optional[str], against: Optional[str]) -> Dict[str, Any]:
    """One target's entry: its fingerprint and how it compares with the wheel ``against``."""
    known, want = likeness.expected(target, against) if against is not None else (False, None)
    variant = target.variant_for(code) if code is not None else None
    if code is None:
        change = "gone" if known and want is not None else "absent"
    elif variant is None:
        change = "new"
    elif known and code != want:
        change = "other known"  # the code of other releases of the catalogue (reverted upstream, say)
    else:
        change = "known"
    entry: Dict[str, Any] = {"path": target.path, "fingerprint": code, "change": change}
    if known and want is not None and change != "known":
        entry["wheel"] = want
    if variant is not None:
        entry["as"] = describe(variant.releases) + (" (fixed upstream)" if variant.fixed else "")
    return entry


def render(found: Dict[str, Any], where: str, wheel: str = "") -> str:
    """The text of a study of the release at ``where`` (unpacked from ``wheel``, if given): changes, the
    patches by state, the tests and the commands."""
    lines = [f"torchmetrics {found['code']}", f"  in {wheel or where}; compared with the {found['compared with']} "
             "wheel" + ("" if found["seen"] else " (the newest tmpatch knows)")]
    changed = [t for t in found["targets"] if t["change"] not in ("known", "absent")]
    looked = sum(t["change"] != "absent" for t in found["targets"])
    lines.append(f"targets: {looked} looked at; " + (f"{len(changed)} changed:" if changed else "none changed"))
    for t in changed:
        users = ", ".join(t.get("patches", []) + [f"relied on by {n}" for n in t.get("relied on by", [])])
        was = f", the wheel has {t['wheel']}" if t.get("wheel") else ""
        kind = {"other known": f"as {t.get('as')}"}.get(t["change"], t["change"])
        lines.append(f"  {kind:<11} {t['path']}  {t['fingerprint'] or '-'}  ({users}{was})")
    lines.append("patches:")
    groups: Dict[str, List[str]] = {}
    for name, row in found["patches"].items():
        groups.setdefault(row["state"], []).append(name)
    for state in [s for s in State.ORDER if s in groups]:
        names = groups[state]
        if state in (State.PARTIAL, State.MISMATCH, State.FAILED):
            lines += [f"  {state} {name}: {found['patches'][name]['reason']}" for name in names]
        else:
            lines.append(f"  {state} ({len(names)}): {', '.join(names)}")
    tests = " ".join(found["tests"])
    touched = ", ".join(found["patches with changed targets"])
    lines += ["tests to run" + (f" (the patches with changed targets: {touched}, and every release's):" if touched
                                else " (every release's):"),
              *([f"  pip install --no-deps --target DIR {wheel}"] if wheel else []),
              f"  PYTHONPATH={'DIR' if wheel else where}:. python -m pytest {tests}",
              f"  or, once published: python tools/matrix.py -r {found['release']} -- {tests}"]
    if changed:
        lines += ["to add it: read each changed target's code against the wheel's (python tools/fingerprints.py "
                  "FOLDER... prints the table), add a Variant where the repair still holds, run the tests."]
    return "\n".join(wrapped for line in lines for wrapped in textwrap.wrap(
        line, WIDTH, subsequent_indent=" " * (len(line) - len(line.lstrip()) + 4), break_long_words=False,
        break_on_hyphens=False))


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", help="a wheel (.whl), a source tree, a release folder or the torchmetrics package")
    parser.add_argument("--release", help="the version to take it for (default: its __about__.py's)")
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")
    args = parser.parse_args(argv)
    scratch = tempfile.mkdtemp(prefix="tmpatch-release-")
    try:
        folder = folder_of(args.path, scratch)
        if folder is None:
            print(f"new_release: no torchmetrics package in {args.path}", file=sys.stderr)
            return 1
        found = study(folder, args.release or _release(folder))
        wheel = args.path if os.path.isfile(args.path) else ""
        print(json.dumps(found, indent=2) if args.json else render(found, folder, wheel))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
