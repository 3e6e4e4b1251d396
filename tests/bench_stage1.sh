#!/usr/bin/env bash
# bench_stage1.sh — stage 1 against PyTorch eager on the same GPU, in one run: `make bench`.
#
# Both train ResNet-18 (CIFAR layout) at batch 128 with SGD(momentum 0.9, wd 5e-4), fp32 (TF32
# allowed in convolutions, PyTorch's default), each way cuDNN can pick its algorithms: by heuristic
# (cudnn.benchmark off, both defaults) and by measurement (cudnn.benchmark on / --cudnn-benchmark).
# PyTorch's data sits on the GPU already; stage 1 runs its real input pipeline (loader threads,
# pinned memory, async copies), so any data cost counts against us. Then what two of stage 1's
# choices buy: CUDA graphs (--no-cuda-graph) and pinned memory (pageable). Prints a table with
# peak memory, ratios against PyTorch's faster mode, achieved TFLOP/s and its fraction of the GPU's
# peak (tests/bench_flops.py), and the goals: stage 1 ≥ 1.5× PyTorch eager's images/s, peak
# memory ≤ PyTorch's in each benchmark mode. Logs go to $BENCH_OUT (default runs/bench: a new or
# empty folder, or one this script wrote before); STEPS (default 300) timed steps. Needs a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
. tests/bench_common.sh
bench_ints "[STEPS=N] [BENCH_OUT=DIR] bash tests/bench_stage1.sh (or make bench)" STEPS
OUT=${BENCH_OUT:-runs/bench}
STEPS=${STEPS:-300}
bench_need_gpu tests/bench_stage1.sh '`make compare QUICK=1`'
bench_out_dir BENCH_OUT "$OUT" runs/bench bench_stage1 '*.jsonl' '*.log' 'pytorch_*.json'
[ -x ./stage1 ] || make stage1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n1 | sed 's/^/gpu: /' || true

for mode in on off; do
    python3 tests/torch/bench_pytorch.py --model resnet18 --batch 128 --steps "$STEPS" --warmup 20 \
        --cudnn-benchmark $mode | tee "$OUT/pytorch_$mode.json"
done
run_stage1() { # name, extra flags...
    local name=$1; shift
    ./stage1 --model resnet18 --batch-size 128 --workers 4 --steps $((STEPS + 5)) --epochs 100 \
        --schedule const --progress off --log-every 1000 --report "$OUT/$name.jsonl" "$@" > "$OUT/$name.log"
    tail -n 3 "$OUT/$name.log"
}
run_stage1 stage1 --pin-memory
run_stage1 stage1_benchmark --cudnn-benchmark --pin-memory
run_stage1 stage1_eager --pin-memory --no-cuda-graph
run_stage1 stage1_pageable

python3 - "$OUT" <<'PY'
import json, sys
sys.path.insert(0, "tests")
import bench_flops as fl
out = sys.argv[1]
pt = {m: json.loads(open(f"{out}/pytorch_{m}.json").read().strip().splitlines()[-1]) for m in ("on", "off")}
def summary(name):
    return [json.loads(l) for l in open(f"{out}/{name}.jsonl") if '"summary"' in l][-1]
s1 = summary("stage1")
best = min(pt.values(), key=lambda r: r["ms_per_iter_median"])  # PyTorch's faster mode: the reference
rows = [(f"PyTorch {pt['on']['torch']} eager, cudnn.benchmark on", pt["on"], fl.like(s1, pt["on"]["ms_per_iter_median"], 128)),
        (f"PyTorch {pt['off']['torch']} eager, cudnn.benchmark off", pt["off"], fl.like(s1, pt["off"]["ms_per_iter_median"], 128))]
for label, name in (("stage1 (default: heuristic algorithms)", "stage1"), ("stage1 --cudnn-benchmark", "stage1_benchmark"),
                    ("stage1 --no-cuda-graph", "stage1_eager"), ("stage1, pageable host memory", "stage1_pageable")):
    s = summary(name)
    rows.append((label, s, fl.stage(s)))
print()
print(f"{'ResNet-18, batch 128, fp32':42s} {'ms/iter':>8s} {'img/s':>8s} {'peak mem':>11s} {'vs PyTorch':>11s} {fl.HEAD}")
for name, r, flops in rows:
    print(f"{name:42s} {r['ms_per_iter_median']:8.2f} {r['img_per_s']:8.0f} "
          f"{r['peak_mem_bytes'][0] / 2**20:7.1f} MiB {best['ms_per_iter_median'] / r['ms_per_iter_median']:10.2f}x "
          f"{fl.cols(flops)}")
print(f"vs PyTorch: against PyTorch's faster mode ({best['ms_per_iter_median']:.2f} ms/iter). "
      f"TFLOP/s: {s1['model_gflop_per_step']:.1f} GFLOP per step (conv + linear, forward + backward; model_flops) over the "
      f"median step; of peak: the {s1['peak_math']} dense peak, {s1['peak_tflops']} TFLOP/s ({s1['peak_source']}).")
sb = summary("stage1_benchmark")
speed = best["ms_per_iter_median"] / s1["ms_per_iter_median"]
mem = [(s1["peak_mem_bytes"][0], pt["off"]["peak_mem_bytes"][0], "heuristic vs cudnn.benchmark off"),
       (sb["peak_mem_bytes"][0], pt["on"]["peak_mem_bytes"][0], "--cudnn-benchmark vs cudnn.benchmark on")]
print(f"goals: stage 1 >= 1.5x PyTorch eager: {'PASS' if speed >= 1.5 else 'FAIL'} ({speed:.2f}x) | " +
      " | ".join(f"peak memory <= PyTorch's ({w}): {'PASS' if a <= b else 'FAIL'} ({a / 2**20:.1f} vs {b / 2**20:.1f} MiB)"
                 for a, b, w in mem))
PY
