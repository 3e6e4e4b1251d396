#!/usr/bin/env bash
# kernel_breakdown.sh — per-kernel GPU time of a training step with Nsight Compute, by category.
#
#   bash tests/kernel_breakdown.sh STAGE [FLAGS...]     e.g.  bash tests/kernel_breakdown.sh stage1
#                                                            bash tests/kernel_breakdown.sh stage5 --amp bf16
# Runs the stage twice on ResNet-18 at batch 128: once plain (its median step time), once under
# `ncu --metrics gpu__time_duration.sum` for 6 steps, and prints tests/kernel_breakdown.py's table
# (steps 3–5). ncu leaves the clocks alone (--clock-control none) and the caches warm
# (--cache-control none), so each kernel's time is close to its time in the real run; it still
# serialises kernels, so overlap (copy stream, DDP's communication) is not in the sum.
# Output: BREAKDOWN_OUT (default runs/breakdown)/STAGE*.{csv,txt}.
set -euo pipefail
cd "$(dirname "$0")/.."
STAGE=${1:?usage: bash tests/kernel_breakdown.sh STAGE [FLAGS...]}; shift
command -v ncu >/dev/null || { echo "kernel_breakdown.sh: ncu (Nsight Compute) is not on the PATH"; exit 2; }
OUT=${BREAKDOWN_OUT:-runs/breakdown}; mkdir -p "$OUT"
TAG="$STAGE$(echo "$*" | tr -c 'a-zA-Z0-9' '_' | sed 's/_*$//')"
export NCCL_NVLS_ENABLE=0
RUN=(--model resnet18 --batch-size 128 --progress off --test-size 128)
# Stages 3–5 run as one worker started the way torchrun starts one (RANK, WORLD_SIZE, … in the
# environment): ncu then profiles that process alone, without our launcher around it.
WORKER=()
case $STAGE in stage3|stage4|stage5)
    WORKER=(env RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1
            MASTER_PORT=${MASTER_PORT:-29650} STAGE_RDZV_SECRET=kernel-breakdown-one-worker)
    RUN+=(--comm-timeout 3600) ;;
esac
ms=$("${WORKER[@]}" ./"$STAGE" "${RUN[@]}" --train-size 12800 --steps 60 "$@" 2>&1 |
     sed -n 's/^summary:.*| \([0-9.]*\) ms\/[a-z]* (median).*/\1/p' | head -1)
echo "$STAGE $*: median step ${ms:-?} ms without the profiler"
ncu --csv --metrics gpu__time_duration.sum --clock-control none --cache-control none \
    --target-processes all "${WORKER[@]}" ./"$STAGE" "${RUN[@]}" --train-size 768 --epochs 1 "$@" > "$OUT/$TAG.csv" 2> "$OUT/$TAG.err"
python3 tests/kernel_breakdown.py "$OUT/$TAG.csv" ${ms:+--step-ms $ms} | tee "$OUT/$TAG.txt"
