"""image_constants: the image metrics' counts, constants and index lists made on the device, bit for bit."""
from __future__ import annotations

import importlib
import types
import warnings

import pytest
import torch
from hypothesis import given, settings, strategies as st
from torchmetrics import image as I

import tmpatch
from tests.conftest import assert_bitwise, cpu_shortcuts, examples, release_in

IMG = "torchmetrics.functional.image"
PAD_MODULE = f"{IMG}.utils" if release_in(">=1.3.2") else f"{IMG}.helper"
HAS_VIF, HAS_SCC = release_in(">=1.1.0"), release_in(">=1.3.0")
#: PSNRB, RASE and RMSE-SW came in 1.0.0; 0.10-0.11's ``_single_dimension_pad`` makes its ranges on the device
HAS_1_0 = release_in(">=1.0.0")


@pytest.fixture(autouse=True)
def _device_path():
    yield
    cpu_shortcuts(True)


def _apply() -> None:
    row = next(r for r in tmpatch.apply(["image_constants"]) if r.name == "image_constants")
    assert row.state == "applied", row


def _fn(module: str, name: str):
    return getattr(importlib.import_module(f"{IMG}.{module}" if "." not in module else module), name)


def _g(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _images(*shape, seed=0):
    return torch.rand(*shape, generator=_g(seed)), torch.rand(*shape, generator=_g(seed + 1))


def _psnrb():
    return I.PeakSignalNoiseRatioWithBlockedEffect(**({"data_range": 1.0} if release_in(">=1.8.0") else {}))


#: metric, update arguments, whether its update and forward are then free of syncs
CASES = {
    "PSNR": (lambda: I.PeakSignalNoiseRatio(data_range=1.0), lambda: _images(2, 3, 8, 8), True),
    "PSNR(dim)": (lambda: I.PeakSignalNoiseRatio(data_range=1.0, dim=(1, 2), reduction="sum"),
                  lambda: _images(2, 3, 8, 8), True),
    "MS-SSIM": (lambda: I.MultiScaleStructuralSimilarityIndexMeasure(data_range=1.0, kernel_size=3,
                                                                      gaussian_kernel=False),
                lambda: _images(1, 1, 96, 96), True),
    "SSIM(uniform)": (lambda: I.StructuralSimilarityIndexMeasure(data_range=1.0, gaussian_kernel=False,
                                                                 kernel_size=5), lambda: _images(1, 2, 12, 12), True),
    "SSIM(data_range=None)": (I.StructuralSimilarityIndexMeasure, lambda: _images(1, 2, 12, 12), True),
}
if not HAS_1_0:  # 0.10-0.11 keep the target's range with Python's min/max of device values
    CASES["PSNR(data_range=None)"] = (lambda: I.PeakSignalNoiseRatio(), lambda: _images(2, 3, 8, 8), True)
if HAS_1_0:
    CASES["PSNRB"] = (_psnrb, lambda: _images(2, 1, 20, 18), True)
    CASES["RMSE-SW"] = (I.RootMeanSquaredErrorUsingSlidingWindow, lambda: _images(1, 2, 12, 12), True)
    CASES["RASE"] = (I.RelativeAverageSpectralError, lambda: _images(1, 2, 12, 12), True)
if HAS_SCC:
    CASES["SCC"] = (I.SpatialCorrelationCoefficient, lambda: _images(1, 2, 12, 12), True)
if HAS_VIF:
    CASES["VIF"] = (I.VisualInformationFidelity, lambda: _images(1, 1, 41, 41), False)  # boolean masks remain
FUNCTIONS = {"_psnr_update", "_psnrb_update", "_compute_bef", "_psnrb_compute", "relative_average_spectral_error",
             "_ssim_update", "_multiscale_ssim_update", "_vif_per_channel", "_scc_update", "_single_dimension_pad",
             "update"}


class _Points(list):
    """The sync points of a simulated run, up to an error the simulation cannot get past."""

    @property
    def count(self) -> int:
        return len(self)


def _simulate(call, metric, args, tolerate: bool) -> "_Points":
    """Sync points of ``call(metric)(*args)`` on simulated CUDA; a run the simulation cannot finish
    (the release's host lists built from fake values, in simulations without real host tensors)
    keeps the points seen before it stopped."""
    from tmpatch.audit import simulated_cuda

    with simulated_cuda("cuda:0") as sim:
        sim.put(metric)
        moved = sim.put(args)
        del sim.sync_points[:]
        try:
            call(metric)(*moved)
        except RuntimeError:
            if not tolerate:
                raise
        return _Points(sim.sync_points)


def _conv_simulates() -> bool:
    """Whether a convolution runs on simulated CUDA with this torch: a CUDA build without a
    GPU before torch 2.6 asks the CUDA runtime for a convolution backend even on fake tensors."""
    from tmpatch.audit import simulated_cuda

    with simulated_cuda("cuda:0") as sim:
        x, w = sim.put((torch.ones(2, 3, 8, 8), torch.ones(3, 1, 3, 3)))
        try:
            torch.nn.functional.conv2d(x, w, groups=3)  # grouped, as SSIM's: the case that asks
        except RuntimeError:
            return False
    return True


def _audit(name: str, patched: bool):
    build, args, clean = CASES[name]
    # patched runs must finish, but where convolutions cannot be simulated they keep the
    # points seen before the first one (the copies checked below come before it)
    tolerate = not patched or not _conv_simulates()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return (_simulate(lambda m: m.update, build(), args(), tolerate),
                _simulate(lambda m: m, build(), args(), tolerate), clean and not tolerate)


def _copies_or_reads(points):
    from tmpatch.audit import SyncKind

    kinds = (SyncKind.H2D_COPY, SyncKind.D2H_READ)
    return [p for p in points if p.kind in kinds and p.function in FUNCTIONS]


def test_image_updates_copy_and_read_nothing_on_simulated_cuda():
    """Unpatched, each case copies (or PSNRB reads) in the patched functions, in update() or
    forward() (the test can fail); patched, nothing of it is left."""
    for name in CASES:
        update, forward, _ = _audit(name, False)
        assert _copies_or_reads(update) or _copies_or_reads(forward), (name, update, forward)
    _apply()
    for name in CASES:
        update, forward, clean = _audit(name, True)
        assert not _copies_or_reads(update) and not _copies_or_reads(forward), (name, update, forward)
        if clean:
            assert update.count == 0 and forward.count == 0, (name, update, forward)


# -- same results -------------------------------------------------------------------------------
def _tensor(draw, shape, dtype=torch.float32, low=0.0, high=1.0):
    n = 1
    for s in shape:
        n *= s
    if n > 64:  # an image: values from a drawn seed
        values = torch.rand(shape, generator=_g(draw(st.integers(0, 2**16))), dtype=torch.float64)
        return (low + (high - low) * values).to(dtype)
    values = draw(st.lists(st.floats(low, high, width=32), min_size=n, max_size=n))
    return torch.tensor(values, dtype=torch.float64).reshape(shape).to(dtype)


DTYPES = [torch.float32, torch.float64, torch.float16]


@st.composite
def _calls(draw):
    """``(function, args, kwargs)`` for one of the edited functions."""
    kind = draw(st.sampled_from(["psnr", "ms_ssim", "ssim"]
                                + (["psnrb", "bef", "psnrb_compute", "pad", "rase"] if HAS_1_0 else [])
                                + (["vif"] if HAS_VIF else []) + (["scc"] if HAS_SCC else [])))
    dtype = draw(st.sampled_from(DTYPES))
    if kind == "psnr":
        shape = (draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 4)))
        dim = draw(st.sampled_from([None, 0, 1, -1, (1, 2), (0, -1), (), [2]]))
        return ("psnr", "_psnr_update"), (_tensor(draw, shape, dtype), _tensor(draw, shape, dtype)), {"dim": dim}
    if kind in ("psnrb", "bef"):
        shape = (draw(st.integers(1, 2)), 1, draw(st.integers(1, 20)), draw(st.integers(1, 20)))
        block = draw(st.sampled_from([1, 2, 3, 4, 8]))
        x = _tensor(draw, shape, dtype)
        if draw(st.booleans()):  # blocky: jumps at block edges, so that d_b > d_bc and the effect is not 0
            rows, cols = torch.arange(shape[2]) // block, torch.arange(shape[3]) // block
            x = (x * 0.01 + (rows[:, None] * 3 + cols[None, :] * 5).remainder(7).to(dtype) * 0.1).to(dtype)
        if kind == "bef":
            return ("psnrb", "_compute_bef"), (x,), {"block_size": block}
        return ("psnrb", "_psnrb_update"), (x, _tensor(draw, shape, dtype)), {"block_size": block}
    if kind == "psnrb_compute":
        values = [draw(st.sampled_from([0.5, 2.0, 3.0, 0.0, float("nan"), 1e-3])) for _ in range(4)]
        range_dtype = draw(st.sampled_from(DTYPES + [torch.int64]))
        data_range = torch.tensor(values[3] if range_dtype.is_floating_point else draw(st.sampled_from([0, 1, 3])),
                                  dtype=range_dtype)
        sse, bef, total = (torch.tensor(v, dtype=dtype) for v in values[:3])
        return ("psnrb", "_psnrb_compute"), (sse, bef, total, data_range), {}
    if kind == "pad":
        x = _tensor(draw, (2, draw(st.integers(3, 6)), draw(st.integers(3, 6))), dtype)
        dim = draw(st.sampled_from([1, 2, -1]))
        pad = draw(st.integers(1, 2))
        return (PAD_MODULE, "_single_dimension_pad"), (x, dim, pad, draw(st.integers(0, 1))), {}
    if kind == "rase":
        shape = (draw(st.integers(1, 2)), draw(st.integers(1, 2)), 8, 8)
        args = (_tensor(draw, shape, dtype, 0.125, 1.0), _tensor(draw, shape, dtype, 0.125, 1.0))
        return ("rase", "relative_average_spectral_error"), args, {"window_size": 3}
    if kind == "ms_ssim":
        betas = draw(st.sampled_from([(0.0448, 0.2856, 0.3001), (1, 2), (0.5, 0.25, 0.125, 2.0)]))
        shape = (1, 1, 96, 96)
        args = (_tensor(draw, shape, torch.float32), _tensor(draw, shape, torch.float32))
        kwargs = {"kernel_size": 3, "data_range": 1.0, "betas": betas, "gaussian_kernel": False}
        return ("ssim", "_multiscale_ssim_update"), args, kwargs
    if kind == "ssim":
        shape = (1, 2, 9, 9)
        size = draw(st.sampled_from([3, 5, (3, 5)]))
        gauss = draw(st.booleans())
        args = (_tensor(draw, shape, dtype), _tensor(draw, shape, dtype, 0.0, draw(st.sampled_from([0.5, 1.0, 2.0]))))
        data_range = draw(st.sampled_from([1.0, None, None]))  # None: the larger of the two ranges, chosen
        if data_range is None and draw(st.booleans()):  # a NaN in one input: Python's max keeps the first
            args[draw(st.integers(0, 1))][0, 0, draw(st.integers(0, 8)), 0] = float("nan")
        if data_range is None and draw(st.booleans()):  # equal ranges
            args = (args[0], args[0].clone())
        return ("ssim", "_ssim_update"), args, {"kernel_size": size, "data_range": data_range, "gaussian_kernel": gauss}
    if kind == "vif":
        shape = (1, 1, 41, 41)
        sigma = draw(st.sampled_from([2.0, 2, 0.1, 1e-3]))
        return ("vif", "_vif_per_channel"), (_tensor(draw, shape, dtype), _tensor(draw, shape, dtype), sigma), {}
    hp = draw(st.sampled_from([None, torch.float64, torch.float32, torch.int32, "nan", "big"]))
    if hp is None:
        kernel = torch.tensor([[-1, -1, -1], [-1, 8, -1], [-1, -1, -1]])
    elif hp == "nan":
        kernel = torch.tensor([[0.5, float("nan")], [1.0, -2.0]])
    elif hp == "big":
        kernel = torch.ones(5, 5)  # more values than the helper fills
    else:
        kernel = (torch.arange(9).reshape(3, 3) - 4).to(hp) / (3 if hp.is_floating_point else 1)
    shape = (1, 2, 8, 8)
    return ("scc", "_scc_update"), (_tensor(draw, shape, dtype), _tensor(draw, shape, dtype), kernel, 4), {}


