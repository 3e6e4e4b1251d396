#!/usr/bin/env bash
# bench_stage3_variants.sh — where stage 3's two-GPU cost goes, in one run on 2 GPUs:
#   bash tests/bench_stage3_variants.sh          (or make bench3-variants; ./stage1 ./stage3 ./stage5 built)
#
# On 2 H200s stage 1 takes 4.69 ms/step and stage 3 4.98 ms: 94.2% weak scaling (goal 97%), ~0.1 ms of it
# exposed communication, and an all-reduce overlapped with backward runs at half the bandwidth of one
# that is not (127 vs 241 GB/s). Each row changes one thing (ResNet-18, batch 128 per GPU, the real
# input pipeline; each stage 3 row is `./stage3 --nproc-per-node 2 --comm nccl` plus its variant):
#    1 stage 1, one GPU: the reference (run first and last; the faster counts, as in bench_stage3.sh)
#    2 stage 3 default                          the figure to explain
#    3 NCCL_CTA_POLICY=1                        NCCL >= 2.27: the "efficiency" policy, fewer CTAs (SMs)
#  4-6 NCCL_MAX_CTAS=4 / 8 / 16                 NCCL's CTAs taking SMs from backward's kernels?
#  7-8 NCCL_PROTO=Simple / LL128                the protocol NCCL picks per size
# 9-11 --bucket-mb 5 / 10 / 100                 bucket size, the exposed last bucket (a cap given caps the
#                                               rebuilt first bucket too, as in PyTorch: 100 is one bucket)
#   12 --no-overlap                             one all-reduce after backward: nothing to interfere with
#   13 --broadcast-buffers after-forward        the BN buffer broadcast overlapped with backward
#   14 --last-bucket-mb 1                       a small last bucket: less all-reduce after backward
#   15 --optimizer-overlap in-backward          each bucket stepped beside backward (PyTorch's
#                                               _register_fused_optim; on one GPU it costs 0.09 ms)
#   16 --optimizer-overlap after-backward       the earlier buckets stepped beside the last all-reduce
#   17 13 + 14 + 16                             the exposed part as small as this code makes it
#   18 stage 3, one process (CUDA_VISIBLE_DEVICES = the first GPU): DDP's machinery without a peer
#   19 the same, --optimizer-overlap after-backward  (no peer: nothing to hide the steps behind)
#20-22 stage 5 (fp16) on 2 GPUs, the same with NCCL_CTA_POLICY=1, and stage 5 on one GPU, their reference
#   23 stage 5 fp16, 2 GPUs, --broadcast-buffers after-forward --last-bucket-mb 1 (fp16's scaler: no 15/16)
#   24 stage 1 on the second GPU                a slower second GPU (DDP goes at the slower one's pace)
#   25 stage 1 on both GPUs at once, two independent runs (the slower counts): two busy GPUs, no comm
#   26 stage 3 --no-cuda-graph                  eager, as PyTorch runs: what 27 is to be read against
#   27 --sync-bn                                SyncBatchNorm (graphs off): 40 small all-reduces per step,
#                                               each waited for by the compute — its price is 27 against 26
# Rows 2-27 run in two rounds (two passes over the list) and report the faster of their two medians:
# one-GPU step times vary by a few percent from run to run. Reading the table: scaling = reference ms
# / row ms (rows 20-21 and 23 against row 22, 27 against 26, the others against row 1): a variant that lifts it toward 97%
# names a cause. Exposed = the compute stream's wait for communication per step; algbw = gradient bytes
# / all-reduce time (a slow all-reduce that stays hidden costs nothing by itself); per rank = each
# rank's forward+backward, wait after backward and wait for buffers (ms): the longer forward+backward
# is the rank the other waits for. Environment variants run as `env VAR=value ./stage3 …`: the launcher
# (launcher_run, common/launch.c) fork()s and execv()s its workers, which keep its whole environment
# (it only sets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR/PORT,
# STAGE3_STATUS_FD, STAGE_RDZV_SECRET and unsets TORCHELASTIC_USE_AGENT_STORE), and each worker's
# ncclCommInitRank (no config struct) reads the NCCL_* variables (NCCL 2.28.3 on the H200 hosts says
# "NCCL_CTA_POLICY set by environment to 1" and the same of NCCL_MAX_CTAS: docs/logs/nccl_env_H200_2026-12-03.txt). Logs and JSON under $BENCH_OUT (default
# runs/bench_stage3_variants: a new or empty folder, or one this script wrote before); the table is
# printed last. STEPS (default 300) timed steps per run; ROUNDS (default 2) passes over the rows; 56 runs,
# 9-11 minutes. ONLY="key ..." runs those rows alone (keys: the first field of ROWS below, e.g.
# ONLY="s3 bafter last1 afterbwd all3 one"), with their references; a device allowing 10 minutes a
# command can split the list over calls, each with its own BENCH_OUT. Needs 2 GPUs (on one: `make bench3`).
# BENCH_FLAGS is appended to every run's flags; with --device cpu in it, the CPU smoke test of this script
# (two workers through --comm host, the NCCL variables ignored: it checks that every row runs and the table
# is read; tests/test_compare.c runs it): BENCH_FLAGS="--device cpu --model tiny --batch-size 16 --train-size 1024
# --test-size 64 --workers 0" STEPS=3 ROUNDS=1 bash tests/bench_stage3_variants.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
. tests/bench_common.sh
USAGE='[STEPS=N] [ROUNDS=N] [ONLY="key ..."] [BENCH_FLAGS="..."] [BENCH_OUT=DIR] bash tests/bench_stage3_variants.sh (or make bench3-variants)'
bench_ints "$USAGE" STEPS ROUNDS
# NVLink multicast stays off in every process below: not needed, and on shared hosts it can break the GPUs.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${BENCH_OUT:-runs/bench_stage3_variants}
STEPS=${STEPS:-300}
ROUNDS=${ROUNDS:-2}
CPU=
if [[ " ${BENCH_FLAGS:-} " =~ [[:space:]]--device(=|[[:space:]]+)cpu[[:space:]] ]]; then
    CPU=1 NGPU=0 GPU_HOW="--device cpu" # the CPU smoke test: no GPU used, whatever is visible
