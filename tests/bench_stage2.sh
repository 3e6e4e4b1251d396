#!/usr/bin/env bash
# bench_stage2.sh — why DataParallel is slower than one GPU: ours and PyTorch's, in one run (~5 min).
#
#   bash tests/bench_stage2.sh      (./stage1 and ./stage2 built; python3 with torch for the PyTorch rows)
#
#  1. tests/torch/calibrate_dp.py times nn.DataParallel's Python and the cost of planning a convolution
#     in a brand-new thread on this machine → the --gil-* and --dp-plan-* flags for ./stage2;
#  2. ResNet-18, batch 128 per GPU, cudnn.benchmark off and on: ./stage1 as stage 2 runs the model
#     (--layout nchw --no-cuda-graph: NCHW, launch by launch, as PyTorch's replicas run; stage 1's
#     channels-last graphed default would count layout and graphs as DataParallel's cost); ./stage2 --gpus 2 (new
#     threads every step, as PyTorch); --dp-thread-pool (persistent threads: the fix); and, for the
#     split, --dp-thread-pool --no-python (no GIL, no Python: what is left is GPU0's serial work);
#  3. GPU0 against GPU1 memory: ./stage2 at batch 32 and 128 per GPU, and at 128 with --optimizer adam;
#  4. PyTorch: tests/torch/dp_thread_cost.py (one GPU, nn.DataParallel stock and with a persistent
#     2-thread pool, cudnn.benchmark off and on, and a new thread's first forward against a warm one)
#     and tests/torch/bench_dp.py (per-GPU peak memory at the same three settings);
#  5. the table, last: ms/iter, images/s, speed relative to the same family's one GPU, planning per
#     replica thread, GPU0/GPU1 peaks, achieved TFLOP/s and its fraction of the GPUs' peak; then the
#     split of stage 2's loss and the issue's checks.
# With one GPU, stage 2 runs its two logical devices on it (the mechanics and the memory split are
# real, the speed is not a scaling result) and the PyTorch DataParallel rows are skipped.
# Logs and JSON lines: $BENCH_OUT (default runs/bench_stage2: a new or empty folder, or one this
# script wrote before). STEPS, SLOW_STEPS, MEM_STEPS override the step counts below.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
. tests/bench_common.sh
bench_ints "[STEPS=N] [SLOW_STEPS=N] [MEM_STEPS=N] [BENCH_OUT=DIR] bash tests/bench_stage2.sh" STEPS SLOW_STEPS MEM_STEPS
export NCCL_NVLS_ENABLE=0
OUT=${BENCH_OUT:-runs/bench_stage2}
STEPS=${STEPS:-60}         # timed runs (the first 5 steps are warm-up)
SLOW_STEPS=${SLOW_STEPS:-15} # stage 2 with --cudnn-benchmark and new threads: every step re-searches
MEM_STEPS=${MEM_STEPS:-20} # memory rows
bench_need_gpu tests/bench_stage2.sh '`make compare QUICK=1`'
bench_out_dir BENCH_OUT "$OUT" runs/bench_stage2 bench_stage2 '*.jsonl' '*.log'
if [ ! -x ./stage1 ] || [ ! -x ./stage2 ]; then make stage1 stage2 >/dev/null || exit 1; fi
echo "GPUs visible: $NGPU ($GPU_HOW)"
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/  /'
[ "$NGPU" -ge 2 ] || echo "note: one GPU — stage 2 runs its 2 logical devices on it; PyTorch DataParallel is skipped"

# 1. calibration -----------------------------------------------------------------------------------
echo "=== calibrate_dp.py ($(date +%T))"
DP_FLAGS="" DP_SRC="stage 2's built-in (calibrated) defaults (calibration failed: see $OUT/calibrate.log)"
if timeout 180 python3 tests/torch/calibrate_dp.py --model resnet18 --repeat 100 --batch 128 > "$OUT/calibrate.log" 2>&1; then
  DP_FLAGS=$(grep '^flags:' "$OUT/calibrate.log" | tail -n 1 | sed 's/^flags: //')
  [ -n "$DP_FLAGS" ] && DP_SRC="calibrated on this machine"
fi
cat "$OUT/calibrate.log"
echo "stage 2's modelled Python and planning cost: ${DP_FLAGS:-defaults} ($DP_SRC)"

