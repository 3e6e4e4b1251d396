#!/usr/bin/env bash
# bench_stage1.sh — stage 1 against PyTorch eager on the same GPU, in one run: `make bench`.
#
# Both train ResNet-18 (CIFAR layout) at batch 128 with SGD(momentum 0.9, wd 5e-4) and cuDNN
# benchmark mode, fp32 (TF32 allowed in convolutions, PyTorch's default). PyTorch's data sits on
# the GPU already; stage 1 runs its real input pipeline (loader threads, pinned memory, async
# copies), so any data cost counts against us. Prints a table with ratios, achieved TFLOP/s and
# its fraction of the GPU's peak (tests/bench_flops.py); logs go to $BENCH_OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${BENCH_OUT:-runs/bench}
STEPS=${STEPS:-300}
mkdir -p "$OUT"
[ -x ./stage1 ] || make stage1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -n1 | sed 's/^/gpu: /'

python3 tests/torch/bench_pytorch.py --model resnet18 --batch 128 --steps "$STEPS" --warmup 20 \
    | tee "$OUT/pytorch.json"
# Stage 1 three ways: the comparison row (cuDNN benchmark, pinned memory), then what each of those
# two choices buys.
run_stage1() { # name, extra flags...
    local name=$1; shift
    ./stage1 --model resnet18 --batch-size 128 --workers 4 --steps $((STEPS + 5)) --epochs 100 \
        --schedule const --progress off --log-every 1000 --report "$OUT/$name.jsonl" "$@" > "$OUT/$name.log"
    tail -n 3 "$OUT/$name.log"
}
run_stage1 stage1 --cudnn-benchmark --pin-memory
run_stage1 stage1_heuristic --pin-memory
run_stage1 stage1_pageable --cudnn-benchmark

python3 - "$OUT" <<'PY'
import json, sys
sys.path.insert(0, "tests")
import bench_flops as fl
out = sys.argv[1]
pt = json.loads(open(f"{out}/pytorch.json").read().strip().splitlines()[-1])
def summary(name):
    return [json.loads(l) for l in open(f"{out}/{name}.jsonl") if '"summary"' in l][-1]
s1 = summary("stage1")
rows = [("PyTorch " + pt["torch"] + " eager", pt, fl.like(s1, pt["ms_per_iter_median"], pt["batch_size"])),
        ("stage1 --cudnn-benchmark --pin-memory", s1, fl.stage(s1))]
for label, name in (("stage1 (heuristic algorithms)", "stage1_heuristic"), ("stage1 (pageable host memory)", "stage1_pageable")):
    s = summary(name)
    rows.append((label, s, fl.stage(s)))
print()
print(f"{'ResNet-18, batch 128, fp32':40s} {'ms/iter':>8s} {'img/s':>8s} {'peak mem':>10s} {'vs PyTorch':>11s} {fl.HEAD}")
for name, r, flops in rows:
    print(f"{name:40s} {r['ms_per_iter_median']:8.2f} {r['img_per_s']:8.0f} "
          f"{r['peak_mem_bytes'][0] / 2**30:6.2f} GiB {pt['ms_per_iter_median'] / r['ms_per_iter_median']:10.2f}x "
          f"{fl.cols(flops)}")
print(f"TFLOP/s: {s1['model_gflop_per_step']:.1f} GFLOP per step (conv + linear, forward + backward; model_flops) over the "
      f"median step; of peak: the {s1['peak_math']} dense peak, {s1['peak_tflops']} TFLOP/s ({s1['peak_source']}).")
PY