else
    # shellcheck disable=SC2016 # backquotes in the messages, not commands
    bench_need_gpu tests/bench_stage3_variants.sh '`make compare QUICK=1`'
    [ "$NGPU" -ge 2 ] || bench_die "tests/bench_stage3_variants.sh needs 2 GPUs and $NGPU is visible ($GPU_HOW);" \
        "on one GPU run \`make bench3\` instead"
fi
bench_out_dir BENCH_OUT "$OUT" runs/bench_stage3_variants bench_stage3_variants '*.jsonl' '*.log'
[ -x ./stage1 ] && [ -x ./stage3 ] && [ -x ./stage5 ] || make stage1 stage3 stage5 || exit 1

. tests/bench_ddp_env.sh # PORT, next_port, log (and COMM=nccl: 2 GPUs)

first=$(echo "${CUDA_VISIBLE_DEVICES:-0,1}" | cut -d, -f1)
second=$(echo "${CUDA_VISIBLE_DEVICES:-0,1}" | cut -d, -f2)
C=nccl
[ -z "$CPU" ] || C=host
D="--nproc-per-node 2 --comm $C"
# key|reference key|label|[VAR=value ...] binary flags... (rows 2-27; "both" runs stage 1 on each GPU)
ROWS=("s3|s1|stage 3 default|stage3 $D"
      "cta1|s1|NCCL_CTA_POLICY=1|NCCL_CTA_POLICY=1 stage3 $D"
      "ctas4|s1|NCCL_MAX_CTAS=4|NCCL_MAX_CTAS=4 stage3 $D"
      "ctas8|s1|NCCL_MAX_CTAS=8|NCCL_MAX_CTAS=8 stage3 $D"
      "ctas16|s1|NCCL_MAX_CTAS=16|NCCL_MAX_CTAS=16 stage3 $D"
      "simple|s1|NCCL_PROTO=Simple|NCCL_PROTO=Simple stage3 $D"
      "ll128|s1|NCCL_PROTO=LL128|NCCL_PROTO=LL128 stage3 $D"
      "b5|s1|--bucket-mb 5|stage3 $D --bucket-mb 5"
      "b10|s1|--bucket-mb 10|stage3 $D --bucket-mb 10"
      "b100|s1|--bucket-mb 100|stage3 $D --bucket-mb 100"
      "noov|s1|--no-overlap|stage3 $D --no-overlap"
      "bafter|s1|--broadcast-buffers after-forward|stage3 $D --broadcast-buffers after-forward"
      "last1|s1|--last-bucket-mb 1|stage3 $D --last-bucket-mb 1"
      "inbwd|s1|--optimizer-overlap in-backward|stage3 $D --optimizer-overlap in-backward"
      "afterbwd|s1|--optimizer-overlap after-backward|stage3 $D --optimizer-overlap after-backward"
      "all3|s1|13 + 14 + 16|stage3 $D --broadcast-buffers after-forward --last-bucket-mb 1 --optimizer-overlap after-backward"
      "one|s1|stage 3, one process (no peer)|CUDA_VISIBLE_DEVICES=$first stage3 --nproc-per-node 1 --comm $C"
      "oneafter|s1|the same, --optimizer-overlap after-backward|CUDA_VISIBLE_DEVICES=$first stage3 --nproc-per-node 1 --comm $C --optimizer-overlap after-backward"
      "s5|s5one|stage 5 fp16, 2 GPUs|stage5 --nproc-per-node 2"
      "s5cta1|s5one|stage 5 fp16, NCCL_CTA_POLICY=1|NCCL_CTA_POLICY=1 stage5 --nproc-per-node 2"
      "s5one|-|stage 5 fp16, one GPU (ref. of 20, 21, 23)|CUDA_VISIBLE_DEVICES=$first stage5 --nproc-per-node 1"
      "s5exp|s5one|stage 5 fp16, after-forward + last 1 MiB|stage5 --nproc-per-node 2 --broadcast-buffers after-forward --last-bucket-mb 1"
      "gpu1|s1|stage 1 on the second GPU ($second)|CUDA_VISIBLE_DEVICES=$second stage1"
      "both|s1|stage 1 on both GPUs at once (slower)|both"
      "eager|s1|stage 3 --no-cuda-graph (eager)|stage3 $D --no-cuda-graph"
      "syncbn|eager|--sync-bn (against 26)|stage3 $D --sync-bn")

