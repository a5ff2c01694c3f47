"""The calibration of the simulated audit on a real GPU
(``python -m tmpatch.audit.calibrate``, ``tmpatch audit --calibrate``).

Contract: the cases (:mod:`~tmpatch.audit.calibrate.cases`: probes, panel rows, sweeps), the
probe table and its functions (:mod:`~tmpatch.audit.calibrate.probes`,
:mod:`~tmpatch.audit.calibrate.probe_fns`), the comparison and report
(:mod:`~tmpatch.audit.calibrate.run`) and the command line
(:mod:`~tmpatch.audit.calibrate.cli`); built on the oracle and the panel.
"""
