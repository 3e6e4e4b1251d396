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
# wrote before); the table is printed last (tests/bench_stage3_table.py, which reads that folder). STEPS
# (default 300) timed steps per run. Needs a GPU.
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

python3 tests/bench_stage3_table.py "$OUT" "$MODE" "$NGPU"
