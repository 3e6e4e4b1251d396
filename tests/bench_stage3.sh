#!/usr/bin/env bash
# bench_stage3.sh — stage 1 vs stage 3 (overlap, --no-overlap, --sync-bn) vs PyTorch DDP (and with SyncBatchNorm), in one run:
#   bash tests/bench_stage3.sh          (./stage1 and ./stage3 built; PyTorch for its rows)
#
# All train ResNet-18 (CIFAR layout) at batch 128 per GPU, SGD(momentum 0.9, wd 5e-4), fp32 with
# TF32 allowed in convolutions; the stages run their real input pipeline (4 loader threads, pinned
# memory), PyTorch's batches sit on the GPU already. Scaling efficiency = img/s with N GPUs / (N ×
# img/s on one GPU), each framework against itself. Exposed communication = time the compute stream
# waited for communication (stage 3's "comm_summary" record), as % of the median step. TFLOP/s and
# its fraction of the GPUs' peak: tests/bench_flops.py.
# With 2 GPUs, stage 1 also runs on the second one (DDP goes at the slower GPU's pace) and on both at
# once as two independent runs (what two busy GPUs cost without communication), and the table is
# followed by stage 3's per-rank line: each rank's forward + backward and how long it then waited,
# and by that cost split per rank against a one-process stage 3 (DDP's machinery with no peer).
# Then a `torchrun --no-python` launch of two ./stage3 workers must train exactly like ./stage3's
# own launcher. With one GPU, the stage 3 rows (and PyTorch's, with gloo) run two workers sharing
# it through --comm host: the mechanics are all there, the timings then say nothing about scaling.
# Logs and JSON under $BENCH_OUT (default runs/bench_stage3: a new or empty folder, or one this script
# wrote before); the table is printed last. STEPS (default 300) timed steps per run. Needs a GPU.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
. tests/bench_common.sh
bench_ints "[STEPS=N] [BENCH_OUT=DIR] bash tests/bench_stage3.sh (or make bench3)" STEPS
# NVLink multicast stays off in every process below (torchrun's workers included): it is not needed
# here, and on shared hosts it can take the GPUs out of service.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${BENCH_OUT:-runs/bench_stage3}
STEPS=${STEPS:-300}
bench_need_gpu tests/bench_stage3.sh '`make compare QUICK=1`'
bench_out_dir BENCH_OUT "$OUT" runs/bench_stage3 bench_stage3 '*.jsonl' '*.json' '*.ran' '*.log'
[ -x ./stage1 ] && [ -x ./stage3 ] || make stage1 stage3 || exit 1

. tests/bench_ddp_env.sh # HAVE_TORCH, COMM, BACKEND, MODE, TORCHRUN, PORT, next_port, log

# name, stage binary, extra flags...: the timed run (median over the steps after warm-up)
run_stage() {
    local name=$1 bin=$2; shift 2
    next_port
    [ "$bin" = stage3 ] && set -- --master-port "$PORT" "$@"
    timeout -k 10 180 "./$bin" --model resnet18 --batch-size 128 --workers 4 --pin-memory \
        --steps $((STEPS + 5)) --epochs 100 --test-size 2000 --schedule const --progress off --log-every 1000 \
        --report "$OUT/$name.jsonl" "$@" > "$OUT/$name.log" 2>&1
    local rc=$?
    [ $rc = 0 ] || echo "$name FAILED (exit $rc): see $OUT/$name.log"
    grep -E "^(summary|comm over|  compute|  per rank)" "$OUT/$name.log"
}

log "stage 1, one GPU";            run_stage stage1 stage1
log "stage 3, $MODE, --comm $COMM, overlap"; run_stage stage3 stage3 --nproc-per-node 2 --comm "$COMM"
log "stage 3, $MODE, --comm $COMM, --no-overlap"; run_stage stage3_nooverlap stage3 --nproc-per-node 2 --comm "$COMM" --no-overlap
# SyncBatchNorm's price: two waited-for collectives per batch-norm layer, and no CUDA graphs
log "stage 3, $MODE, --comm $COMM, --sync-bn"; run_stage stage3_syncbn stage3 --nproc-per-node 2 --comm "$COMM" --sync-bn
# One-GPU step times vary by several percent from run to run on a shared machine, so stage 1 is
# measured twice, before and after stage 3, and the FASTER run is the reference: scaling is then
# never flattered by one slow single-GPU measurement.
log "stage 1, one GPU, again";      run_stage stage1_again stage1
# DDP's machinery with no peer: one process, NCCL on one rank (nothing to wait for, every mark, hook,
# stream hop and graph split still there). What it adds to stage 1 is the part of the two-GPU cost
# that one GPU can measure; its forward + backward is the baseline each rank's is compared with.
log "stage 3, one process (no peer)"; CUDA_VISIBLE_DEVICES=$(echo "${CUDA_VISIBLE_DEVICES:-0}" | cut -d, -f1) \
    run_stage stage3_one stage3 --nproc-per-node 1 --comm nccl
