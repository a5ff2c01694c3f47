"""The user's own step (``tmpatch audit --step``): its syncs at the user's lines,
unpatched and patched.

Contract: the two runs (:mod:`~tmpatch.audit.step.run`) and their text
(:mod:`~tmpatch.audit.step.text`), and the command (:mod:`~tmpatch.audit.step.cli`); built on the oracle and
the panel's labels.
"""
