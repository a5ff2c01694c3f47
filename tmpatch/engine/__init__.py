"""The engine: puts wrappers and edited functions in place of a program's functions,
and takes them out again.

Contract: it knows wrapt and Python, nothing of torch or torchmetrics. It resolves a
target (:mod:`~tmpatch.engine.references`), builds its layer (:mod:`~tmpatch.engine.layers`),
installs and reverts it with every reference that bound it, and sets and puts back a
patch's settings (attributes holding a value) (:mod:`~tmpatch.engine.core`),
edits a function's own code statement by statement (:mod:`~tmpatch.engine.rewrite`),
fingerprints code (:mod:`~tmpatch.engine.fingerprint`) and keeps both on disk
(:mod:`~tmpatch.engine.cache`). It imports only :mod:`tmpatch.spec`, the vocabulary.
"""