# DDP goes at its slowest GPU's pace: stage 1 once more, on the second GPU, says whether they differ.
if [ "$NGPU" -ge 2 ]; then
    second=$(echo "${CUDA_VISIBLE_DEVICES:-0,1}" | cut -d, -f2)
    log "stage 1 on the second GPU ($second)"; CUDA_VISIBLE_DEVICES=$second run_stage stage1_gpu1 stage1
    # The control: two independent stage 1 runs at once, one per GPU — what a second busy GPU (and
    # its process) costs with no communication at all.
    first=$(echo "${CUDA_VISIBLE_DEVICES:-0,1}" | cut -d, -f1)
    log "stage 1 on both GPUs at once, independent runs"
    CUDA_VISIBLE_DEVICES=$first run_stage stage1_both0 stage1 & CUDA_VISIBLE_DEVICES=$second run_stage stage1_both1 stage1
    wait
fi

if [ "$HAVE_TORCH" = 1 ]; then
    log "PyTorch, one GPU"
    timeout -k 10 180 python3 tests/torch/bench_pytorch.py --model resnet18 --batch 128 --steps "$STEPS" --warmup 20 \
        > "$OUT/pytorch1.json" 2> "$OUT/pytorch1.log" || echo "PyTorch one-GPU run FAILED: see $OUT/pytorch1.log"
    log "PyTorch DDP, $MODE ($BACKEND)"
    next_port
    timeout -k 10 240 $TORCHRUN --nproc-per-node 2 --master-port "$PORT" tests/torch/bench_ddp.py --model resnet18 \
        --batch 128 --steps "$STEPS" --warmup 20 --backend "$BACKEND" > "$OUT/pytorch_ddp.json" 2> "$OUT/pytorch_ddp.log" \
        || echo "PyTorch DDP run FAILED: see $OUT/pytorch_ddp.log"
    log "PyTorch DDP + SyncBatchNorm, $MODE ($BACKEND)"
    next_port
    timeout -k 10 240 $TORCHRUN --nproc-per-node 2 --master-port "$PORT" tests/torch/bench_ddp.py --model resnet18 \
        --batch 128 --steps "$STEPS" --warmup 20 --backend "$BACKEND" --sync-bn > "$OUT/pytorch_ddp_syncbn.json" \
        2> "$OUT/pytorch_ddp_syncbn.log" || echo "PyTorch DDP + SyncBatchNorm run FAILED: see $OUT/pytorch_ddp_syncbn.log"
fi

# The same 20 deterministic steps, launched by ./stage3 itself and by torchrun --no-python.
CHECK=(--nproc-per-node 2 --comm "$COMM" --train-size 5120 --test-size 512 --steps 20 --log-every 1
       --deterministic --progress off)
log "./stage3 launcher vs torchrun --no-python"
next_port
timeout -k 10 120 ./stage3 "${CHECK[@]}" --master-port "$PORT" --report "$OUT/check_launcher.jsonl" \
    > "$OUT/check_launcher.log" 2>&1 || echo "launcher check run FAILED: see $OUT/check_launcher.log"
if [ "$HAVE_TORCH" = 1 ]; then
    next_port
    touch "$OUT/check_torchrun.ran"
    # under torchrun every worker needs the job's rendezvous secret (stages/stage3_ddp/README.md)
    STAGE_RDZV_SECRET=$(od -An -N32 -tx1 /dev/urandom | tr -d ' \n') \
    timeout -k 10 180 $TORCHRUN --no-python --nproc-per-node 2 --master-port "$PORT" ./stage3 "${CHECK[@]}" \
        --report "$OUT/check_torchrun.jsonl" > "$OUT/check_torchrun.log" 2>&1 \
        || echo "torchrun check run FAILED: see $OUT/check_torchrun.log"
fi

python3 - "$OUT" "$MODE" "$NGPU" <<'PY'
import json, os, sys
sys.path.insert(0, "tests")
import bench_flops as fl
out, mode, ngpu = sys.argv[1], sys.argv[2], int(sys.argv[3])
shared = ngpu < 2

def records(path, kind):
    try:
        return [json.loads(l) for l in open(path) if l.strip().startswith("{") and f'"type":"{kind}"' in l.replace(" ", "")]
    except OSError:
        return []

