#!/usr/bin/env bash
# bench_stage5.sh — stage 5 (fp16, bf16, off) against PyTorch's best eager and torch.compile, one GPU,
# in one run: `make bench5` (docs/stage5.md holds the table).
#
# All train ResNet-18 (CIFAR layout) at batch 128 on one GPU with SGD(momentum 0.9, wd 5e-4);
# PyTorch with cudnn.benchmark on (its fastest setting), stage 5 with cuDNN's heuristic algorithm
# choice (its default: on the H200 its --cudnn-benchmark search picked slower 16-bit algorithms,
# 10.1 against 5.3 ms/iter for fp16). PyTorch rows: fp32 eager (the stage 1 baseline), fp16 autocast + GradScaler,
# and the best eager recipe — bf16 autocast + channels_last + fused SGD — then torch.compile of that
# same recipe. Stage 5 rows: --amp fp16 (with the GradScaler; channels-last and CUDA graphs, the
# defaults), the same without CUDA graphs (--no-cuda-graph: what the host costs) and in NCHW
# (--layout nchw), --amp bf16, and --amp off (= stage 4 on one GPU, one micro-batch); on 2 GPUs
# the fp16 default with --grad-comm fp32 and fp16, and the goals line. PyTorch's batches sit on the GPU already;
# stage 5 runs its real input pipeline (4 loader threads, pinned memory), so any data cost counts against us. Images/s and peak memory side by
# side, ratios against PyTorch's best eager, achieved TFLOP/s and its fraction of the GPU's peak. Logs and JSON under $BENCH_OUT (default
# runs/bench_stage5: a new or empty folder, or one this script wrote before); the table is printed last.
# STEPS (default 300) timed steps each. Needs a GPU.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
. tests/bench_common.sh
bench_ints "[STEPS=N] [BENCH_OUT=DIR] bash tests/bench_stage5.sh (or make bench5)" STEPS
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${BENCH_OUT:-runs/bench_stage5}
STEPS=${STEPS:-300}
bench_need_gpu tests/bench_stage5.sh '`make compare QUICK=1`'
bench_out_dir BENCH_OUT "$OUT" runs/bench_stage5 bench_stage5 '*.jsonl' '*.json' '*.log' '*.err'
[ -x ./stage5 ] || make stage5 || exit 1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -n1 | sed 's/^/gpu: /'
PORT=$((20000 + $$ % 10000))
log() { echo "=== $* ($(date +%T))"; }

pytorch() { # name, bench_pytorch.py flags...
    local name=$1; shift
    log "PyTorch $name"
    (cd tests/torch && timeout -k 10 900 python3 bench_pytorch.py --model resnet18 --batch 128 --steps "$STEPS" \
        --warmup 20 "$@") > "$OUT/$name.json" 2> "$OUT/$name.err" || echo "PyTorch $name FAILED: see $OUT/$name.err"
    tail -n 1 "$OUT/$name.json"
}
stage5() { # name, stage 5 flags... (one worker unless the flags say --nproc-per-node N after it)
    local name=$1; shift
    PORT=$((PORT + 10))
    log "stage 5 $name"
    timeout -k 10 300 ./stage5 --nproc-per-node 1 --master-port "$PORT" --model resnet18 --batch-size 128 \
        --accum-steps 1 --workers 4 --pin-memory --steps $((STEPS + 5)) --epochs 100 --test-size 2000 \
        --schedule const --progress off --log-every 1000 --report "$OUT/$name.jsonl" "$@" > "$OUT/$name.log" 2>&1 \
        || echo "stage 5 $name FAILED: see $OUT/$name.log"
    grep -E "^(summary|amp|  compute|  per rank|comm over)" "$OUT/$name.log"
}

pytorch pt_fp32
pytorch pt_fp16 --amp fp16
pytorch pt_best --amp bf16 --channels-last --fused
pytorch pt_compile --amp bf16 --channels-last --fused --compile
stage5 s5_fp16 --amp fp16
stage5 s5_fp16_eager --amp fp16 --no-cuda-graph
stage5 s5_fp16_nchw --amp fp16 --layout nchw
stage5 s5_bf16 --amp bf16
stage5 s5_off --amp off
# On 2 GPUs (NGPU: bench_gpus): DDP scaling of the default (fp16) with the fp32 all-reduce and with
# fp16_compress_hook.
if [ "$NGPU" -ge 2 ]; then
    stage5 s5_fp16_2gpu --amp fp16 --nproc-per-node 2 --grad-comm fp32
    stage5 s5_fp16_2gpu_gc16 --amp fp16 --nproc-per-node 2 --grad-comm fp16
fi

