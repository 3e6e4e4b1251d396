#!/usr/bin/env bash
# compare.sh — every stage side by side, as one table: `make compare` (or `make compare QUICK=1`).
#
# Runs each stage that exists in this checkout (stages/stageN_*/) in its default mode, plus the
# variants that carry a lesson — stage 2 --dp-thread-pool, stage 3 --no-overlap, stage 4
# --sync-each-micro-step, stage 5 --amp fp16 and --amp bf16 — with ONE model, ONE per-device batch
# and ONE step count for every row, on what the machine has:
#   2+ GPUs  every visible GPU (GPUS=N to use fewer): stage 2 --gpus N, stages 3–5 --nproc-per-node N
#   1 GPU    two logical devices on it: stage 2 --gpus 2, stages 3–5 --nproc-per-node 2 --comm host
#            (the mechanics are all there; the timings then show no scaling)
#   no GPU   the CPU backend, two devices (threads / processes) on the CPU cores
# Each run writes its JSON-lines --report; tests/compare_table.py reads them and prints the table —
# ms per iteration, images/s, speed-up over stage 1, peak memory per device, exposed communication,
# achieved TFLOP/s and its fraction of the GPUs' peak — and writes it as Markdown and an SVG chart
# into the results folder.
#
# With PyTorch and CUDA importable (and not QUICK), PyTorch's own rows come from the same run at the
# same setting: one GPU and nn.DataParallel (tests/torch/bench_dp.py), DDP and DDP with no_sync
# accumulation (tests/torch/bench_ddp.py). TORCH=0 leaves them out.
#
# Stage 1 runs first and again last (not in QUICK): the faster of the two is the speed-up's reference;
# stage 2's rows use stage 1 in stage 2's setting (NCHW, no CUDA graphs), a row of its own.
# Variables: QUICK=1 (tiny model, a few steps: the CI variant, well under 2 minutes on 2 cores),
#   COMPARE_OUT=DIR (default runs/compare), STEPS=N (timed steps per run after the 5 warm-up steps;
#   default 200 on GPUs, 30 on the CPU, 3 with QUICK=1), GPUS=N, BATCH=N (per GPU, default 128;
#   GPUs only — e.g. BATCH=32, where the fixed costs per step weigh most), TORCH=0,
#   ROW_LIMIT=S (seconds one stage run may take before it is stopped and its row fails; default 60
#   with QUICK=1, else 300), DRY=1 (print the plan and stop), STAGES_DIR / BIN_DIR (where the stage directories and binaries
#   are; the defaults are this checkout — the tests point them at a checkout with a stage missing).
# COMPARE_OUT must be a new or empty folder, or one this script wrote before (it holds the marker
# .written-by-compare): each run deletes its *.jsonl, *.log, … there, so any other folder is refused
# (tests/bench_common.sh). A knob that is not a whole number, or that this machine cannot honour
# (GPUS=4 with 2 GPUs, GPUS or BATCH without a GPU), is refused too, before anything runs.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# NVLink multicast stays off in every process below: not needed here, and on shared hosts it can
# take the GPUs out of service.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
. tests/bench_common.sh
USAGE="[QUICK=1] [STEPS=N] [GPUS=N] [BATCH=N] [TORCH=0] [ROW_LIMIT=S] [DRY=1] [COMPARE_OUT=DIR] bash tests/compare.sh (or make compare …)"
bench_ints "$USAGE" STEPS GPUS BATCH ROW_LIMIT
bench_choice "$USAGE" QUICK 0 1
bench_choice "$USAGE" DRY 0 1
bench_choice "$USAGE" TORCH 0 1 auto
bench_choice "$USAGE" FORCE_CPU 0 1
QUICK=${QUICK:-0}
OUT=${COMPARE_OUT:-runs/compare}
STAGES_DIR=${STAGES_DIR:-stages}
BIN_DIR=${BIN_DIR:-.}
TORCH=${TORCH:-auto}
DRY=${DRY:-0}
GPUS=${GPUS:-}
WARMUP=5 # trainer.h WARMUP_STEPS: the first steps of a run are not timed