def last(path, kind="summary"):
    r = records(path, kind)
    return r[-1] if r else None

GiB = 2**30
s1, s1b, s3, s3n = (last(f"{out}/{n}.jsonl") for n in ("stage1", "stage1_again", "stage3", "stage3_nooverlap"))
if s1 and s1b:
    print(f"stage 1 measured twice: {s1['ms_per_iter_median']:.2f} and {s1b['ms_per_iter_median']:.2f} ms/iter; "
          "the faster is the scaling reference")
    s1 = min(s1, s1b, key=lambda r: r["ms_per_iter_median"])
c3, c3n = last(f"{out}/stage3.jsonl", "comm_summary"), last(f"{out}/stage3_nooverlap.jsonl", "comm_summary")
s3s, c3s = last(f"{out}/stage3_syncbn.jsonl"), last(f"{out}/stage3_syncbn.jsonl", "comm_summary")
pt1, ptd, ptds = last(f"{out}/pytorch1.json"), last(f"{out}/pytorch_ddp.json"), last(f"{out}/pytorch_ddp_syncbn.json")

def mem(r):
    p = r["peak_mem_bytes"]
    if len(p) == 1:
        return f"{p[0] / GiB:.2f} GiB"
    return f"{max(p) / GiB:.2f}/{min(p) / GiB:.2f} GiB ({max(p) / min(p):.3f})"

def eff(r, base):
    if not (r and base) or shared:
        return "n/a (1 GPU)" if shared and r and base else "-"
    return f"{100 * r['img_per_s'] / (r['world_size'] * base['img_per_s']):.1f}%"

def flops(r):  # a stage's own record; PyTorch's rows with stage 1's FLOPs per image and peak
    if "achieved_tflops" in r:
        return fl.stage(r)
    world = r.get("world_size", 1)
    return fl.like(s1, r["ms_per_iter_median"], world * r["batch_size"] * r.get("accum_steps", 1),
                   gpus=1 if shared else world)

def exposed(c):
    return f"{c['exposed_ms_median']:.3f} ms ({c['exposed_pct']:.1f}%)" if c else "-"

comm = "nccl" if not shared else "host"
rows = [("stage 1, one GPU", s1, None, None),
        (f"stage 3, {mode}, {comm}, overlap", s3, s1, c3),
        (f"stage 3, {mode}, {comm}, --no-overlap", s3n, s1, c3n),
        (f"stage 3, {mode}, {comm}, --sync-bn", s3s, s1, c3s)]
if pt1:
    rows.append((f"PyTorch {pt1['torch']}, one GPU", pt1, None, None))
if ptd:
    ptd.setdefault("world_size", len(ptd["peak_mem_bytes"]))
    rows.append((f"PyTorch DDP, {mode}, {ptd['backend']}", ptd, pt1, None))
if ptds:
    ptds.setdefault("world_size", len(ptds["peak_mem_bytes"]))
    rows.append((f"PyTorch DDP + SyncBatchNorm, {ptds['backend']}", ptds, pt1, None))

# torchrun --no-python ./stage3 against ./stage3's own launcher
a, b = records(f"{out}/check_launcher.jsonl", "step"), records(f"{out}/check_torchrun.jsonl", "step")
if not os.path.exists(f"{out}/check_torchrun.ran"):
    check = "torchrun --no-python ./stage3: not run (no PyTorch, so no torchrun)"
elif a and len(a) == len(b):
    diff = max(abs(x["loss"] - y["loss"]) / max(abs(x["loss"]), 1e-30) for x, y in zip(a, b))
    check = (f"torchrun --no-python ./stage3, 2 workers ({mode}): {len(b)} steps, losses equal ./stage3's own "
             f"launcher's to {diff:.2g} (relative): " + ("PASS" if diff <= 1e-5 else "FAIL"))
else:
    check = f"torchrun --no-python ./stage3: FAIL ({len(a)} vs {len(b)} logged steps; see {out}/check_*.log)"

print()
print(f"{'ResNet-18, batch 128 per GPU, fp32':48s} {'ms/iter':>8s} {'img/s':>8s} {'scaling':>16s} {'exposed comm':>18s} "
      f"{fl.HEAD}  peak mem per GPU (max/min)")
for name, r, base, c in rows:
    if not r:
        print(f"{name:48s} {'failed':>8s}")
        continue
    print(f"{name:48s} {r['ms_per_iter_median']:8.2f} {r['img_per_s']:8.0f} {eff(r, base):>16s} {exposed(c):>18s} "
          f"{fl.cols(flops(r))}  {mem(r)}")
