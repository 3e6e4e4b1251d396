#!/usr/bin/env bash
# bench_stage1.sh — stage 1 against PyTorch eager on the same GPU, in one run: `make bench`.
#
# Both train ResNet-18 (CIFAR layout) at batch 128 with SGD(momentum 0.9, wd 5e-4) and cuDNN
# benchmark mode, fp32 (TF32 allowed in convolutions, PyTorch's default). PyTorch's data sits on
# the GPU already; stage 1 runs its real input pipeline (loader threads, pinned memory, async
# copies), so any data cost counts against us. Prints a table with ratios; logs go to $BENCH_OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${BENCH_OUT:-runs/bench}
STEPS=${STEPS:-300}
mkdir -p "$OUT"
[ -x ./stage1 ] || make stage1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n1 | sed 's/^/gpu: /'

python3 tests/torch/bench_pytorch.py --model resnet18 --batch 128 --steps "$STEPS" --warmup 20 \
    | tee "$OUT/pytorch.json"
./stage1 --model resnet18 --batch-size 128 --cudnn-benchmark --pin-memory --workers 4 \
    --steps $((STEPS + 5)) --epochs 100 --schedule const --progress off --log-every 1000 \
    --report "$OUT/stage1.jsonl" > "$OUT/stage1.log"
tail -n 3 "$OUT/stage1.log"

python3 - "$OUT/pytorch.json" "$OUT/stage1.jsonl" <<'PY'
import json, sys
pt = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
st = [json.loads(l) for l in open(sys.argv[2]) if '"summary"' in l][-1]
gib = lambda b: b / 2**30
print()
print(f"{'ResNet-18, batch 128, fp32':32s} {'ms/iter':>9s} {'img/s':>9s} {'peak mem':>10s}")
print(f"{'PyTorch ' + pt['torch'] + ' eager':32s} {pt['ms_per_iter_median']:9.2f} {pt['img_per_s']:9.0f} {gib(pt['peak_mem_bytes'][0]):8.2f} GiB")
print(f"{'stage1':32s} {st['ms_per_iter_median']:9.2f} {st['img_per_s']:9.0f} {gib(st['peak_mem_bytes'][0]):8.2f} GiB")
print(f"{'ratio (stage1 speed / PyTorch)':32s} {pt['ms_per_iter_median'] / st['ms_per_iter_median']:9.2f}x")
PY