# ---- what the machine has -------------------------------------------------------------------------
bench_gpus # NGPU, GPU_HOW
[ "${FORCE_CPU:-0}" = 1 ] && NGPU=0 GPU_HOW="FORCE_CPU=1"
NOTICE=""
# A GPUS the machine cannot honour is refused, never quietly replaced by what it has.
if [ "$NGPU" -ge 2 ]; then
    DEV=cuda; N=${GPUS:-$NGPU}; COMM=(); MODE="$N GPUs"
    RANGE=$([ "$NGPU" -gt 2 ] && echo "2 … $NGPU" || echo 2)
    [ "$N" -le "$NGPU" ] ||
        bench_die "GPUS=$N, but only $NGPU GPUs are visible ($GPU_HOW): give GPUS=$RANGE, or leave GPUS unset for all $NGPU"
    [ "$N" -ge 2 ] ||
        bench_die "GPUS=$N: the multi-device rows need 2 GPUs or more — give GPUS=$RANGE, or leave GPUS unset for all $NGPU"
elif [ "$NGPU" = 1 ]; then
    [ -z "$GPUS" ] || [ "$GPUS" = 1 ] ||
        bench_die "GPUS=$GPUS, but 1 GPU is visible ($GPU_HOW): leave GPUS unset — with one GPU compare runs 2 logical devices on it"
    DEV=cuda; N=2; COMM=(--comm host); MODE="2 logical devices on 1 GPU"
    NOTICE="one GPU is visible: stage 2 runs 2 logical devices on it and stages 3–5 two workers sharing it (--comm host); the mechanics are real, the timings show no scaling"
else
    # No GPU means the CPU backend with 2 devices, QUICK or not: a GPU count has nothing to pick.
    [ -z "$GPUS" ] ||
        bench_die "GPUS=$GPUS, but no GPU is visible ($GPU_HOW): without a GPU compare runs the CPU backend with 2 devices — leave GPUS unset"
    DEV=cpu; N=2; COMM=(--comm host); MODE="CPU backend, 2 devices"
fi
# BATCH is the full GPU runs' per-GPU batch; QUICK and the CPU backend have their own, fixed.
if [ -n "${BATCH:-}" ] && { [ "$QUICK" = 1 ] || [ "$DEV" = cpu ]; }; then
    bench_die "BATCH=$BATCH sets the per-GPU batch of the full GPU runs; $([ "$QUICK" = 1 ] && echo "QUICK=1 uses 16 per device" || echo "the CPU backend uses 32 per device") — leave BATCH unset"
fi

# ---- one setting for every row ------------------------------------------------------------------
if [ "$QUICK" = 1 ]; then
    STEPS=${STEPS:-3}
    # 16 images per device, 1280 training images: stage 4's 4 micro-batches × 2 ranks stay in one epoch
    COMMON=(--model tiny --batch-size 16 --train-size 1280 --test-size 32 --workers 0 --schedule const)
    LIMIT=60
    SETTING="QUICK: tiny model (CPU-sized CNN), batch 16 per device, $STEPS timed steps after $WARMUP warm-up, synthetic data (1280 images), no loader threads, constant lr"
elif [ "$DEV" = cuda ]; then
    STEPS=${STEPS:-200}
    BATCH=${BATCH:-128}
    COMMON=(--model resnet18 --batch-size "$BATCH" --workers 4 --pin-memory --test-size 2000 --schedule const)
    LIMIT=300
    SETTING="ResNet-18 (CIFAR layout), batch $BATCH per GPU, fp32 with TF32 convolutions (stage 5: autocast), cudnn.benchmark off, $STEPS timed steps after $WARMUP warm-up, synthetic data, 4 loader threads, pinned memory"
else
    STEPS=${STEPS:-30}
    COMMON=(--model tiny --batch-size 32 --train-size 4096 --test-size 256 --workers 2 --schedule const)
    LIMIT=300
    SETTING="tiny model (CPU-sized CNN), batch 32 per device, $STEPS timed steps after $WARMUP warm-up, synthetic data, 2 loader threads"
fi
LIMIT=${ROW_LIMIT:-$LIMIT}
COMMON=(--device "$DEV" "${COMMON[@]}" --steps $((STEPS + WARMUP + 1)) --epochs 1000 --log-every 100000 --progress off)

