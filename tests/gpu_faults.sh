#!/usr/bin/env bash
# gpu_faults.sh — stage 3's fault handling on a real GPU: a rank that exits, one killed by a signal,
# the store's host failing, and a rank stopped with SIGSTOP (hung, not dead). The same cases run on
# the CPU backend in CI (tests/test_dist.c, tests/test_store.c); this script is their GPU twin.
#
#   bash tests/gpu_faults.sh [host|nccl]
#
#   host (default): two workers on one GPU over --comm host (NCCL refuses two ranks on one GPU);
#   nccl: two workers on two GPUs over NCCL (needs 2 GPUs).
# Each case must: exit non-zero (not the timeout's 124), name the failing rank as the job's failure,
# name the step, stop within its bound, and leave no worker behind. Prints PASS/FAIL per case and
# exits 1 when any case fails. Every case runs on the GPU (--device cuda): with no GPU visible it
# prints one SKIP line and exits 0 — the CPU twins in ./tests/run_tests dist store are the ones to run.
set -u
cd "$(dirname "$0")/.." || exit 1
. tests/bench_common.sh
COMM=${1:-host}
case $COMM in host | nccl) ;; *) bench_die "unknown mode '$COMM' — usage: bash tests/gpu_faults.sh [host|nccl]" ;; esac
bench_gpus
if [ "$NGPU" = 0 ]; then
    echo "SKIP  gpu_faults ($COMM): needs a CUDA GPU, none is visible ($GPU_HOW); the same cases on the CPU: ./tests/run_tests dist store"
    exit 0
fi
[ "$COMM" = host ] || [ "$NGPU" -ge 2 ] ||
    bench_die "gpu_faults nccl needs 2 GPUs, $NGPU is visible ($GPU_HOW): run bash tests/gpu_faults.sh host on one GPU"
[ -x ./stage3 ] || make stage3 >/dev/null || exit 1
export NCCL_NVLS_ENABLE=0
ARGS="--device cuda --comm $COMM --nproc-per-node 2 --model resnet18 --batch-size 64 --train-size 2560
      --test-size 256 --epochs 50 --progress off"
fails=0
port=29700
# case: env, the rank that must be named, the words that must appear, seconds allowed
run_case() {
    local env=$1 rank=$2 words=$3 bound=$4 extra=${5:-}
    port=$((port + 7))
    local marker="--seed $((RANDOM + 1000))"
    local t0=$(date +%s%3N)
    local out rc
    out=$(env $env timeout 180 ./stage3 $ARGS --master-port $port $marker $extra 2>&1)
    rc=$?
    local ms=$(( $(date +%s%3N) - t0 )); local took=$((ms / 1000)).$(( (ms % 1000) / 100 ))
    local why=""
    [ $rc -ne 0 ] && [ $rc -ne 124 ] || why="exit $rc"
    echo "$out" | grep -q "job failed: rank $rank (local rank $rank" || why="$why; rank $rank not named as the failure"
    echo "$out" | grep -q "$words" || why="$why; '$words' missing"
    [ $ms -lt $((bound * 1000)) ] || why="$why; took ${took}s (bound ${bound}s)"
    sleep 1
    pgrep -f -- "$marker" >/dev/null && why="$why; workers left behind"
    if [ -z "$why" ]; then echo "PASS  $env ($COMM): stopped in ${took}s"
    else echo "FAIL  $env ($COMM):$why"; echo "$out" | tail -15; fails=$((fails + 1)); fi
    echo "$out" | grep -E "job failed|stopped answering|at step" | head -3 | sed 's/^/      /'
}
# startup (cuDNN, NCCL) takes a few seconds on a GPU: the bounds count from the launch
run_case "STAGE3_FAIL_AT=1:3" 1 "at step " 30
run_case "STAGE3_FAIL_AT=1:4:KILL" 1 "at step " 30
run_case "STAGE3_FAIL_AT=0:2" 0 "at step " 30
run_case "STAGE3_FAIL_AT=1:3:STOP" 1 "stopped by SIGSTOP" 60 "--comm-timeout 10"
echo "gpu_faults ($COMM): $fails failed"
[ $fails -eq 0 ]
