"""The built-in panel: sync points of common metric calls, unpatched and patched
(``tmpatch audit``).

Contract: the rows (:mod:`~tmpatch.audit.panel.rows`), their runs on both sides
(:mod:`~tmpatch.audit.panel.run`) and the table's text (:mod:`~tmpatch.audit.panel.text`);
built on the oracle.
"""