python3 - "$OUT" <<'PY'
import json, os, sys
sys.path.insert(0, "tests")
import bench_flops as fl
out = sys.argv[1]
def pt(name):
    try:
        return json.loads(open(f"{out}/{name}.json").read().strip().splitlines()[-1])
    except Exception:
        return None
def s5(name):
    try:
        return [json.loads(l) for l in open(f"{out}/{name}.jsonl") if '"summary"' in l][-1]
    except Exception:
        return None
best = pt("pt_best")
# a PyTorch row's FLOPs and peak: those of the stage 5 row with the same math (fp32 → TF32, fp16, bf16)
same_math = {"pt_fp32": "s5_off", "pt_fp16": "s5_fp16", "pt_best": "s5_bf16", "pt_compile": "s5_bf16"}
def flops(name, r):
    if r is None:
        return None, None
    if name in same_math:
        return fl.like(s5(same_math[name]), r["ms_per_iter_median"], r["batch_size"])
    return fl.stage(r)
rows = [("PyTorch fp32 eager", "pt_fp32"), ("PyTorch fp16 autocast + GradScaler", "pt_fp16"),
        ("PyTorch best eager (bf16, channels_last, fused SGD)", "pt_best"),
        ("PyTorch torch.compile (same recipe)", "pt_compile"),
        ("stage5 --amp fp16 (GradScaler; the default)", "s5_fp16"),
        ("stage5 --amp fp16 --no-cuda-graph", "s5_fp16_eager"),
        ("stage5 --amp fp16 --layout nchw", "s5_fp16_nchw"), ("stage5 --amp bf16", "s5_bf16"),
        ("stage5 --amp off (fp32)", "s5_off")]
rows = [(label, name, pt(name) if name.startswith("pt_") else s5(name)) for label, name in rows]
two = [("stage5 --amp fp16, 2 GPUs, --grad-comm fp32", s5("s5_fp16_2gpu")),
       ("stage5 --amp fp16, 2 GPUs, --grad-comm fp16", s5("s5_fp16_2gpu_gc16"))]
print()
print(f"{'ResNet-18, batch 128, one GPU':52s} {'ms/iter':>8s} {'img/s':>8s} {'peak mem':>10s} {'vs best eager':>14s} {fl.HEAD}")
for label, name, r in rows:
    if r is None:
        print(f"{label:52s} {'(failed)':>8s}")
        continue
    ratio = best["ms_per_iter_median"] / r["ms_per_iter_median"] if best else float("nan")
    print(f"{label:52s} {r['ms_per_iter_median']:8.2f} {r['img_per_s']:8.0f} "
          f"{r['peak_mem_bytes'][0] / 2**30:6.2f} GiB {ratio:13.2f}x {fl.cols(flops(name, r))}")
one = s5("s5_fp16")
for name, r in two:
    if r is None or one is None:
        continue
    eff = r["img_per_s"] / (2 * one["img_per_s"])
    print(f"{name:52s} {r['ms_per_iter_median']:8.2f} {r['img_per_s']:8.0f}  scaling {100 * eff:5.1f}% of 2 x one GPU"
          f"  {fl.cols(fl.stage(r))}")
goals = []
if best and one:
    goals.append(f"stage 5 >= 2x PyTorch's best eager: {'PASS' if best['ms_per_iter_median'] >= 2 * one['ms_per_iter_median'] else 'FAIL'}"
                 f" ({best['ms_per_iter_median'] / one['ms_per_iter_median']:.2f}x)")
comp = pt("pt_compile")
if comp and one:
    goals.append(f"faster than torch.compile: {'PASS' if one['ms_per_iter_median'] < comp['ms_per_iter_median'] else 'FAIL'}"
                 f" ({comp['ms_per_iter_median'] / one['ms_per_iter_median']:.2f}x)")
for name, r in two:
    if r and one:
        eff = r["img_per_s"] / (2 * one["img_per_s"])
        goals.append(f"scaling >= 97% ({name.split(', ')[-1]}): {'PASS' if eff >= 0.97 else 'FAIL'} ({100 * eff:.1f}%)")
if goals:
    print("goals: " + " | ".join(goals))
peaks = {r["peak_math"]: f"{r['peak_tflops']:.1f}" for _, _, r in rows if r and r.get("peak_math") and r.get("peak_tflops")}
src = next((r["peak_source"] for _, _, r in rows if r and r.get("peak_source")), "")
print("TFLOP/s: model FLOPs per step (conv + linear, forward + backward; model_flops) over the median step; of peak: "
      "the dense peak of the convolutions' math, " + (", ".join(f"{k} {v}" for k, v in peaks.items()) + " TFLOP/s"
                                                      if peaks else "n/a") + f" ({src}).")
PY
