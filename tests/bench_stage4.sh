#!/usr/bin/env bash
# bench_stage4.sh — gradient accumulation (stage 4) against stage 1, stage 3 and PyTorch DDP, in one run:
#   bash tests/bench_stage4.sh          (./stage1, ./stage3, ./stage4 built; PyTorch for its rows)
#
# All train ResNet-18 (CIFAR layout) at 128 images per GPU per forward, SGD(momentum 0.9, wd 5e-4),
# fp32 with TF32 allowed in convolutions; the stages run their real input pipeline (4 loader threads,
# pinned memory), PyTorch's batches sit on the GPU already. Rows:
#   stage 1 (one GPU, measured before and after the rest; the faster is the reference), stage 3,
#   stage 4 with K = 4 (no_sync), stage 4 K = 4 --sync-each-micro-step (no no_sync: the experiment),
#   stage 4 at --batch-size 512 --accum-steps 1 (the same effective batch in one forward: memory),
#   PyTorch on one GPU, PyTorch DDP with K = 4 and no_sync, and without no_sync.
# Columns: ms per optimizer step; img/s (every micro-batch counted: K × 128 × 2 per step); scaling per
# image = img/s / (2 × stage 1's img/s), each framework against itself; all-reduce bytes per image
# (gradient bytes all-reduced per rank / images the job processed) and its ratio to stage 3's — 1/K
# with no_sync; exposed communication per optimizer step; achieved TFLOP/s and its fraction of the
# GPUs' peak (tests/bench_flops.py); peak memory per GPU (max/min).
# With one GPU, the two-worker rows share it through --comm host (PyTorch's with gloo): the mechanics
# and the counts are all there, the timings then say nothing about scaling.
# Logs and JSON under $BENCH_OUT (default runs/bench_stage4: a new or empty folder, or one this script
# wrote before); the table is printed last.
# STEPS, STEPS4 (stage 4's optimizer steps), K override the defaults; BENCH_FLAGS is appended to every
# stage's flags (a smoke test of this script without a GPU: BENCH_FLAGS="--device cpu --model tiny
# --train-size 4096 --test-size 64" STEPS=12 bash tests/bench_stage4.sh). Without --device cpu in
# BENCH_FLAGS it needs a GPU.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
. tests/bench_common.sh
bench_ints "[STEPS=N] [STEPS4=N] [K=N] [BENCH_FLAGS=\"...\"] [BENCH_OUT=DIR] bash tests/bench_stage4.sh (or make bench4)" \
    STEPS STEPS4 K
# NVLink multicast stays off in every process below (torchrun's workers included): it is not needed
# here, and on shared hosts it can take the GPUs out of service.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${BENCH_OUT:-runs/bench_stage4}
STEPS=${STEPS:-300}    # the stage 1 / stage 3 rows run STEPS + 5 optimizer steps: the first 5 are warm-up, and
                       # each epoch's last step is not timed either, so the median is over a few fewer than STEPS
K=${K:-4}
STEPS4=${STEPS4:-$(( (STEPS + K - 1) / K * 2 ))} # stage 4 steps are K× longer: fewer, still hundreds of micro-steps
if [[ " ${BENCH_FLAGS:-} " =~ [[:space:]]--device(=|[[:space:]]+)cpu[[:space:]] ]]; then
    bench_gpus # the CPU smoke test: no GPU needed
else
    bench_need_gpu tests/bench_stage4.sh '`make compare QUICK=1`, or its CPU smoke test `BENCH_FLAGS="--device cpu --model tiny --train-size 4096 --test-size 64" STEPS=12 bash tests/bench_stage4.sh`,'
fi
bench_out_dir BENCH_OUT "$OUT" runs/bench_stage4 bench_stage4 '*.jsonl' '*.json' '*.log'
[ -x ./stage1 ] && [ -x ./stage3 ] && [ -x ./stage4 ] || make stage1 stage3 stage4 || exit 1

. tests/bench_ddp_env.sh # HAVE_TORCH, COMM, BACKEND, MODE, TORCHRUN, PORT, next_port, log

# name, steps, stage binary, extra flags...: the timed run (median over the optimizer steps after warm-up)
run_stage() {
    local name=$1 steps=$2 bin=$3; shift 3
    next_port
    [ "$bin" != stage1 ] && set -- --master-port "$PORT" --nproc-per-node 2 --comm "$COMM" "$@"
    timeout -k 10 300 "./$bin" --model resnet18 --batch-size 128 --workers 4 --pin-memory \
        --steps $((steps + 5)) --epochs 100 --test-size 2000 --schedule const --progress off --log-every 1000 \
        --report "$OUT/$name.jsonl" "$@" ${BENCH_FLAGS:-} > "$OUT/$name.log" 2>&1
    local rc=$?
    [ $rc = 0 ] || echo "$name FAILED (exit $rc): see $OUT/$name.log"
    grep -E "^(summary|comm over|  counts|  compute)" "$OUT/$name.log"
}

