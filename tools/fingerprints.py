"""Print the fingerprint of each patch target in every torchmetrics release.

Maintainers' tool: ``python tools/fingerprints.py DIR...`` where each DIR holds
one release (``pip install --no-deps --target DIR torchmetrics==X``). Releases
with the same code are grouped, so the variant table of a patch can be checked
or extended by eye. Reads the files; imports nothing of torchmetrics.
"""
from __future__ import annotations

import ast
import os
import sys
from collections import OrderedDict
from typing import Any, Dict, List, Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tmpatch import patches as catalogue  # noqa: E402
from tmpatch.engine.fingerprint import source_fingerprint  # noqa: E402
from tmpatch.spec import describe  # noqa: E402


def _release(folder: str) -> str:
    about = os.path.join(folder, "torchmetrics", "__about__.py")
    for line in open(about, encoding="utf-8"):
        if line.startswith("__version__"):
            return line.split("=", 1)[1].strip().strip("\"'")
    return os.path.basename(folder)


def _label(folder: str) -> str:
    """The release of ``folder`` as ``__about__`` names it, with the folder's name where that differs
    (a git checkout, a relabelled wheel: two folders reading "1.9.0" are told apart)."""
    release, name = _release(folder), os.path.basename(os.path.normpath(folder))
    return release if name == release else f"{release} [{name}]"


def _missing(target: Any, releases: List[str]) -> str:
    """What a group of releases without the target's code means: absent by design where the target's
    ``present`` leaves those releases out, else code that could not be found (UNKNOWN)."""
    present = target.present
    if present is not None and not any(present.contains(release) for release in releases):
        return f"absent there, as expected (the target is in {describe(present)})"
    return "UNKNOWN (not found)"


def _source(folder: str, module: str, qualname: str) -> Optional[str]:
    path = os.path.join(folder, *module.split(".")) + ".py"
    if not os.path.exists(path):
        path = os.path.join(folder, *module.split("."), "__init__.py")
    if not os.path.exists(path):
        return None
    text = open(path, encoding="utf-8").read()
    body: List[ast.stmt] = ast.parse(text).body
    node: Optional[ast.AST] = None
    for part in qualname.split("."):
        node = next((n for n in body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == part), None)
        if node is None:
            return None
        body = node.body  # type: ignore[attr-defined]
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])  # as inspect does
    return "\n".join(text.splitlines()[first - 1 : node.end_lineno]) + "\n"


def main(folders: List[str]) -> int:
    folders = sorted(folders, key=lambda f: [int(p) if p.isdigit() else -1
                                             for p in _release(f).replace("post", "").split(".")])
    for name in catalogue.NAMES:
        patch = catalogue.load(name)
        for target in patch.targets:
            groups: Dict[str, List[str]] = OrderedDict()  # code -> the folders holding it
            for folder in folders:
                src = _source(folder, target.module, target.qualname)
                groups.setdefault(source_fingerprint(src) if src else "missing", []).append(folder)
            sys.stdout.write(f"{name}: {target.path}\n")
            for code, held in groups.items():
                variant = target.variant_for(code)
                if code == "missing":
                    known = _missing(target, [_release(folder) for folder in held])
                else:
                    known = (("fixed" if variant.fixed else "patched") + f" as {describe(variant.releases)}"
                             if variant else "UNKNOWN")
                sys.stdout.write(f"  {code}  {_label(held[0])} .. {_label(held[-1])} ({len(held)})  {known}\n")
        for requirement in patch.relies_on:  # the release's code it relies on (torch's: tools/torch_fingerprints.py)
            if requirement.module.split(".")[0] != catalogue.HOST:
                continue
            groups = OrderedDict()
            for folder in folders:
                src = _source(folder, requirement.module, requirement.qualname)
                groups.setdefault(source_fingerprint(src) if src else "missing", []).append(_label(folder))
            sys.stdout.write(f"{name}: relies on {requirement.path}\n")
            for code, releases in groups.items():
                known = "known" if code in requirement.fingerprints else "UNKNOWN"
                sys.stdout.write(f"  {code}  {releases[0]} .. {releases[-1]} ({len(releases)})  {known}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
