"""The oracle: the host-device syncs of a call, on a real GPU or on simulated CUDA.

Contract: given a call, say where it synchronises and why (:mod:`~tmpatch.audit.oracle.api`):
simulated CUDA tensors on a CPU-only machine (:mod:`~tmpatch.audit.oracle.sim`), the ATen-level
recorder and its op table (:mod:`~tmpatch.audit.oracle.recorder`,
:mod:`~tmpatch.audit.oracle.classify`), how a simulated run goes on past a sync, backward
passes, graph breaks and both outcomes of a branch. Knows nothing of tmpatch's patches
and imports no other product of the audit.
"""
