"""pit_permutations: PermutationInvariantTraining's table of speaker permutations made on the device.

Defect: ``_gen_permutations(spk_num, device)`` (PermutationInvariantTraining, and the
functional ``permutation_invariant_training``) builds every permutation of the speakers on
the host, ``torch.tensor(list(permutations(range(spk_num))), device=device)``, and copies it
to the device: a blocking copy on the first update for each number of speakers and device
(the table is cached afterwards). Not fixed upstream (1.9.0 included).

Repair: that statement is edited (:mod:`tmpatch.engine.rewrite`; the cache around it is the
release's) to build the same int64 table on the device: the permutations of ``n``
speakers in lexicographic order (``itertools.permutations``' order) are, for each first
speaker ``j``, ``j`` followed by the permutations of ``n - 1`` speakers with every value
``>= j`` raised by one; built from ``[[0]]`` with ``repeat_interleave`` / ``repeat`` by
fixed counts, a comparison and a concatenation per speaker, nothing read or copied. The
same tensor, bit for bit. On the CPU, and for ``spk_num < 1``, the release's statement runs.

Releases: 0.10.0-1.9.0 (one implementation of ``_gen_permutations``, 1.0.0+; in 0.10-0.11 the
same statement, transposed, sits in ``_find_best_perm_by_exhaustive_method``, edited there).
"""
from __future__ import annotations

from types import ModuleType
from typing import Any, Dict

from tmpatch.runtime import host
from tmpatch.spec import PATCHED, Edit, Label, Patch, Rewrite, Target, Variant, since, span


def _names(module: ModuleType) -> Dict[str, Any]:
    import torch

    zeros, arange, cat, device_type, int64 = torch.zeros, torch.arange, torch.cat, torch.device, torch.int64

    def permutations_on(spk_num: Any, device: Any) -> Any:
        """``torch.tensor(list(itertools.permutations(range(spk_num))), device=device)`` made on the
        device, or None (the release's statement runs)."""
        where = device if type(device) is device_type else device_type(device)
        if type(spk_num) is not int or spk_num < 1 or host.host_device(where):
            return None
        table = zeros((1, 1), dtype=int64, device=where)  # the permutations of one speaker
        count = 1
        for size in range(2, spk_num + 1):
            first = arange(size, device=where).repeat_interleave(count)  # count = (size - 1)!
            rest = table.repeat(size, 1)
            rest = rest + (rest >= first.unsqueeze(1)).to(int64)
            table = cat([first.unsqueeze(1), rest], dim=1)
            count *= size
        return table

    return {"_tmpatch_permutations": permutations_on}


_TABLE = "ps = torch.tensor(list(permutations(range(spk_num))), device=device)"
TABLE = Rewrite((Edit(_TABLE, f"ps = _tmpatch_permutations(spk_num, device)\nif ps is None:\n    {_TABLE}"),), _names)
#: 0.10-0.11: the table is made (and transposed) inside ``_find_best_perm_by_exhaustive_method``
_TABLE_0 = "ps = torch.tensor(list(permutations(range(spk_num))), device=metric_mtx.device).T"
TABLE_0 = Rewrite((Edit(_TABLE_0, "ps = _tmpatch_permutations(spk_num, metric_mtx.device)\nif ps is None:\n"
                                  f"    {_TABLE_0}\nelse:\n    ps = ps.T"),), _names)

PATCH = Patch(
    name="pit_permutations",
    summary="PermutationInvariantTraining copies its table of speaker permutations to the device on the first update "
            "per speaker count and device; built on the device",
    known=since("0.10.0"),
    upstream="not fixed upstream (torch.tensor(list(permutations(...)), device=...) in _gen_permutations)",
    labels=(
        Label(PATCHED, "PIT builds its permutation table on the host and copies it (first update per speaker count "
              "and device); the pit_permutations patch builds it on the device",
              function="_gen_permutations|_find_best_perm_by_exhaustive_method", op="aten._to_copy"),
    ),
    targets=(
        Target(module="torchmetrics.functional.audio.pit", qualname="_gen_permutations", present=since("1.0.0"),
               variants=(Variant(span("1.0.0", "1.9.0"), "a92c24173512f4f1", TABLE),)),
        # there from 1.0.0 too, calling ``_gen_permutations``: a target up to 0.11.4 only
        Target(module="torchmetrics.functional.audio.pit", qualname="_find_best_perm_by_exhaustive_method",
               present=span("0.10.0", "0.11.4"), shared=True,
               variants=(Variant(span("0.10.0", "0.11.4"), "0dfe1c4cf97cb998", TABLE_0),)),
    ),
)
