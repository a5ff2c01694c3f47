"""Print the fingerprints of the torch code that patches rely on (``Patch.relies_on``), per torch release.

Maintainers' tool: ``python tools/torch_fingerprints.py 2.1.2 2.8.0 ...`` reads the few source
files it needs out of each release's Linux x86_64 CPython 3.11 wheel on pip's package index with HTTP range
requests (the zip's directory, then those files: a few MB, not the wheel), fingerprints each
required function and marks the fingerprints a patch does not know yet with ``NEW``. Before a
new fingerprint is added to a ``Requirement``, read the function's change: the repair must stand
for what the new code does. Imports nothing of torch.
"""
from __future__ import annotations

import ast
import os
import re
import struct
import sys
import urllib.parse
import urllib.request
import zlib
from typing import Any, Dict, List, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tmpatch import patches as catalogue  # noqa: E402
from tmpatch.engine.fingerprint import source_fingerprint  # noqa: E402


def _index_url() -> str:
    """torch's page on the package index pip is configured with (``PIP_INDEX_URL``, else pip's
    configuration), PyPI where neither names one."""
    url = os.environ.get("PIP_INDEX_URL", "")
    if not url:
        try:
            import subprocess

            url = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.index-url"],
                                 capture_output=True, text=True, timeout=60).stdout.strip()
        except Exception:  # noqa: BLE001 - no pip configuration: the default index
            url = ""
    return (url or "https://pypi.org/simple").rstrip("/") + "/torch/"


INDEX = _index_url()


def _get(url: str, first: Optional[int] = None, last: Optional[int] = None, method: str = "GET") -> Tuple[bytes, Any]:
    request = urllib.request.Request(url, method=method)
    if first is not None:
        request.add_header("Range", f"bytes={first}-{last}")
    with urllib.request.urlopen(request, timeout=120) as response:  # noqa: S310 - the package index only
        return response.read(), response.headers  # case-insensitive names


def _wheel(index: str, version: str) -> Tuple[str, int]:
    for href in re.findall(r'href="([^"#]+)', index):
        name = href.rsplit("/", 1)[-1]
        if name.startswith(f"torch-{version}-cp311-cp311-") and "linux" in name and "x86_64" in name:
            url = urllib.parse.urljoin(INDEX, href)  # an index may give links relative to its page
            return url, int(_get(url, method="HEAD")[1]["Content-Length"])
    raise SystemExit(f"no Linux x86_64 cp311 wheel of torch {version} on {INDEX}")


def _directory(url: str, size: int) -> Dict[str, Tuple[int, int, int]]:
    """name -> (compression method, compressed size, local header offset), zip64 included."""
    tail = _get(url, max(0, size - 65558), size - 1)[0]
    end = tail.rfind(b"PK\x05\x06")
    length, offset = struct.unpack("<II", tail[end + 12:end + 20])
    if offset == 0xFFFFFFFF:
        end64 = tail.rfind(b"PK\x06\x06")
        length, offset = struct.unpack("<QQ", tail[end64 + 40:end64 + 56])
    data, at, found = _get(url, offset, offset + length - 1)[0], 0, {}
    while data[at:at + 4] == b"PK\x01\x02":
        method = struct.unpack("<H", data[at + 10:at + 12])[0]
        packed, unpacked = struct.unpack("<II", data[at + 20:at + 28])
        name_len, extra_len, comment_len = struct.unpack("<HHH", data[at + 28:at + 34])
        local = struct.unpack("<I", data[at + 42:at + 46])[0]
        extra = data[at + 46 + name_len:at + 46 + name_len + extra_len]
        pos = 0
        while pos + 4 <= len(extra):  # zip64 sizes and offset, in this order, for the fields at their maximum
            kind, field_len = struct.unpack("<HH", extra[pos:pos + 4])
            if kind == 1:
                values, cursor = extra[pos + 4:pos + 4 + field_len], 0
                for wanted in ("unpacked", "packed", "local"):
                    if {"unpacked": unpacked, "packed": packed, "local": local}[wanted] == 0xFFFFFFFF:
                        value = struct.unpack("<Q", values[cursor:cursor + 8])[0]
                        cursor += 8
                        unpacked, packed, local = ((value, packed, local) if wanted == "unpacked" else
                                                   (unpacked, value, local) if wanted == "packed" else
                                                   (unpacked, packed, value))
            pos += 4 + field_len
        found[data[at + 46:at + 46 + name_len].decode()] = (method, packed, local)
        at += 46 + name_len + extra_len + comment_len
    return found


def _read(url: str, entry: Tuple[int, int, int]) -> str:
    method, packed, local = entry
    header = _get(url, local, local + 29)[0]
    start = local + 30 + sum(struct.unpack("<HH", header[26:30]))
    raw = _get(url, start, start + packed - 1)[0]
    return (zlib.decompress(raw, -15) if method == 8 else raw).decode("utf-8")


def _function(source: str, qualname: str) -> Optional[str]:
    """The source of ``qualname`` (``Class.method`` or ``function``) in a module's source."""
    lines, scope = source.splitlines(True), ast.parse(source).body
    *owners, name = qualname.split(".")
    for owner in owners:
        scope = next((n.body for n in scope if isinstance(n, ast.ClassDef) and n.name == owner), [])
    for node in scope:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            first = node.decorator_list[0].lineno if node.decorator_list else node.lineno
            return "".join(lines[first - 1:node.end_lineno])
    return None


def main(versions: List[str]) -> int:
    if not versions:
        print(__doc__)
        return 2
    needs = [(name, r) for name in catalogue.NAMES for r in catalogue.load(name).relies_on
             if r.module.split(".")[0] == "torch"]  # torchmetrics' own code: tools/fingerprints.py
    index = _get(INDEX)[0].decode()
    for version in versions:
        url, size = _wheel(index, version)
        directory, files = _directory(url, size), {}
        print(f"torch {version}")
        for name, requirement in needs:
            path = requirement.module.replace(".", "/")
            path = next((p for p in (path + ".py", path + "/__init__.py") if p in directory), None)
            if path is not None and path not in files:
                files[path] = _read(url, directory[path])
            source = _function(files[path], requirement.qualname) if path is not None else None
            code = source_fingerprint(source) if source is not None else None
            known = "" if code in requirement.fingerprints else "  NEW"
            print(f"  {name:20s} {requirement.path:60s} {code or 'absent'}{known}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
