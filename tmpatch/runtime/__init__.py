"""What patched code needs while it runs.

Contract: the support that a patch's replacement calls on the metric's hot path, and
nothing that decides whether a patch applies: reports moved from ``update()`` to
``compute()`` (:mod:`~tmpatch.runtime.deferred`), torch.compile support
(:mod:`~tmpatch.runtime.compiled`), tensors made on the device without a host copy
(:mod:`~tmpatch.runtime.device_tensors`) and the live policies
(:mod:`~tmpatch.runtime.policies`). It imports only :mod:`tmpatch.spec`; importing the
package itself imports nothing (the start-up bootstrap reads the policies).
"""
