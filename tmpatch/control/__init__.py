"""The control layer: what the user calls and all process state.

Contract: it decides which patch applies (release range and fingerprints:
:mod:`~tmpatch.control.gating`), applies and reverts them through the engine
(:mod:`~tmpatch.control.api`), reports (:mod:`~tmpatch.control.report`; how far the
release's code is a known one: :mod:`~tmpatch.control.likeness`), reads the
settings and the environment (:mod:`~tmpatch.control.settings`,
:mod:`~tmpatch.control.env`, :mod:`~tmpatch.control.selection`) and holds the
process state in one place (:mod:`~tmpatch.control.session`). Patches never import
it. Importing the package itself imports nothing (the start-up bootstrap reads the
settings).
"""
