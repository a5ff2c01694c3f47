"""image_constants: the image metrics' counts, constants and index lists made on the device in update().

Defect: on every ``update()`` several image metrics build host values and copy them to
the device, or read a device value to choose a constant:

* ``_psnr_update`` (PeakSignalNoiseRatio), ``_psnrb_update`` (PeakSignalNoiseRatioWithBlockedEffect):
  the observation count, ``tensor(target.numel(), device=...)``; with ``dim``, the
  count is ``tensor(target.size(), device=...)[dim_list].prod()`` (the sizes and the
  index list both copied);
* ``_compute_bef`` (PSNRB): four index lists built on the host (``torch.tensor(range(...))``)
  index the device image (each copied), and ``t = ... if d_b > d_bc else 0`` reads the device;
* ``PeakSignalNoiseRatio.update`` of 0.10-0.11 with ``data_range=None``: ``min(target.min(),
  self.min_target)`` and the ``max`` likewise, Python's comparison of two device values (a read
  each): chosen with ``torch.where``, the same choice (1.0.0 uses ``torch.minimum``/``maximum``);
* ``_ssim_update`` with ``gaussian_kernel=False`` (StructuralSimilarityIndexMeasure, MS-SSIM):
  ``torch.tensor(kernel_size, ...)`` for the uniform kernel's size; with ``data_range=None``
  (the default) ``max(preds.max() - preds.min(), target.max() - target.min())`` compares two
  device values in Python (a read): it becomes ``torch.where``, the same choice;
* ``_multiscale_ssim_update`` and, from 1.6.2, ``MultiScaleStructuralSimilarityIndexMeasure.update``:
  ``torch.tensor(betas, device=...)`` and ``torch.tensor(preds.shape[0], ...)``;
* ``_vif_per_channel`` (VisualInformationFidelity): ``torch.tensor(1e-10, ...)`` and
  ``torch.tensor(sigma_n_sq, ...)``;
* ``_scc_update`` (SpatialCorrelationCoefficient): the metric's high-pass filter, a CPU
  tensor, copied with ``.to(device)``;
* ``_single_dimension_pad`` (RootMeanSquaredErrorUsingSlidingWindow, RelativeAverageSpectralError):
  ``torch.arange(...).to(device)``, two per call.

In ``compute()`` (so in ``forward()``): ``relative_average_spectral_error`` (RASE) copies its
initial count, ``torch.tensor(0.0, device=...)``, and ``_psnrb_compute`` before 1.8.0 reads
``if data_range > 2``; both are repaired the same way (the ``if`` becomes a ``torch.where``
between the release's two results where they share a dtype).

Not fixed upstream (1.9.0 included).

Repair: the statements are edited (:mod:`tmpatch.engine.rewrite`; the rest is the release's
code): numbers and short lists go through
:func:`tmpatch.runtime.device_tensors.device_tensor` (``torch.full``, one fill per
element, ``torch.tensor``'s dtype), the filter through ``to_device`` (converted on the
host, filled on the device), the ranges become ``torch.arange(..., device=...)``, the
size product is computed on the host from the shape, PSNRB's index lists are built with
``torch.arange`` on the device (the complement list in ascending order, which is the
order the release's set gives: checked once per image width and block size against the
release's own expression) and its ``if`` becomes a ``torch.where`` between the release's two
results, ``t * (d_b - d_bc)`` and ``0 * (d_b - d_bc)``. Results are the release's bit for
bit. On the CPU, and where a value is out of the helpers' reach (a long list, NaN in the
filter, an empty index list, an image side of 1), the release's own expressions run.

Releases: 0.10.0-1.9.0; PSNRB and RASE from 1.0.0, VIF from 1.1.0, SCC from 1.3.0.post0;
``_single_dimension_pad`` moved from ``functional.image.helper`` to ``functional.image.utils``
in 1.3.2 (0.10-0.11 make its ranges on the device: nothing to repair there).
"""
from __future__ import annotations

import functools
import math
import textwrap
from types import ModuleType
from typing import Any, Dict, Tuple

from tmpatch.runtime import host
from tmpatch.runtime.device_tensors import built, swap
from tmpatch.spec import PATCHED, Edit, Label, Patch, Rewrite, Target, Variant, since, span