# ---- the plan: name | stage | row label | flags (rows only for the stages that exist) -------------
PLAN=()
add() { PLAN+=("$1|$2|$3|$4"); }
have_stage() { compgen -G "$STAGES_DIR/stage$1_*/" > /dev/null; }
MISSING=()
for s in 1 2 3 4 5; do
    if ! have_stage "$s"; then MISSING+=("$s"); continue; fi
    case $s in
    1) add stage1 1 "stage 1, one device" "" ;;
    2) # Stage 2 runs the model NCHW and launch by launch (common/dp_python.c), as PyTorch's replicas
       # do: its speed-up is over stage 1 run the same way, so that layout and CUDA graphs are not
       # counted as DataParallel's cost.
       have_stage 1 && add stage1_eager 1 "stage 1, NCHW eager (as stage 2 runs)" "--layout nchw --no-cuda-graph"
       add stage2 2 "stage 2, DataParallel" "--gpus $N"
       add stage2_pool 2 "stage 2, DataParallel --dp-thread-pool" "--gpus $N --dp-thread-pool" ;;
    3) add stage3 3 "stage 3, DDP" "--nproc-per-node $N ${COMM[*]}"
       add stage3_nooverlap 3 "stage 3, DDP --no-overlap" "--nproc-per-node $N ${COMM[*]} --no-overlap" ;;
    4) add stage4 4 "stage 4, DDP + accumulation (no_sync)" "--nproc-per-node $N ${COMM[*]}"
       add stage4_sync 4 "stage 4, --sync-each-micro-step" "--nproc-per-node $N ${COMM[*]} --sync-each-micro-step" ;;
    5) add stage5_fp16 5 "stage 5, DDP + AMP fp16" "--nproc-per-node $N ${COMM[*]} --amp fp16"
       add stage5_bf16 5 "stage 5, DDP + AMP bf16" "--nproc-per-node $N ${COMM[*]} --amp bf16" ;;
    esac
done
# One-GPU step times vary by several percent between runs on a shared machine: stage 1 runs again
# last, and the faster of its two runs is the reference of the speed-up column (so no row is
# flattered by one slow stage 1). QUICK runs it once.
[ "$QUICK" != 1 ] && have_stage 1 && add stage1_again 1 "stage 1, one device, again" ""

# Only a folder this script made is cleaned (runs/scaler.jsonl next to it stays the student's); a
# dry run touches nothing.
[ "$DRY" = 1 ] || bench_out_dir COMPARE_OUT "$OUT" runs/compare compare \
    '*.jsonl' '*.log' plan.tsv meta.txt 'pytorch*.json' compare.md compare.svg
