"""The run-time policies as they are now: what patched code reads on every call.

``current`` maps each policy setting (``nan_check``, ``bincount``, ``checks``, ``update_count``;
the table, its defaults and its environment variables are :mod:`tmpatch.control.settings`)
to its value. The control layer fills it from the environment when it is imported and
sets it in ``apply()``; a patch only reads it, so that the next call follows a change.
"""
from __future__ import annotations

#: policy name -> its value now (a plain dict: patches read it on their hot path)
current: dict[str, str] = {}  # (no typing import: read at interpreter start-up)
