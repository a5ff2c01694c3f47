"""``.. patch-catalogue::``: a section per patch, made from the catalogue (``tools/patch_table.py``)."""
from __future__ import annotations

import os
import sys
from typing import Any, Dict, List

from docutils.statemachine import StringList
from sphinx.util.docutils import SphinxDirective

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class PatchCatalogue(SphinxDirective):
    """Inserts the text of ``patch_table.catalogue()`` where the directive stands."""

    has_content = False

    def run(self) -> List[Any]:
        if os.path.join(ROOT, "tools") not in sys.path:
            sys.path.insert(0, os.path.join(ROOT, "tools"))
        import patch_table

        source = os.path.join(ROOT, "tools", "patch_table.py")
        self.env.note_dependency(source)
        lines = patch_table.catalogue().splitlines()
        self.state_machine.insert_input(StringList(lines, source), source)
        return []


def setup(app: Any) -> Dict[str, Any]:
    app.add_directive("patch-catalogue", PatchCatalogue)
    return {"version": "1", "parallel_read_safe": True, "parallel_write_safe": True}
