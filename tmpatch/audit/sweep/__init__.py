"""The library sweep (``tmpatch audit --all``): every concrete Metric class of the
installed torchmetrics, audited unpatched and patched.

Contract: constructor arguments and inputs (:mod:`~tmpatch.audit.sweep.args`), the run
(:mod:`~tmpatch.audit.sweep.run`) and its results (:mod:`~tmpatch.audit.sweep.results`);
built on the oracle and the panel's labels.
"""
