"""wrapper_indices: the indices MultioutputWrapper and BootStrapper select with, without a blocking copy.

Defect: on every ``update()`` (and ``forward()``):

* ``MultioutputWrapper._get_args_kwargs_by_output`` selects each output's column with
  ``index=torch.tensor(i, device=self.device)``: a host-to-device copy per output, twice
  (positional and keyword arguments);
* ``BootStrapper.update`` draws each bootstrap's sample indices on the host (torch's CPU
  generator: Poisson counts or a multinomial draw) and copies them with
  ``.to(self.device)``: a blocking copy per bootstrap, which waits for the device to finish
  the work queued before it.

Not fixed upstream (1.9.0 included).

Repair (edits of one statement each, :mod:`tmpatch.engine.rewrite`):

* MultioutputWrapper: the index is made on the device with ``torch.full`` (the same int64
  0-d tensor), no copy;
* BootStrapper: the indices are still drawn on the host, by the release's sampler, from the
  same generator, so the samples and results are the release's, bit for bit (and
  ``torch.manual_seed`` reproduces them as before). They are copied from pinned (page-locked)
  memory with ``non_blocking=True``: the copy is queued on the current stream and the host goes
  on without waiting for the device (torch keeps the pinned buffer alive until the copy is
  done). Drawing on the device instead would change the random numbers, and the default
  Poisson strategy makes a batch of random length, which the host must know to size it, so it
  would still need a read. Where memory cannot be pinned, the copy is made non-blocking from
  pageable memory; off CUDA the release's ``.to(device)`` runs.

``remove_nans=True`` (MultioutputWrapper's default) removes the rows holding a NaN with a
boolean index before the base metric's update: a data-dependent size the base metric sees;
that one stays (``remove_nans=False`` has none).

Releases: 0.10.0-1.9.0 (three implementations of ``_get_args_kwargs_by_output``, four of
``BootStrapper.update``, all with the same statement).
"""
from __future__ import annotations

from types import ModuleType
from typing import Any, Dict

from tmpatch.runtime.device_tensors import built, swap
from tmpatch.spec import INHERENT, PATCHED, Edit, Label, Patch, Rewrite, Target, Variant, since, span


def _copy_names(module: ModuleType) -> Dict[str, Any]:
    import torch

    device_type = torch.device

    def to_device(indices: Any, device: Any) -> Any:
        """``indices.to(device)`` for host-drawn indices: from pinned memory, non-blocking, on CUDA."""
        where = device if type(device) is device_type else device_type(device)
        if where.type != "cuda" or indices.device.type != "cpu":
            return indices.to(device)
        try:
            indices = indices.pin_memory()
        except Exception:  # noqa: BLE001 - no pinned memory to be had (or simulated CUDA without it): pageable
            pass
        return indices.to(device, non_blocking=True)

    return {"_tmpatch_to_device": to_device}


_SAMPLE = "sample_idx = _bootstrap_sampler(size, sampling_strategy=self.sampling_strategy).to(self.device)"
BOOTSTRAP = Rewrite((Edit(_SAMPLE, "sample_idx = _tmpatch_to_device(_bootstrap_sampler(size, "
                                   "sampling_strategy=self.sampling_strategy), self.device)"),), _copy_names)

_SELECT = """\
selected_{0} = apply_to_collection(
    {0}, Tensor, torch.index_select, dim=self.output_dim, index=torch.tensor(i, device=self.device)
)"""
MULTIOUTPUT = Rewrite(tuple(Edit(_SELECT.format(name), swap(_SELECT.format(name))) for name in ("args", "kwargs")),
                      lambda module: {"_tmpatch_tensor": built()[0]})

_WRAPPERS = "torchmetrics.wrappers"

PATCH = Patch(
    name="wrapper_indices",
    summary="MultioutputWrapper copies each output's index to the device, BootStrapper its host-drawn sample "
            "indices with a blocking copy, on each update(); made with torch.full / copied from pinned memory",
    known=since("0.10.0"),
    upstream="not fixed upstream (torch.tensor(i, device=...) in MultioutputWrapper, .to(device) in BootStrapper)",
    labels=(
        Label(PATCHED, "MultioutputWrapper makes each output's index with torch.tensor(i, device=...) (a copy); "
              "the wrapper_indices patch makes it with torch.full",
              function="_get_args_kwargs_by_output", op="aten._to_copy"),
        Label(PATCHED, "BootStrapper copies its host-drawn sample indices with a blocking copy; the wrapper_indices "
              "patch copies them from pinned memory without blocking",
              function="update", file="torchmetrics/wrappers/bootstrapping.py", op="aten._to_copy"),
        Label(INHERENT, "MultioutputWrapper(remove_nans=True) removes rows holding a NaN with a boolean index: the "
              "base metric's update sees the rows kept (remove_nans=False has no such step)",
              file="torchmetrics/wrappers/multioutput.py", op="aten.index", patch="wrapper_indices"),
    ),
    targets=(
        Target(module=f"{_WRAPPERS}.multioutput", qualname="MultioutputWrapper._get_args_kwargs_by_output", variants=(
            Variant(span("0.10.0", "0.11.4"), "972a04394abad2a1", MULTIOUTPUT),  # keyword arguments not squeezed
            Variant(span("1.0.0", "1.5.2"), "a93453bc13145ac4", MULTIOUTPUT),
            Variant(span("1.6.0", "1.9.0"), "b847eeaa00f31a34", MULTIOUTPUT),  # annotation only
        )),
        Target(module=f"{_WRAPPERS}.bootstrapping", qualname="BootStrapper.update", variants=(
            Variant(span("0.10.0", "1.1.1"), "c7bb6811d0b1e38a", BOOTSTRAP),
            Variant(span("1.1.2", "1.3.2"), "7a3e958ac13123f9", BOOTSTRAP),  # sizes read once; empty samples skipped
            Variant(span("1.4.0", "1.6.1"), "d6427c7fba6f097f", BOOTSTRAP),  # keyword sizes from a dict
            Variant(span("1.6.2", "1.9.0"), "3e24f9c9af37fdea", BOOTSTRAP),  # annotations only
        )),
    ),
)
