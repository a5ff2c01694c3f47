#!/usr/bin/env bash
# The checks that need a real CUDA GPU, in one run, per torchmetrics release of .matrix/:
#   1. python -m tmpatch.audit.calibrate: every probe, panel row and sweep class audited
#      simulated (the oracle) and real (torch.cuda.set_sync_debug_mode), verdicts compared;
#   2. benchmarks/train_step.py --device cuda: step time and real syncs per step, no metrics /
#      unpatched / patched;
#   3. benchmarks/cuda_counts_check.py: the lean counting updates (put, negative-index tables,
#      histc) give the release's states and the CPU's report counts on the GPU;
#   4. benchmarks/capture_step.py --device cuda: the launch-bound step with metrics eager, captured in
#      CUDA graphs (tmpatch.capture) and compiled with mode="reduce-overhead" (cudagraph skips counted).
#
#   bash benchmarks/gpu_check.sh OUTDIR [RELEASE ...]      (default releases: 1.9.0 1.4.0)
#
# Writes OUTDIR/calibration-R.txt and .json per release, OUTDIR/train_step-gpu.txt,
# OUTDIR/cuda_counts_check.txt, OUTDIR/capture_step-gpu.txt and OUTDIR/log.txt (versions, stderr,
# exit codes). PYTHON picks the interpreter (default python3).
# Each command has a time limit, so that what finished comes back even if one hangs.
set -u
out=${1:?usage: bash benchmarks/gpu_check.sh OUTDIR [RELEASE ...]}
shift
releases=("$@")
[ ${#releases[@]} -gt 0 ] || releases=(1.9.0 1.4.0)
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
mkdir -p "$out"
log="$out/log.txt"
{
    date -u
    nvidia-smi -L 2>&1 || true
    "$py" -c 'import torch, wrapt; print("torch", torch.__version__, "cuda", torch.version.cuda,
"available", torch.cuda.is_available(), "wrapt", wrapt.__version__)'
} >>"$log" 2>&1
for release in "${releases[@]}"; do
    path=".matrix/$release:."
    echo "== calibrate $release" >>"$log"
    PYTHONPATH=$path timeout 170 "$py" -m tmpatch.audit.calibrate --repeat 10 \
        --out "$out/calibration-$release.txt" --json "$out/calibration-$release.json" >/dev/null 2>>"$log"
    echo "calibrate $release: exit $?" >>"$log"
    echo "== train_step $release" >>"$log"
    echo "\$ PYTHONPATH=.matrix/$release:. python benchmarks/train_step.py --device cuda" >>"$out/train_step-gpu.txt"
    PYTHONPATH=$path timeout 80 "$py" benchmarks/train_step.py --device cuda >>"$out/train_step-gpu.txt" 2>>"$log"
    echo "train_step $release: exit $?" >>"$log"
    echo >>"$out/train_step-gpu.txt"
    echo "== cuda_counts_check $release" >>"$log"
    PYTHONPATH=$path timeout 60 "$py" benchmarks/cuda_counts_check.py --device cuda \
        >>"$out/cuda_counts_check.txt" 2>>"$log"
    echo "cuda_counts_check $release: exit $?" >>"$log"
    echo "== capture_step $release" >>"$log"
    PYTHONPATH=$path timeout 240 "$py" benchmarks/capture_step.py --device cuda --release "$release" \
        >>"$out/capture_step-gpu.txt" 2>>"$log"
    echo "capture_step $release: exit $?" >>"$log"
done
date -u >>"$log"
