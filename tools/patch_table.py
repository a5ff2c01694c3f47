"""The patch tables of README.rst and of the docs, made from the catalogue.

Everything comes from ``tmpatch.patches.NAMES`` (the order) and each patch's ``PATCH``
(``tmpatch.patches.load(name)``): its summary, upstream status, what a user sees change,
the patches it requires, its targets and the release ranges of their implementations.

    python tools/patch_table.py            # print the README's table
    python tools/patch_table.py --check    # exit 1 when README.rst's table differs
    python tools/patch_table.py --write    # put the table into README.rst
    python tools/patch_table.py --catalogue  # print the docs' catalogue (reStructuredText)

The README's table lies between ``.. patch-table-start`` and ``.. patch-table-end``.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from typing import Any, Iterable, List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "README.rst")
START = ".. patch-table-start"
END = ".. patch-table-end"


def _patches() -> List[Any]:
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    from tmpatch.patches import NAMES, load

    return [load(name) for name in NAMES]


def _bounds(releases: Any) -> Tuple[Optional[Any], Optional[Any]]:
    """``(first, last)`` of a release range (None: open): the vocabulary's own reading."""
    from tmpatch.spec import bounds

    return bounds(releases)


def _variants(patch: Any, fixed: bool) -> Iterable[Any]:
    for target in patch.targets:
        for variant in target.variants:
            if (variant.build is None) == fixed:
                yield variant


def patched_on(patch: Any) -> str:
    """The releases whose code the patch repairs: ``1.0.0-1.8.2``, or ``1.0.0+`` (every release
    from there on that tmpatch knows)."""
    firsts, lasts, open_end = [], [], False
    for variant in _variants(patch, fixed=False):
        first, last = _bounds(variant.releases)
        if first is not None:
            firsts.append(first)
        if last is None:
            open_end = True
        else:
            lasts.append(last)
    if not firsts:
        return "none"
    start = str(min(firsts))
    if open_end or not lasts:
        return f"{start}+"
    return f"{start}-{max(lasts)}"


def fixed_from(patch: Any) -> str:
    """The first release after every patched one whose code carries the upstream fix ('' where
    none does)."""
    lasts = [_bounds(v.releases)[1] for v in _variants(patch, fixed=False)]
    if not lasts or None in lasts:
        return ""
    firsts = [_bounds(v.releases)[0] for v in _variants(patch, fixed=True)]
    later = [f for f in firsts if f is not None and f > max(lasts)]
    return str(min(later)) if later else ""


#: an upstream issue or pull request as the catalogue writes it: ``#2638``, ``PR #3284``,
#: ``torchmetrics #1780``
_UPSTREAM_REF = re.compile(r"(?:torchmetrics )?(?:PR )?#(\d+)")
UPSTREAM_URL = "https://github.com/Lightning-AI/torchmetrics/issues/"


def _one_line(text: str) -> str:
    """``text`` on one line, each upstream reference a link to its torchmetrics issue or PR."""
    flat = " ".join(text.split())
    return _UPSTREAM_REF.sub(lambda m: f"`torchmetrics#{m.group(1)} <{UPSTREAM_URL}{m.group(1)}>`__", flat)


def readme_table() -> str:
    """The README's table: one row per patch, in the catalogue's order."""
    out = [
        ".. list-table::",
        "   :header-rows: 1",
        "   :widths: 18 52 12 18",
        "",
        "   * - patch",
        "     - what it repairs",
        "     - patched on",
        "     - upstream",
    ]
    for patch in _patches():
        out += [
            f"   * - ``{patch.name}``",
            f"     - {_one_line(patch.summary)}",
            f"     - {patched_on(patch)}",
            f"     - {_one_line(patch.upstream) or 'n/a'}",
        ]
    return "\n".join(out) + "\n"


def catalogue() -> str:
    """The docs' catalogue: a section per patch with every field of its ``PATCH``."""
    out: List[str] = []
    for patch in _patches():
        out += [f"``{patch.name}``", "~" * (len(patch.name) + 4), "", _one_line(patch.summary), ""]
        fields = [("patched on", patched_on(patch))]
        fixed = fixed_from(patch)
        if fixed:
            fields.append(("fixed upstream from", fixed))
        fields.append(("upstream", _one_line(patch.upstream) or "n/a"))
        if patch.changes:
            fields.append(("what else changes", _one_line(patch.changes)))
        if patch.requires:
            fields.append(("requires", ", ".join(f"``{r}``" for r in patch.requires)))
        for label, value in fields:
            out += [f":{label}: {value}"]
        out += [":targets:", ""]
        out += [f"   - ``{t.path}``" for t in patch.targets]
        out += [""]
    return "\n".join(out)


def readme_section(text: str) -> str:
    """The table as it stands in ``text`` (README.rst), between the markers."""
    if START not in text or END not in text:
        raise ValueError(f"README.rst has no '{START}' ... '{END}' block")
    return text.split(START, 1)[1].split(END, 1)[0].strip("\n") + "\n"


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--check", action="store_true", help="exit 1 when README.rst's table is not the catalogue's")
    group.add_argument("--write", action="store_true", help="write the table into README.rst")
    group.add_argument("--catalogue", action="store_true", help="print the docs' catalogue")
    args = parser.parse_args(argv)
    if args.catalogue:
        sys.stdout.write(catalogue())
        return 0
    table = readme_table()
    if not (args.check or args.write):
        sys.stdout.write(table)
        return 0
    with open(README, encoding="utf-8") as handle:
        text = handle.read()
    if args.check:
        same = readme_section(text) == table
        if not same:
            sys.stderr.write("README.rst's patch table differs: run python tools/patch_table.py --write\n")
        return 0 if same else 1
    head, rest = text.split(START, 1)
    tail = rest.split(END, 1)[1]
    with open(README, "w", encoding="utf-8") as handle:
        handle.write(f"{head}{START}\n\n{table}\n{END}{tail}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