# 2.–3. the stages ---------------------------------------------------------------------------------
# Synthetic data enough for the steps at the largest global batch (256) inside one epoch; one small
# evaluation at the end. The input pipeline is real (loader threads, pinned memory, async copies).
run() { # name steps binary [flags...]
  local name=$1 steps=$2 bin=$3
  shift 3
  echo "=== $name: ./$bin $* ($(date +%T))"
  timeout 150 "./$bin" --model resnet18 --steps "$steps" --epochs 1000 --schedule const --progress off \
    --log-every 100000 --workers 4 --pin-memory --train-size $(((steps + 2) * 256)) --test-size 512 \
    --report "$OUT/$name.jsonl" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  if [ $rc -ne 0 ]; then
    echo "  FAILED (exit $rc); last lines of $OUT/$name.log:"
    tail -n 5 "$OUT/$name.log" | sed 's/^/  /'
  else
    grep -E '^(summary:|  forward.s convolution planning)' "$OUT/$name.log" | sed 's/^/  /'
  fi
}
# Stage 2 runs NCHW without CUDA graphs (common/dp_python.c): its one-GPU reference does too.
EAGER="--layout nchw --no-cuda-graph"
# --no-python refuses the modelled Python's flags (they would be ignored), so its row keeps the
# calibrated planning charges (--dp-plan-us, --dp-plan-bench-us) only: planning is not Python.
NOPY_FLAGS=$(printf '%s' "$DP_FLAGS" | sed -E 's/--gil-[a-z-]+ [^ ]+ ?//g')
# shellcheck disable=SC2086 # DP_FLAGS, NOPY_FLAGS and EAGER are lists of flags
{
  run stage1 "$STEPS" stage1 --batch-size 128 $EAGER
  run stage2 "$STEPS" stage2 --gpus 2 --batch-size 128 $DP_FLAGS
  run stage2_pool "$STEPS" stage2 --gpus 2 --batch-size 128 $DP_FLAGS --dp-thread-pool
  run stage2_pool_nopy "$STEPS" stage2 --gpus 2 --batch-size 128 $NOPY_FLAGS --dp-thread-pool --no-python
  run stage1_bench "$STEPS" stage1 --batch-size 128 $EAGER --cudnn-benchmark
  run stage2_bench "$SLOW_STEPS" stage2 --gpus 2 --batch-size 128 $DP_FLAGS --cudnn-benchmark
  run stage2_pool_bench "$STEPS" stage2 --gpus 2 --batch-size 128 $DP_FLAGS --dp-thread-pool --cudnn-benchmark
  run stage2_b32 "$MEM_STEPS" stage2 --gpus 2 --batch-size 32 $DP_FLAGS
  run stage2_adam "$MEM_STEPS" stage2 --gpus 2 --batch-size 128 $DP_FLAGS --optimizer adam --lr 1e-3
}

# 4. PyTorch ---------------------------------------------------------------------------------------
echo "=== PyTorch: new threads against warm ones, nn.DataParallel stock and pooled ($(date +%T))"
timeout 240 python3 tests/torch/dp_thread_cost.py --model resnet18 --batch 128 --steps 30 --new-threads 5 \
  > "$OUT/pytorch_threads.jsonl" 2> "$OUT/pytorch_threads.log" \
  || { echo "  dp_thread_cost.py failed (exit $?):"; tail -n 5 "$OUT/pytorch_threads.log" | sed 's/^/  /'; }
echo "=== PyTorch: per-GPU peak memory ($(date +%T))"
for cfg in "128 sgd" "32 sgd" "128 adam"; do
  read -r b opt <<< "$cfg"
  timeout 120 python3 tests/torch/bench_dp.py --models resnet18 --batch "$b" --optimizer "$opt" --steps "$MEM_STEPS" \
    --warmup 5 >> "$OUT/pytorch_mem.jsonl" 2>> "$OUT/pytorch_mem.log" \
    || { echo "  bench_dp.py --batch $b --optimizer $opt failed:"; tail -n 5 "$OUT/pytorch_mem.log" | sed 's/^/  /'; }
done

# 5. report ----------------------------------------------------------------------------------------
for name in stage2 stage2_pool stage2_bench; do
  f="$OUT/$name.log"
  [ -f "$f" ] || continue
  echo "=== $name: DataParallel notes, phases and GIL"
  grep -E '^(note|DataParallel:|convolution plans|modelled Python)' "$f"
  sed -n '/^DataParallel phases/,/^summary:/p' "$f" | grep -v '^summary:'
done
python3 - "$OUT" "$NGPU" "$DP_SRC" "$STEPS" <<'PY'
import json, os, sys
sys.path.insert(0, "tests")
import bench_flops as fl
out, ngpu, src, steps = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]