def _flat(result):
    if isinstance(result, torch.Tensor):
        return [result]
    if isinstance(result, (tuple, list)):
        return [t for item in result for t in _flat(item)]
    return [torch.tensor(result)]


@settings(max_examples=examples(25), deadline=None)
@given(st.lists(st.tuples(_calls(), st.booleans()), min_size=1, max_size=6))
def test_functions_return_the_releases_tensors_bit_for_bit(calls):
    """The release's function (``get_original``) and the edited one on the same arguments (the
    edited functions call no other function this patch changes, but for PSNRB's update, which
    calls ``_compute_bef``: its reference is taken with the release's ``_compute_bef``)."""
    _apply()
    psnrb = importlib.import_module(f"{IMG}.psnrb") if HAS_1_0 else types.SimpleNamespace(_compute_bef=None)
    for (where, args, kwargs), shortcuts in calls:
        cpu_shortcuts(shortcuts)
        function = _fn(*where)
        original = tmpatch.get_original(function)
        assert function is not original or (where[1] == "_psnrb_compute" and release_in(">=1.8.0"))
        edited_bef = psnrb._compute_bef
        psnrb._compute_bef = tmpatch.get_original(edited_bef) if HAS_1_0 else None  # the release's, for the reference
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                want = _flat(original(*args, **kwargs))
        except Exception as exc:  # noqa: BLE001 - the same error patched
            want = type(exc)
        finally:
            psnrb._compute_bef = edited_bef
        if isinstance(want, type):
            with pytest.raises(want):
                function(*args, **kwargs)
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            got = _flat(function(*args, **kwargs))
        assert len(got) == len(want)
        for a, b in zip(got, want):
            assert_bitwise(a, b)