declare -A NUM # each row's number in the table, whatever ONLY keeps
for i in "${!ROWS[@]}"; do NUM[${ROWS[$i]%%|*}]=$((i + 2)); done
# ONLY: keep the rows it names and the rows they are measured against (row 22 for the stage 5 rows, 26 for 27).
if [ -n "${ONLY:-}" ]; then
    declare -A WANT
    for k in $ONLY; do
        found=
        for row in "${ROWS[@]}"; do
            IFS='|' read -r key ref _ <<< "$row"
            [ "$key" = "$k" ] && found=1 && WANT[$key]=1 && [ "$ref" != s1 ] && [ "$ref" != - ] && WANT[$ref]=1
        done
        [ -n "$found" ] || bench_die "ONLY: no row '$k' (the keys: $(printf '%s\n' "${ROWS[@]}" | cut -d'|' -f1 |
            paste -sd' ')) — usage: $USAGE"
    done
    KEPT=()
    for row in "${ROWS[@]}"; do [ -n "${WANT[${row%%|*}]:-}" ] && KEPT+=("$row"); done
    ROWS=("${KEPT[@]}")
fi

# name, [VAR=value ...] binary, extra flags...: the timed run (median over the steps after warm-up)
run_stage() {
    local name=$1 vars=() bin t=180; shift
    while [ $# -gt 0 ] && [[ $1 == *=* ]]; do vars+=("$1"); shift; done
    bin=$1; shift; next_port
    [ "$bin" = stage1 ] || set -- --master-port "$PORT" "$@"
    [ "$bin" = stage5 ] && t=300 # bench_stage5.sh's limit
    timeout -k 10 $t env "${vars[@]}" "./$bin" --model resnet18 --batch-size 128 --workers 4 --pin-memory \
        --steps $((STEPS + 5)) --epochs 100 --test-size 2000 --schedule const --progress off --log-every 1000 \
        --report "$OUT/$name.jsonl" "$@" ${BENCH_FLAGS:-} > "$OUT/$name.log" 2>&1
    local rc=$?
    [ $rc = 0 ] || echo "$name FAILED (exit $rc): see $OUT/$name.log" | tee -a "$OUT/FAILURES.log"
    grep -E "^(summary|comm over|  compute|  per rank)" "$OUT/$name.log"
}

log "stage 1, one GPU"; run_stage s1_first stage1
for round in $(seq "$ROUNDS"); do
    for row in "${ROWS[@]}"; do
        IFS='|' read -r key _ label spec <<< "$row"
        log "round $round: $label"
        if [ "$key" = both ]; then # the _peer run beside it: ms_of takes the slower of the two
            CUDA_VISIBLE_DEVICES=$first run_stage "both_r$round" stage1 &
            CUDA_VISIBLE_DEVICES=$second run_stage "both_r${round}_peer" stage1
            wait
        else
            read -r -a words <<< "$spec"
            run_stage "${key}_r$round" "${words[@]}"
        fi
    done
done
log "stage 1, one GPU, again"; run_stage s1_last stage1

# A run's median ms per step (summary line: "X ms/it (median)", or ms/step where the trainer counts optimizer
# steps, as stage 5's does); with a NAME_peer run beside it, the slower of the two; nothing when one failed.
ms_of() {
    local f=("$OUT/$1.log")
    [ -e "$OUT/$1_peer.log" ] && f+=("$OUT/$1_peer.log")
    sed -nE 's/^summary:.* ([0-9.]+) ms\/(it|step) \(median\).*/\1/p' "${f[@]}" 2> /dev/null |
        awk -v n=${#f[@]} '$1 > m {m = $1} END {if (NR == n) print m}'
}
fastest() { # run names...: "name ms" of the one with the smallest median; nothing when all failed
    local n; for n in "$@"; do echo "$n $(ms_of "$n")"; done |
        awk 'NF == 2 && (!b || $2 < b) {b = $2; n = $1} END {if (b) print n, b}'
}
pct() { awk -v r="$1" -v m="$2" 'BEGIN {if (r && m) printf "%.1f%%", 100 * r / m; else printf "-"}'; }

declare -A BEST MS
read -r "BEST[s1]" "MS[s1]" <<< "$(fastest s1_first s1_last)"
for row in "${ROWS[@]}"; do
    IFS='|' read -r key _ <<< "$row"
    mapfile -t runs < <(for r in $(seq "$ROUNDS"); do echo "${key}_r$r"; done)
    read -r "BEST[$key]" "MS[$key]" <<< "$(fastest "${runs[@]}")"
done
ver=$(grep -ho 'NCCL [0-9][0-9.]*' "$OUT"/*_r*.log 2> /dev/null | head -n 1)
echo
if [ -z "$CPU" ] && { [ -z "$ver" ] || [ "$(printf '%s\n' 2.27 "${ver#NCCL }" | sort -V | head -n 1)" != 2.27 ]; }; then
    echo "note: ${ver:-NCCL version unknown}: NCCL_CTA_POLICY needs NCCL >= 2.27 (older ones ignore it)"
fi
line() { printf '%-2s %-38s %7s %11s %7s %16s %6s %4s  %s\n' "$@"; }
title="ResNet-18, b128/GPU, ${ver:-NCCL ?}"
[ -z "$CPU" ] || title="CPU smoke test (timings say nothing)"
line "#" "$title" ms/step rounds scaling "exposed comm" algbw bkts \
    "per rank: fwd+bwd | waited | buffers"
line 1 "stage 1, one GPU (reference)" "${MS[s1]:-failed}" "$(ms_of s1_first)/$(ms_of s1_last)" 100.0% - - - -
# "comm over the run: all-reduce A ms/step (B MiB in N buckets, algbw G GB/s, …) | exposed E ms = P% …"
COMM_RE='s/^comm over the run: .* in ([0-9]+) (bucket|piece).*, algbw ([0-9.]+) GB\/s.* exposed ([0-9.]+) ms = '
COMM_RE+='([0-9.]+%).*/\4 (\5)|\3|\1/p'
# "  per rank, ms (rank 0 … 1): forward+backward F0 F1 | waited after backward W0 W1 | waited for buffers B0 B1"
RANK_RE='s/^  per rank[^:]*: forward\+backward (.*) \| waited after backward (.*) \| waited for buffers (.*)/'
RANK_RE+='\1 | \2 | \3/p'
for row in "${ROWS[@]}"; do
    IFS='|' read -r key ref label _ <<< "$row"
    lf=$OUT/${BEST[$key]:-none}.log # the faster round's log
    IFS='|' read -r exposed algbw bkts <<< "$(sed -nE "$COMM_RE" "$lf" 2> /dev/null)"
    ranks=$(sed -nE "$RANK_RE" "$lf" 2> /dev/null | sed -E 's/([0-9]) ([0-9])/\1\/\2/g') # "a b" -> "a/b"
    scaling=$(pct "${MS[$ref]:-}" "${MS[$key]:-}")
    [ "$ref" = - ] && scaling=100.0%
    # shellcheck disable=SC2005 # echo: a failed round still takes its place, as an empty field
    rounds=$(for r in $(seq "$ROUNDS"); do echo "$(ms_of "${key}_r$r")"; done | paste -sd/)
    line "${NUM[$key]}" "$label" "${MS[$key]:-failed}" "$rounds" "$scaling" \
        "${exposed:--}" "${algbw:--}" "${bkts:--}" "${ranks:--}"
done
echo "ms/step: median, the fastest round (rounds: each; row 1: first/last run) | scaling: reference ms / ms" \
    "(20, 21, 23: row 22, 27: row 26, others: row 1) | exposed: compute's wait for comm per step (% of it) | algbw: GB/s of" \
    "gradients per all-reduce time | bkts: buckets (1 piece: --no-overlap) | per rank: ms, rank 0/rank 1"
# A failed run leaves its row "failed" above; the exit status says so too (the runs go on: one bad
# variant should not cost a 2-GPU session the others).
if [ -s "$OUT/FAILURES.log" ]; then
    echo "error: $(wc -l < "$OUT/FAILURES.log") run(s) failed:"
    sed 's/^/  /' "$OUT/FAILURES.log"
    exit 1
fi