def records(name):
    try:
        return [json.loads(l) for l in open(os.path.join(out, name)) if l.strip().startswith("{")]
    except OSError:
        return []

def stage(name):
    rs = records(name + ".jsonl")
    s = [r for r in rs if r.get("type") == "summary"]
    p = [r for r in rs if r.get("type") == "phases"]
    return (s[-1] if s else None), (p[-1] if p else None)

def mem(b):
    return f"{b / 2**30:6.2f} GiB" if b >= 2**30 else f"{b / 2**20:6.0f} MiB"

def peaks(ps):
    g1 = mem(ps[1]) if len(ps) > 1 else f"{'-':>10s}"
    ratio = f"{ps[0] / ps[1]:9.2f}" if len(ps) > 1 and ps[1] else f"{'-':>9s}"
    return f"{mem(ps[0])} {g1} {ratio}"

threads = {r["cudnn_benchmark"]: r for r in records("pytorch_threads.jsonl") if r.get("type") == "dp_thread_cost"}
rel = {}  # what the checks compare
shared = " (2 logical devices on 1 GPU)" if ngpu < 2 else ""
print()
print(f"DataParallel vs one GPU — ResNet-18, batch 128 per GPU, fp32, median ms/iter (warm-up excluded); "
      f"stage 2's Python and planning cost: {src}{shared}")
hdr = (f"{'':2s}{'run':50s} {'ms/iter':>8s} {'img/s':>8s} {'x 1 GPU':>8s} {'plan/thr':>9s} "
       f"{'GPU0 peak':>10s} {'GPU1 peak':>10s} {'GPU0/GPU1':>9s} {fl.HEAD}  phases")
blank = " " * (1 + 9 + 1 + 31)  # under plan/thr and the three memory columns
print(hdr)
print("-" * len(hdr))
for bench in (False, True):
    tag = "_bench" if bench else ""
    print(f"cudnn.benchmark {'on' if bench else 'off'}")
    base, _ = stage("stage1" + tag)
    rows = [("stage1, 1 GPU, NCHW eager" + (" --cudnn-benchmark" if bench else ""), "stage1" + tag),
            ("stage2 --gpus 2 (new threads every step)", "stage2" + tag),
            ("stage2 --gpus 2 --dp-thread-pool", "stage2_pool" + tag)]
    if not bench:
        rows.append(("stage2 --gpus 2 --dp-thread-pool --no-python", "stage2_pool_nopy"))
    for label, name in rows:
        s, p = stage(name)
        if not s:
            if os.path.exists(os.path.join(out, name + ".log")):
                print(f"  {label:50s} failed: see {out}/{name}.log")
            continue
        r = s["img_per_s"] / base["img_per_s"] if base and name != "stage1" + tag else 1.0
        rel[name] = r
        plan = f"{p['plan_ms_per_thread']:7.2f}ms" if p and "plan_ms_per_thread" in p else f"{'-':>9s}"
        ph = f"{'add up' if p['adds_up'] else 'DO NOT add up'} ({p['sum_ms']:.2f} vs {p['step_ms']:.2f} ms)" if p else "-"
        print(f"  {label:50s} {s['ms_per_iter_median']:8.2f} {s['img_per_s']:8.0f} {r:7.2f}x {plan} "
              f"{peaks(s['peak_mem_bytes'])} {fl.cols(fl.stage(s))}  {ph}")
    t = threads.get(bench)
    if not t:
        print(f"  {'PyTorch':50s} not measured (see {out}/pytorch_threads.log)")
        continue
    b = int(t["batch_size"])
    print(f"  {'PyTorch 1 GPU (torch ' + t['torch'] + ')':50s} {t['single_ms']:8.2f} {1e3 * b / t['single_ms']:8.0f} "
          f"{1.0:7.2f}x{blank}{fl.cols(fl.like(base, t['single_ms'], b))}")
    for key, label in (("dp_stock", "PyTorch nn.DataParallel, stock"), ("dp_pool", "PyTorch nn.DataParallel, persistent 2-thread pool")):
        if key + "_ms" not in t:
            print(f"  {label:50s} skipped: needs 2 GPUs")
            continue
        rel[f"torch_{key}{tag}"] = t[key + "_vs_single"]
        print(f"  {label:50s} {t[key + '_ms']:8.2f} {2e3 * b / t[key + '_ms']:8.0f} {t[key + '_vs_single']:7.2f}x"
              f"{blank}{fl.cols(fl.like(base, t[key + '_ms'], 2 * b, gpus=2))}")
    print(f"  {'PyTorch forward: warm / new thread first / second':50s} {t['warm_ms']:.2f} / {t['new_first_ms']:.2f} / "
          f"{t['new_second_ms']:.2f} ms (first: {t['new_first_range_ms'][0]:.1f}–{t['new_first_range_ms'][1]:.1f})")