def test_metric_results_equal_the_releases():
    def run():
        out = {}
        for name, (build, args, _) in CASES.items():
            metric = build()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                metric.update(*args())
                out[name] = _flat(metric(*args())) + _flat(metric.compute())
        return out

    want = run()
    _apply()
    cpu_shortcuts(False)
    got = run()
    for name in CASES:
        for a, b in zip(got[name], want[name]):
            assert_bitwise(a, b)


def test_block_index_lists_are_the_releases():
    """The index lists PSNRB's block effect uses, made on the device, against the release's host lists."""
    from tmpatch.patches.image_constants import _names

    lists = _names(None)["_tmpatch_bef_indices"]
    cpu_shortcuts(False)
    for width in range(1, 40):
        for height in (1, 2, 9, 17):
            for block in range(1, 10):
                got = lists(torch.zeros(1, 1, height, width), width, height, block)
                if got is None:  # the release's lists are used
                    continue
                h, v = torch.arange(width - 1), torch.arange(height - 1)
                h_b = torch.tensor(range(block - 1, width - 1, block))
                v_b = torch.tensor(range(block - 1, height - 1, block))
                want = (h_b, torch.tensor(list(set(h.tolist()).symmetric_difference(h_b.tolist()))),
                        v_b, torch.tensor(list(set(v.tolist()).symmetric_difference(v_b.tolist()))))
                for a, b in zip(got, want):
                    assert_bitwise(a, b)