print("TFLOP/s: model FLOPs per step (conv + linear, forward + backward) over the median step; of peak: of the GPUs' "
      "dense peak for the convolutions' math (tests/bench_flops.py)" + (f", {s1['peak_tflops']} TFLOP/s per GPU "
      f"({s1['peak_math']}, {s1['peak_source']})" if s1 and s1.get("peak_tflops") else ""))
print(check)
if s3 and s3s:
    line = (f"SyncBatchNorm's price: stage 3 {s3['ms_per_iter_median']:.2f} -> {s3s['ms_per_iter_median']:.2f} ms/iter "
            f"({s3s['ms_per_iter_median'] / s3['ms_per_iter_median']:.2f}x: the exchanges, and no CUDA graphs)")
    if ptd and ptds:
        line += (f"; PyTorch DDP {ptd['ms_per_iter_median']:.2f} -> {ptds['ms_per_iter_median']:.2f} ms/iter "
                 f"({ptds['ms_per_iter_median'] / ptd['ms_per_iter_median']:.2f}x)")
    print(line)
s1g1, pr = last(f"{out}/stage1_gpu1.jsonl"), last(f"{out}/stage3.jsonl", "comm_per_rank")
if s1g1 and s1:
    print(f"stage 1 on the second GPU: {s1g1['ms_per_iter_median']:.2f} ms/iter (on the first: "
          f"{s1['ms_per_iter_median']:.2f}); DDP goes at the slower one's pace")
b0, b1 = last(f"{out}/stage1_both0.jsonl"), last(f"{out}/stage1_both1.jsonl")
if b0 and b1:
    print(f"stage 1 on both GPUs at once, independent runs: {b0['ms_per_iter_median']:.2f} / "
          f"{b1['ms_per_iter_median']:.2f} ms/iter (no communication: what two busy GPUs cost by themselves)")
one, pr1 = last(f"{out}/stage3_one.jsonl"), last(f"{out}/stage3_one.jsonl", "comm_per_rank")
if one and s1:
    print(f"stage 3 with one process (no peer): {one['ms_per_iter_median']:.2f} ms/iter, "
          f"{1e3 * (one['ms_per_iter_median'] - s1['ms_per_iter_median']):+.0f} us over stage 1 (DDP's marks, hooks, "
          "stream hops and graph splits alone)")
if pr:
    print("stage 3 per rank, ms: forward+backward " + " / ".join(f"{v:.3f}" for v in pr["fwd_bwd_ms_per_rank"]) +
          " | waited after backward " + " / ".join(f"{v:.3f}" for v in pr["exposed_backward_ms_per_rank"]) +
          " | waited for buffers " + " / ".join(f"{v:.3f}" for v in pr["bcast_ms_per_rank"]))
# Where the two-GPU step's extra time goes, per rank: the machinery (one process against stage 1), the
# forward + backward stretched by the other rank's all-reduces running beside it (against the one-process
# run's), and the waits after backward and for the buffers; the rest is unattributed.
if s3 and s1 and one and pr and pr1 and not shared:
    extra, mach = s3["ms_per_iter_median"] - s1["ms_per_iter_median"], one["ms_per_iter_median"] - s1["ms_per_iter_median"]
    parts = []
    for r, (fb, ex, bc) in enumerate(zip(pr["fwd_bwd_ms_per_rank"], pr["exposed_backward_ms_per_rank"], pr["bcast_ms_per_rank"])):
        grow, wait = fb - pr1["fwd_bwd_ms_per_rank"][0], ex + bc - pr1["exposed_backward_ms_per_rank"][0]
        parts.append(f"rank {r}: forward+backward {1e3 * grow:+.0f}, waits {1e3 * wait:+.0f}, "
                     f"rest {1e3 * (extra - mach - grow - wait):+.0f}")
    print(f"two-GPU cost over stage 1, us/step: {1e3 * extra:.0f} = machinery {1e3 * mach:.0f} + per rank (" +
          "; ".join(parts) + ")")
if s3 and s1 and c3 and not shared:
    e = s3["img_per_s"] / (s3["world_size"] * s1["img_per_s"])
    p = s3["peak_mem_bytes"]
    print(f"goals: scaling >= 97%: {'PASS' if e >= 0.97 else 'FAIL'} ({100 * e:.1f}%) | exposed comm <= 5% of the step: "
          f"{'PASS' if c3['exposed_pct'] <= 5 else 'FAIL'} ({c3['exposed_pct']:.1f}%) | memory max/min <= 1.05: "
          f"{'PASS' if max(p) / min(p) <= 1.05 else 'FAIL'} ({max(p) / min(p):.3f})")
elif shared:
    print("goals: scaling and exposed-communication goals need 2 GPUs; rerun this script on a 2-GPU machine")
PY