log "stage 1, one GPU";                         run_stage stage1 "$STEPS" stage1
log "stage 3, $MODE";                           run_stage stage3 "$STEPS" stage3
log "stage 4, $MODE, K=$K (no_sync)";           run_stage stage4 "$STEPS4" stage4 --accum-steps "$K"
log "stage 4, $MODE, K=$K, --sync-each-micro-step"
run_stage stage4_sync_each "$STEPS4" stage4 --accum-steps "$K" --sync-each-micro-step
log "stage 4, $MODE, --batch-size $((128 * K)) --accum-steps 1 (the same effective batch in one forward)"
run_stage stage4_big_batch "$STEPS4" stage4 --accum-steps 1 --batch-size $((128 * K))
# One-GPU step times vary by several percent between runs on a shared machine: stage 1 again, and the
# faster of the two is the reference, so scaling is never flattered by one slow single-GPU run.
log "stage 1, one GPU, again";                  run_stage stage1_again "$STEPS" stage1

if [ "$HAVE_TORCH" = 1 ] && [ "$NGPU" -ge 1 ]; then
    log "PyTorch, one GPU"
    timeout -k 10 180 python3 tests/torch/bench_pytorch.py --model resnet18 --batch 128 --steps "$STEPS" --warmup 20 \
        > "$OUT/pytorch1.json" 2> "$OUT/pytorch1.log" || echo "PyTorch one-GPU run FAILED: see $OUT/pytorch1.log"
    for v in no_sync sync_each; do
        log "PyTorch DDP, $MODE ($BACKEND), K=$K, $v"
        next_port
        timeout -k 10 300 $TORCHRUN --nproc-per-node 2 --master-port "$PORT" tests/torch/bench_ddp.py --model resnet18 \
            --batch 128 --steps "$STEPS4" --warmup 10 --backend "$BACKEND" --accum-steps "$K" \
            $([ $v = sync_each ] && echo --sync-each-micro-step) > "$OUT/pytorch_ddp_$v.json" 2> "$OUT/pytorch_ddp_$v.log" \
            || echo "PyTorch DDP ($v) run FAILED: see $OUT/pytorch_ddp_$v.log"
    done
fi

python3 - "$OUT" "$MODE" "$NGPU" "$K" <<'PY'
import json, sys
sys.path.insert(0, "tests")
import bench_flops as fl
out, mode, ngpu, K = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
shared = ngpu < 2
GiB, MiB = 2**30, 2**20

def last(path, kind="summary"):
    try:
        recs = [json.loads(l) for l in open(path) if l.strip().startswith("{")]
    except OSError:
        return None
    recs = [r for r in recs if r.get("type") == kind]
    return recs[-1] if recs else None

run = {n: last(f"{out}/{n}.jsonl") for n in
       ("stage1", "stage1_again", "stage3", "stage4", "stage4_sync_each", "stage4_big_batch")}
comm = {n: last(f"{out}/{n}.jsonl", "comm_summary") for n in run}
s1 = run["stage1"]
if run["stage1"] and run["stage1_again"]:
    print(f"stage 1 measured twice: {run['stage1']['ms_per_iter_median']:.2f} and "
          f"{run['stage1_again']['ms_per_iter_median']:.2f} ms/step; the faster is the reference")
    s1 = min(run["stage1"], run["stage1_again"], key=lambda r: r["ms_per_iter_median"])
pt1 = last(f"{out}/pytorch1.json")
ptd = {v: last(f"{out}/pytorch_ddp_{v}.json") for v in ("no_sync", "sync_each")}

def images_per_step(r):
    return r.get("accum_steps", 1) * r["batch_size"] * r.get("world_size", len(r["peak_mem_bytes"]))

def bytes_per_image(r):  # gradient bytes all-reduced (per rank) per image the job processed
    if not r or "allreduce_bytes" not in r or not r.get("optimizer_steps"):
        return None
    return r["allreduce_bytes"] / (r["optimizer_steps"] * images_per_step(r))

def mem(r):
    p = r["peak_mem_bytes"]
    return f"{p[0] / GiB:.2f} GiB" if len(p) == 1 else f"{max(p) / GiB:.2f}/{min(p) / GiB:.2f} GiB"