def test_the_releases_complement_list_is_ascending():
    from tmpatch.patches.image_constants import _complement_is_ascending

    for length in range(1, 300):
        for block in (2, 3, 4, 8, 16):
            if len(range(block - 1, length, block)) and length - len(range(block - 1, length, block)):
                assert _complement_is_ascending(length, block), (length, block)


@pytest.mark.parametrize("scale", [(1.0, 2.0), (2.0, 1.0), (1.0, 1.0)], ids=["target wider", "preds wider", "equal"])
def test_ssim_default_data_range_is_the_releases_choice(scale):
    """``data_range=None``: the larger of the two ranges, chosen on the device (``torch.where``)
    where the release compares them in Python; the same tensors, whichever is larger."""
    _apply()
    cpu_shortcuts(False)  # the device path, on real values
    function = _fn("ssim", "_ssim_update")
    preds, target = _images(1, 2, 12, 12, seed=3)
    preds, target = preds * scale[0], (target * scale[1] if scale[0] != scale[1] else preds * scale[1])
    want = _flat(tmpatch.get_original(function)(preds, target))
    got = _flat(function(preds, target))
    for a, b in zip(got, want):
        assert_bitwise(a, b)


@pytest.mark.skipif(HAS_1_0, reason="0.10-0.11: PSNR's range kept with Python's min/max")
def test_psnr_range_is_the_releases_choice_nan_included():
    """``min(target.min(), state)`` is ``state if state < target.min() else target.min()``: a NaN on
    either side picks the same tensor value as the release's comparison (torch.minimum would not)."""
    nan = float("nan")
    batches = [torch.tensor([[0.2, 0.5]]), torch.tensor([[nan, 0.1]]), torch.tensor([[0.7, 0.9]]),
               torch.tensor([[-1.0, 3.0]])]

    def run():
        metric = I.PeakSignalNoiseRatio()
        out = []
        for batch in batches:
            metric.update(batch * 0.5, batch)
            out += [metric.min_target.clone(), metric.max_target.clone()]
        return out

    want = run()
    _apply()
    cpu_shortcuts(False)  # the device path, on real values
    for a, b in zip(run(), want):
        assert_bitwise(a, b)