print("GPU0 against GPU1, peak memory (the whole batch, the gathered logits, the master's gradients and the "
      "optimizer state live on GPU0)")
mem_pt = [r for r in records("pytorch_mem.jsonl") if r.get("type") == "summary" and r.get("mode") == "dp"]
for label, name, b, opt in (("stage2, batch 32 per GPU, SGD", "stage2_b32", 32, "sgd"),
                            ("stage2, batch 128 per GPU, SGD", "stage2", 128, "sgd"),
                            ("stage2, batch 128 per GPU, Adam", "stage2_adam", 128, "adam")):
    s, _ = stage(name)
    print(f"  {label:50s} {'':37s} " + (peaks(s["peak_mem_bytes"]) if s else "not measured"))
    pt = [r for r in mem_pt if r["batch_size"] == b and r.get("optimizer", "sgd") == opt]
    if pt:
        print(f"  {'  PyTorch nn.DataParallel, same':50s} {'':37s} {peaks(pt[-1]['peak_mem_bytes'])}")
    else:
        print(f"  {'  PyTorch nn.DataParallel, same':50s} not measured ({'needs 2 GPUs' if ngpu < 2 else 'see ' + out + '/pytorch_mem.log'})")

print("Where stage 2's loss goes (ms per step, cudnn.benchmark off): default − pool = the per-thread plan "
      "cache; pool − pool --no-python = the GIL and Python; pool --no-python − stage1 = GPU0's serial work "
      "(scatter, replicate, gather, reduce, optimizer) and the copies")
ms = {n: stage(n)[0]["ms_per_iter_median"] for n in ("stage1", "stage2", "stage2_pool", "stage2_pool_nopy") if stage(n)[0]}
if len(ms) == 4:
    loss = ms["stage2"] - ms["stage1"]
    parts = [("plan cache", ms["stage2"] - ms["stage2_pool"]), ("GIL and Python", ms["stage2_pool"] - ms["stage2_pool_nopy"]),
             ("GPU0's serial work", ms["stage2_pool_nopy"] - ms["stage1"])]
    print("  " + ", ".join(f"{n} {v:.2f} ms ({100 * v / loss:.0f}%)" for n, v in parts) + f" of {loss:.2f} ms")
else:
    print("  incomplete: a run failed")

print("Issue 10's checks (2 GPUs):")
def check(what, ok):
    print(f"  {'PASS' if ok else 'FAIL'}  {what}")
if ngpu < 2:
    print("  not applicable: one GPU (no PyTorch DataParallel to compare with)")
else:
    def within(a, b, tol):
        return a is not None and b is not None and abs(a / b - 1) <= tol
    g = rel.get
    check(f"default stage 2 {g('stage2', float('nan')):.2f}x within ±25% of stock {g('torch_dp_stock', float('nan')):.2f}x",
          within(g("stage2"), g("torch_dp_stock"), 0.25))
    check(f"--dp-thread-pool {g('stage2_pool', float('nan')):.2f}x within ±15% of pooled {g('torch_dp_pool', float('nan')):.2f}x",
          within(g("stage2_pool"), g("torch_dp_pool"), 0.15))
    check(f"--cudnn-benchmark collapses: {g('stage2_bench', float('nan')):.3f}x <= 0.1x (PyTorch stock {g('torch_dp_stock_bench', float('nan')):.3f}x)",
          g("stage2_bench") is not None and g("stage2_bench") <= 0.1)
    check(f"--dp-thread-pool --cudnn-benchmark does not: {g('stage2_pool_bench', float('nan')):.2f}x (PyTorch pooled {g('torch_dp_pool_bench', float('nan')):.2f}x)",
          g("stage2_pool_bench") is not None and g("stage2_pool_bench") > 0.1)
print("x 1 GPU: images/s relative to the same family's one-GPU run at the same cudnn.benchmark setting. "
      "plan/thr: forward convolution planning per replica thread per step (ours: real cuDNN calls + charge). "
      "TFLOP/s: model FLOPs per step (conv + linear, forward + backward) over the median step; of peak: of the "
      "GPUs' dense peak for the convolutions' math (tests/bench_flops.py).")
PY