def flops(r):  # a stage's own record; PyTorch's rows with stage 1's FLOPs per image and peak
    if "achieved_tflops" in r:
        return fl.stage(r)
    world = r.get("world_size", len(r["peak_mem_bytes"]))
    return fl.like(s1, r["ms_per_iter_median"], images_per_step(r), gpus=1 if shared else world)

def eff(r, base):
    if not (r and base) or r.get("world_size", 1) < 2:
        return "-"
    if shared:
        return "n/a (1 GPU)"
    return f"{100 * r['img_per_s'] / (r['world_size'] * base['img_per_s']):.1f}%"

b3 = bytes_per_image(run["stage3"])
rows = [("stage 1, one GPU, batch 128", s1, None, None),
        (f"stage 3, {mode}, batch 128", run["stage3"], s1, comm["stage3"]),
        (f"stage 4, {mode}, 128 x K={K}, no_sync", run["stage4"], s1, comm["stage4"]),
        (f"stage 4, {mode}, 128 x K={K}, sync each micro", run["stage4_sync_each"], s1, comm["stage4_sync_each"]),
        (f"stage 4, {mode}, batch {128 * K}, K=1", run["stage4_big_batch"], s1, comm["stage4_big_batch"])]
if pt1:
    rows.append((f"PyTorch {pt1['torch']}, one GPU, batch 128", pt1, None, None))
for v, label in (("no_sync", "no_sync"), ("sync_each", "sync each micro")):
    if ptd[v]:
        rows.append((f"PyTorch DDP, {mode}, 128 x K={K}, {label}", ptd[v], pt1, None))

print()
print(f"{'ResNet-18, fp32, ' + mode:52s} {'ms/step':>8s} {'img/s':>8s} {'scaling':>12s} "
      f"{'AR bytes/img':>13s} {'vs stage 3':>10s} {'exposed/step':>13s} {fl.HEAD}  peak mem per GPU")
for name, r, base, c in rows:
    if not r:
        print(f"{name:52s} {'failed':>8s}")
        continue
    bpi = bytes_per_image(r)
    bpi_s = f"{bpi / 1024:.1f} KiB" if bpi is not None else "-"
    ratio = f"{bpi / b3:.3f}" if bpi is not None and b3 else "-"
    exp = f"{c['exposed_ms_median']:.3f} ms" if c else "-"
    print(f"{name:52s} {r['ms_per_iter_median']:8.2f} {r['img_per_s']:8.0f} {eff(r, base):>12s} "
          f"{bpi_s:>13s} {ratio:>10s} {exp:>13s} {fl.cols(flops(r))}  {mem(r)}")
print("TFLOP/s: model FLOPs per optimizer step (conv + linear, forward + backward, every micro-batch) over the median "
      "step; of peak: of the GPUs' dense peak for the convolutions' math (tests/bench_flops.py)" +
      (f", {s1['peak_tflops']} TFLOP/s per GPU ({s1['peak_math']}, {s1['peak_source']})" if s1 and s1.get("peak_tflops") else ""))

r3, r4, r4s = run["stage3"], run["stage4"], run["stage4_sync_each"]
if r4 and r4s:
    print(f"all-reduce calls: no_sync {r4['allreduce_calls']} in {r4['optimizer_steps']} optimizer steps, "
          f"sync each micro-step {r4s['allreduce_calls']} in {r4s['optimizer_steps']} "
          f"(per step: {r4['allreduce_calls'] / r4['optimizer_steps']:.2f} vs "
          f"{r4s['allreduce_calls'] / r4s['optimizer_steps']:.2f}, x{K} expected)")
goals = []
if r4 and s1 and not shared:
    e = r4["img_per_s"] / (r4["world_size"] * s1["img_per_s"])
    goals.append(f"scaling per image >= 99% of stage 1: {'PASS' if e >= 0.99 else 'FAIL'} ({100 * e:.1f}%)")
if r4 and r3 and b3:
    q = bytes_per_image(r4) / b3
    goals.append(f"all-reduce bytes per image = 1/{K} of stage 3's: {'PASS' if abs(q * K - 1) <= 0.01 else 'FAIL'} "
                 f"({q:.4f})")
if r4 and r3:
    q = max(r4["peak_mem_bytes"]) / max(r3["peak_mem_bytes"])
    goals.append(f"peak memory = stage 3's at the same micro-batch: {'PASS' if abs(q - 1) <= 0.01 else 'FAIL'} "
                 f"({q:.3f})")
print("goals: " + " | ".join(goals) if goals else "goals: not evaluated (runs failed)")
if shared:
    print("goals: scaling needs 2 GPUs; rerun this script on a 2-GPU machine")
PY