@functools.lru_cache(maxsize=64)
def _complement_is_ascending(length: int, block_size: int) -> bool:
    """Whether the release's ``list(set(range(length)).symmetric_difference(range(b - 1, length, b)))``
    is ``j + j // (b - 1)`` for ``j = 0, 1, ...`` (the values not on a block edge, ascending)."""
    kept = list(set(range(length)).symmetric_difference(range(block_size - 1, length, block_size)))
    return kept == [j + j // (block_size - 1) for j in range(len(kept))]


def _on_device(t: Any) -> bool:
    """Whether the edited statements take the device path for tensor ``t`` (on the CPU the
    release's own statements run, unless the tests turn the CPU shortcut off)."""
    return not host.on_host(t)


def _names(module: ModuleType) -> Dict[str, Any]:
    import torch

    arange, full, where, int64 = torch.arange, torch.full, torch.where, torch.int64

    def size_product(target: Any, dims: Any) -> Any:
        """``tensor(target.size())[dims].prod()`` on the device (``dims`` were checked by the release's sum)."""
        sizes, count = target.size(), 1
        for dim in dims:
            count *= sizes[dim]
        return full((), count, dtype=int64, device=target.device)

    def edges(length: int, block_size: int, device: Any) -> Any:
        """The release's two index lists for one image side, on ``device``; None where they
        cannot be made so (an empty list is a float tensor in the release)."""
        on = len(range(block_size - 1, length, block_size))
        if on == 0 or length - on == 0 or not _complement_is_ascending(length, block_size):
            return None
        position = arange(length - on, device=device)
        return arange(block_size - 1, length, block_size, device=device), position + position // (block_size - 1)

    def bef_indices(x: Any, width: int, height: int, block_size: Any) -> Any:
        """``(h_b, h_bc, v_b, v_bc)`` of ``_compute_bef`` on ``x``'s device, or None (the release's lists)."""
        if not _on_device(x) or type(block_size) is not int or block_size < 2:
            return None
        across, down = edges(width - 1, block_size, x.device), edges(height - 1, block_size, x.device)
        return None if across is None or down is None else across + down

    def bef_on_device(d_b: Any, block_size: Any, height: int, width: int) -> bool:
        """Whether ``t`` can be computed before the comparison (the release's ``log2`` cannot fail)."""
        return _on_device(d_b) and type(block_size) is int and block_size >= 1 and min(height, width) > 1

    def bef(d_b: Any, d_bc: Any, block_size: int, height: int, width: int) -> Any:
        """The release's ``t * (d_b - d_bc)``, ``t`` chosen on the device."""
        t = math.log2(block_size) / math.log2(min(height, width))
        return where(d_b > d_bc, t * (d_b - d_bc), 0 * (d_b - d_bc))

    def select(condition: Any, chosen: Any, other: Any) -> Any:
        """``chosen if condition else other``, chosen on the device when both have one dtype and shape."""
        if chosen.dtype == other.dtype and chosen.shape == other.shape:
            return where(condition, chosen, other)
        return chosen if condition else other  # the result's dtype depends on the value: the release's read

    device_tensor, to_device = built()
    return {"_tmpatch_tensor": device_tensor, "_tmpatch_select": select, "_tmpatch_to_device": to_device,
            "_tmpatch_on_device": _on_device, "_tmpatch_size_product": size_product,
            "_tmpatch_bef_indices": bef_indices,
            "_tmpatch_bef_on_device": bef_on_device, "_tmpatch_bef": bef}


def _unless(condition: str, new: str, find: str) -> Edit:
    """``find`` (the release's statements) run only when ``condition`` is false; ``new`` otherwise."""
    return Edit(find, f"if {condition}:\n{textwrap.indent(new, '    ')}\nelse:\n{textwrap.indent(find, '    ')}")


def _swapped(*statements: str, extra: Tuple[Edit, ...] = ()) -> Rewrite:
    return Rewrite(tuple(Edit(s, swap(s)) for s in statements) + extra, _names)


def _psnr(name: str) -> Rewrite:
    numel = f"{name} = tensor(target.numel(), device=target.device)"
    sizes = f"{name} = tensor(target.size(), device=target.device)[dim_list].prod()"
    return Rewrite((
        Edit(f"{numel}\nreturn sum_squared_error, {name}", f"{swap(numel)}\nreturn sum_squared_error, {name}"),
        Edit(numel, swap(numel)),  # the other one, in ``if not dim_list``
        _unless("_tmpatch_on_device(target)", f"{name} = _tmpatch_size_product(target, dim_list)", sizes),
    ), _names)


_LISTS = """\
h = torch.arange(width - 1)
h_b = torch.tensor(range(block_size - 1, width - 1, block_size))
h_bc = torch.tensor(list(set(h.tolist()).symmetric_difference(h_b.tolist())))
v = torch.arange(height - 1)
v_b = torch.tensor(range(block_size - 1, height - 1, block_size))
v_bc = torch.tensor(list(set(v.tolist()).symmetric_difference(v_b.tolist())))"""
_CHOICE = """\
t = math.log2(block_size) / math.log2(min(height, width)) if d_b > d_bc else 0
return t * (d_b - d_bc)"""
BEF = Rewrite((
    Edit(_LISTS, "_tmpatch_lists = _tmpatch_bef_indices(x, width, height, block_size)\n"
                 "if _tmpatch_lists is not None:\n    h_b, h_bc, v_b, v_bc = _tmpatch_lists\n"
                 f"else:\n{textwrap.indent(_LISTS, '    ')}"),
    Edit(_CHOICE, "if _tmpatch_bef_on_device(d_b, block_size, height, width):\n"
                  f"    return _tmpatch_bef(d_b, d_bc, block_size, height, width)\n{_CHOICE}"),
), _names)

_RANGE = """\
if data_range > 2:
    return 10 * torch.log10(data_range**2 / sum_squared_error)
return 10 * torch.log10(1.0 / sum_squared_error)"""
PSNRB_COMPUTE = Rewrite((Edit(_RANGE, "if _tmpatch_on_device(sum_squared_error):\n"
                                      "    return _tmpatch_select(data_range > 2, 10 * torch.log10(data_range**2 / "
                                      "sum_squared_error), 10 * torch.log10(1.0 / sum_squared_error))\n" + _RANGE),),
                        _names)
RASE = _swapped("total_images = torch.tensor(0.0, device=target.device)")

_PAD = ("x = torch.index_select(inputs, dim, torch.arange(pad - 1, -1, -1{}))\n"
        "y = torch.index_select(inputs, dim, torch.arange(_max - 1, _max - pad - outer_pad, -1{}))")
PAD = Rewrite((Edit(_PAD.format(").to(inputs.device", ").to(inputs.device"),
                    _PAD.format(", device=inputs.device", ", device=inputs.device")),), _names)
SCC = Rewrite((Edit("hp_filter = hp_filter[None, None, :].to(dtype=preds.dtype, device=preds.device)",
                    "hp_filter = _tmpatch_to_device(hp_filter[None, None, :], preds.dtype, preds.device)"),), _names)
_DATA_RANGE = "data_range = max(preds.max() - preds.min(), target.max() - target.min())"
SSIM = _swapped("kernel = torch.ones((channel, 1, *kernel_size), dtype=dtype, device=device) / torch.prod(\n"
                "    torch.tensor(kernel_size, dtype=dtype, device=device)\n)",
                # ``max(a, b)`` is ``b if b > a else a``: a read of the device; the same choice by torch.where
                extra=(_unless("_tmpatch_on_device(preds)", "data_range = _tmpatch_select(\n"
                               "    target.max() - target.min() > preds.max() - preds.min(),\n"
                               "    target.max() - target.min(), preds.max() - preds.min())", _DATA_RANGE),))
MS_SSIM = _swapped("betas = torch.tensor(betas, device=mcs_stack.device).view(-1, 1)")
#: 0.10-0.11: PSNR with ``data_range=None`` keeps the target's range with Python's ``min``/``max`` of two
#: device values (a read each; 1.0.0 uses torch.minimum/maximum). ``min(a, b)`` is ``b if b < a else a``
PSNR_RANGE = Rewrite(tuple(
    _unless("_tmpatch_on_device(target)",
            f"_tmpatch_found = target.{fn}()\n"
            f"self.{fn}_target = _tmpatch_select(self.{fn}_target {op} _tmpatch_found, self.{fn}_target, "
            "_tmpatch_found)",
            f"self.{fn}_target = {fn}(target.{fn}(), self.{fn}_target)")
    for fn, op in (("min", "<"), ("max", ">"))), _names)
MS_SSIM_TOTAL = _swapped(
    "self.total += torch.tensor(preds.shape[0], dtype=self.total.dtype, device=self.total.device)")
VIF = _swapped("eps = torch.tensor(1e-10, dtype=dtype, device=device)",
                 "sigma_n_sq = torch.tensor(sigma_n_sq, dtype=dtype, device=device)")

_IMG = "torchmetrics.functional.image"
#: PSNRB and RASE came in 1.0.0
_SINCE_1_0 = since("1.0.0")


def _variants(rewrite: Any, *found: Tuple[Any, str]) -> Tuple[Variant, ...]:
    return tuple(Variant(releases, fingerprint, rewrite) for releases, fingerprint in found)


PATCH = Patch(
    name="image_constants",
    summary="PSNR, PSNRB, SSIM, MS-SSIM, VIF, SCC and the sliding-window metrics copy counts, constants and index "
            "lists "
            "to the device on each update() (PSNRB also reads one value); made on the device",
    known=since("0.10.0"),
    upstream="not fixed upstream (torch.tensor(..., device=...), .to(device) of host tensors in the image updates)",
    labels=(
        Label(PATCHED, "an image metric copies a count, a constant or an index list to the device; the "
              "image_constants patch makes them on the device",
              function=r"_psnrb?_update|_compute_bef|_ssim_update|_multiscale_ssim_update|_vif_per_channel|_scc_update"
                       r"|_single_dimension_pad|relative_average_spectral_error", kind="host-to-device copy"),
        Label(PATCHED, "PSNRB reads d_b > d_bc (block effect) and, before 1.8.0, data_range > 2 (compute); the "
              "image_constants patch chooses with torch.where", function=r"_compute_bef|_psnrb_compute",
              op="aten._local_scalar_dense"),
        Label(PATCHED, "PSNR (0.10-0.11, data_range=None) keeps the target's range with Python's min/max of device "
              "values; the image_constants patch chooses with torch.where", function="update",
              file="torchmetrics/image/psnr.py", op="aten._local_scalar_dense"),
        Label(PATCHED, "SSIM with data_range=None compares the two ranges in Python (max of two device values); the "
              "image_constants patch chooses with torch.where", function="_ssim_update", op="aten._local_scalar_dense"),
        Label(PATCHED, "MS-SSIM (1.6.2+) copies the batch size to the device; the image_constants patch fills it",
              function="update", file="torchmetrics/image/ssim.py", op="aten._to_copy"),
    ),
    targets=(
        Target(module=f"{_IMG}.psnr", qualname="_psnr_update", variants=(
            Variant(span("0.10.0", "0.11.4"), "c528d73c09564465", _psnr("n_obs")),  # ``dim_list`` by if/else
            Variant(span("1.0.0", "1.1.2"), "40ae5371907a0d5c", _psnr("n_obs")),
            Variant(span("1.2.0", "1.4.3"), "2be8fc903e42af12", _psnr("num_obs")),
            Variant(span("1.5.0", "1.5.2"), "cc1d0738920fa2f7", _psnr("num_obs")),  # integer inputs made float
            Variant(span("1.6.0", "1.9.0"), "c89d120d702bb253", _psnr("num_obs")),  # annotation only
        )),
        Target(module=f"{_IMG}.psnrb", qualname="_psnrb_update", present=_SINCE_1_0, variants=(
            Variant(span("1.0.0", "1.1.2"), "0a8d36553efa9a83",
                    _swapped("n_obs = tensor(target.numel(), device=target.device)")),
            *_variants(_swapped("num_obs = tensor(target.numel(), device=target.device)"),
                       (span("1.2.0", "1.5.2"), "ed5a0c079f5513f3"), (span("1.6.0", "1.9.0"), "90a6ba363631b7ac")),
        )),
        Target(module=f"{_IMG}.psnrb", qualname="_compute_bef", present=_SINCE_1_0,
               variants=(Variant(span("1.0.0", "1.9.0"), "dc5851d3cc4ee60e", BEF),)),
        Target(module=f"{_IMG}.psnrb", qualname="_psnrb_compute", present=_SINCE_1_0, variants=(
            Variant(span("1.0.0", "1.1.2"), "9bb2719924564594", PSNRB_COMPUTE),
            Variant(span("1.2.0", "1.7.4"), "03f7143a5f59b70b", PSNRB_COMPUTE),  # variable name
            Variant(span("1.8.0", "1.9.0"), "4559015132d533bf"),  # no ``if`` on data_range
        )),
        Target(module=f"{_IMG}.rase", qualname="relative_average_spectral_error", present=_SINCE_1_0,
               variants=_variants(
            RASE, (span("1.0.0", "1.6.1"), "cd8d639fe5b06241"), (span("1.6.2", "1.9.0"), "2eb67f58c482d671"))),
        # there from 1.0.0 too, with torch.minimum/maximum: a target up to 0.11.4 only
        Target(module="torchmetrics.image.psnr", qualname="PeakSignalNoiseRatio.update",
               present=span("0.10.0", "0.11.4"), shared=True,
               variants=(Variant(span("0.10.0", "0.11.4"), "a90186422f5fdd83", PSNR_RANGE),)),
        Target(module=f"{_IMG}.ssim", qualname="_ssim_update", variants=_variants(
            SSIM, (span("0.10.0", "0.10.1"), "3620ad109367752c"), (span("0.10.2", "0.11.4"), "ea4129b62ea027be"),
            (span("1.0.0", "1.3.1"), "267799157d904012"), (span("1.3.2", "1.4.1"), "ec67b3d6e5e5c741"),
            (span("1.4.2", "1.5.2"), "6c13e38998c1a484"), (span("1.6.0", "1.9.0"), "2f9d9f33f0a612b2"))),
        Target(module=f"{_IMG}.ssim", qualname="_multiscale_ssim_update", variants=_variants(
            MS_SSIM, (span("0.10.0", "0.11.4"), "7576fbc255e87f63"), (span("1.0.0", "1.5.2"), "badd94c11ebc0278"),
            (span("1.6.0", "1.9.0"), "f404a1bef7fe1e0f"))),
        Target(module="torchmetrics.image.ssim", qualname="MultiScaleStructuralSimilarityIndexMeasure.update",
               variants=(
            Variant(span("0.10.0", "1.6.1"), "fb20240c8b6da156"),  # ``self.total += preds.shape[0]``: no copy
            Variant(span("1.6.2", "1.9.0"), "d135c620b7ec0591", MS_SSIM_TOTAL),
        )),
        Target(module=f"{_IMG}.vif", qualname="_vif_per_channel", present=since("1.1.0"), variants=_variants(
            VIF, (span("1.1.0", "1.8.0"), "6930c39db95c9d8e"), (span("1.8.1", "1.9.0"), "d123312e1a8fbb11"))),
        Target(module=f"{_IMG}.scc", qualname="_scc_update", present=since("1.3.0.post0"), variants=_variants(
            SCC, (span("1.3.0.post0", "1.5.2"), "c7be8364b2088015"), (span("1.6.0", "1.9.0"), "9418ca76ce482fa6"))),
        Target(module=f"{_IMG}.helper", qualname="_single_dimension_pad", present=span("0.10.0", "1.3.1"), variants=(
            Variant(span("0.10.0", "0.11.4"), "6f8adebbbcf5b5e1"),  # ``torch.arange(..., device=...)``: no copy
            Variant(span("1.0.0", "1.3.1"), "c44c9c79deb53464", PAD))),
        Target(module=f"{_IMG}.utils", qualname="_single_dimension_pad", present=since("1.3.2"),
               variants=(Variant(span("1.3.2", "1.9.0"), "c44c9c79deb53464", PAD),)),
    ),
)