echo "compare: $MODE | $SETTING"
[ -n "$NOTICE" ] && echo "notice: $NOTICE"
[ ${#MISSING[@]} -gt 0 ] && echo "compare: not in this checkout (no $STAGES_DIR/stageN_*/): stage ${MISSING[*]}"
if [ "$DRY" = 1 ]; then
    for p in "${PLAN[@]}"; do IFS='|' read -r name st label flags <<< "$p"; echo "plan: $name: ./stage$st $flags"; done
    exit 0
fi

{
    echo "mode=$MODE"
    echo "device=$DEV"
    echo "devices=$N"
    echo "gpus=$([ "$DEV" = cuda ] && { [ "$NGPU" -ge 2 ] && echo "$N" || echo 1; } || echo 0)" # physical GPUs of a multi-device row
    echo "steps=$STEPS"
    echo "setting=$SETTING"
    echo "notice=$NOTICE"
    echo "missing=${MISSING[*]}"
    echo "flags=${COMMON[*]}"
    echo "command=make compare$([ "$QUICK" = 1 ] && echo " QUICK=1")"
    [ "$DEV" = cuda ] && nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n1 | sed 's/^/gpu=/'
} > "$OUT/meta.txt"

# A free loopback port for a run's rendezvous (and the next one, which the store may use).
PORT=$((20000 + $$ % 9000))
next_port() {
    PORT=$((PORT + 7))
    if command -v python3 > /dev/null; then
        PORT=$(python3 - "$PORT" <<'PY'
import socket, sys
p = int(sys.argv[1])
while True:
    try:
        for q in (p, p + 1):
            s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1", q)); s.close()
        break
    except OSError:
        p += 3
print(p)
PY
)
    fi
}

FAILED=0
i=0
for p in "${PLAN[@]}"; do
    IFS='|' read -r name st label flags <<< "$p"
    i=$((i + 1))
    bin="$BIN_DIR/stage$st"
    if [ ! -x "$bin" ] && [ "$BIN_DIR" = . ]; then make --no-print-directory "stage$st" > "$OUT/build.log" 2>&1; fi
    if [ ! -x "$bin" ]; then
        echo "[$i/${#PLAN[@]}] $label: no $bin (build it with make stage$st) — row left out"
        FAILED=$((FAILED + 1)); continue
    fi
    port=()
    [ "$st" -ge 3 ] && { next_port; port=(--master-port "$PORT"); }
    # shellcheck disable=SC2086 # flags is a list of words
    cmd=("$bin" "${COMMON[@]}" $flags "${port[@]}" --report "$OUT/$name.jsonl")
    t0=$(date +%s%N)
    timeout -k 10 "$LIMIT" "${cmd[@]}" > "$OUT/$name.log" 2>&1
    rc=$?
    secs=$(( ($(date +%s%N) - t0) / 1000000 ))
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$st" "$label" "$rc" "$secs" "./stage$st $flags" >> "$OUT/plan.tsv" # ms
    if [ "$rc" = 0 ] && ! grep -qs '"type":"summary"' "$OUT/$name.jsonl"; then
        echo "[$i/${#PLAN[@]}] $label FAILED (exit 0, but no summary in its report $OUT/$name.jsonl): see $OUT/$name.log"
        FAILED=$((FAILED + 1))
    elif [ "$rc" = 0 ]; then
        printf '[%d/%d] %-44s %s\n' "$i" "${#PLAN[@]}" "$label" "$(grep -m1 '^summary:' "$OUT/$name.log" | cut -d'|' -f4-5)"
    else
        why=""; [ "$rc" = 124 ] || [ "$rc" = 137 ] && why=": stopped at its ${LIMIT} s limit (ROW_LIMIT=S gives more)"
        echo "[$i/${#PLAN[@]}] $label FAILED (exit $rc$why): see $OUT/$name.log"; tail -n 3 "$OUT/$name.log" | sed 's/^/    /'
        FAILED=$((FAILED + 1))
    fi
done

# ---- PyTorch at the same setting, from the same run (optional) ----------------------------------
if [ "$QUICK" != 1 ] && [ "$DEV" = cuda ] && [ "$TORCH" != 0 ] &&
   python3 -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2> /dev/null; then
    TORCHRUN=$(command -v torchrun || echo "python3 -m torch.distributed.run")
    B=${BATCH:-128}; MODEL=resnet18
    echo "PyTorch rows (same setting: cudnn.benchmark off, TF32 convolutions, batches already on the GPU)"
    timeout -k 10 300 python3 tests/torch/bench_dp.py --models $MODEL --batch $B --steps "$STEPS" --warmup 20 \
        > "$OUT/pytorch_dp.json" 2> "$OUT/pytorch_dp.log" || echo "  PyTorch one GPU / DataParallel FAILED: see $OUT/pytorch_dp.log"
    BACKEND=nccl; [ "$NGPU" -lt 2 ] && BACKEND=gloo
    for k in 1 4; do
        next_port
        timeout -k 10 300 $TORCHRUN --nproc-per-node "$N" --master-port "$PORT" tests/torch/bench_ddp.py --model $MODEL \
            --batch $B --steps "$STEPS" --warmup 20 --backend $BACKEND --accum-steps $k --cudnn-benchmark off \
            > "$OUT/pytorch_ddp_k$k.json" 2> "$OUT/pytorch_ddp_k$k.log" || echo "  PyTorch DDP (accum $k) FAILED: see $OUT/pytorch_ddp_k$k.log"
    done
fi

# ---- the table ----------------------------------------------------------------------------------
if command -v python3 > /dev/null; then
    # it exits 1 when a row failed (counted above); with none, the table itself failed
    python3 tests/compare_table.py "$OUT" || [ "$FAILED" -gt 0 ] || { echo "compare: tests/compare_table.py failed"; exit 1; }
else # no Python: the runs' own summary lines still make a table of sorts
    echo "(python3 not found: no Markdown or chart; each run's summary line)"
    grep -H -m1 '^summary:' "$OUT"/*.log | sed "s|^$OUT/||"
fi
[ "$FAILED" = 0 ] || { echo "compare: $FAILED run(s) failed"; exit 1; }
