#!/usr/bin/env bash
# bench_unused.sh — what an unused parameter and find_unused_parameters cost, stage 3 against PyTorch:
#   bash tests/bench_unused.sh          (./stage3 built; PyTorch for its rows)
#
# ResNet-18 at batch 128 per GPU, as tests/bench_stage3.sh: stage 3 plain, with --find-unused-parameters
# (nothing unused: the flag's pure cost), and with --unused-param --find-unused-parameters (a head the
# forward never calls); then the same three in PyTorch DDP (tests/torch/bench_ddp_unused.py). Last, the
# pitfall itself on the GPUs: --unused-param without the flag must stop at step 2 with exit 2 (and
# PyTorch raise). With one GPU the two workers share it (--comm host / gloo): the counts hold, the
# timings say nothing about scaling. Logs and JSON under $BENCH_OUT (default runs/bench_unused: a new
# or empty folder, or one this script wrote before); STEPS (default 300) timed steps per run.
# EXTRA="flags" is appended to every stage 3 run (a smoke test without GPUs: EXTRA="--device cpu
# --model tiny --batch-size 16 --train-size 1024" STEPS=10). Without --device cpu in EXTRA it needs a GPU.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
. tests/bench_common.sh
bench_ints "[STEPS=N] [EXTRA=\"...\"] [BENCH_OUT=DIR] bash tests/bench_unused.sh" STEPS
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT=${BENCH_OUT:-runs/bench_unused}
STEPS=${STEPS:-300}
if [[ " ${EXTRA:-} " =~ [[:space:]]--device(=|[[:space:]]+)cpu[[:space:]] ]]; then
    bench_gpus # the CPU smoke test: no GPU needed
else
    bench_need_gpu tests/bench_unused.sh '`make compare QUICK=1`, or its CPU smoke test `EXTRA="--device cpu --model tiny --batch-size 16 --train-size 1024" STEPS=10 bash tests/bench_unused.sh`,'
fi
bench_out_dir BENCH_OUT "$OUT" runs/bench_unused bench_unused '*.jsonl' '*.json' '*.log'
[ -x ./stage3 ] || make stage3 || exit 1

. tests/bench_ddp_env.sh # HAVE_TORCH, COMM, BACKEND, MODE, TORCHRUN, PORT, next_port, log

run_stage() {
    local name=$1; shift
    next_port
    timeout -k 10 180 ./stage3 --nproc-per-node 2 --comm "$COMM" --master-port "$PORT" --model resnet18 \
        --batch-size 128 --workers 4 --pin-memory --steps $((STEPS + 5)) --epochs 100 --test-size 2000 \
        --schedule const --progress off --log-every 1000 --report "$OUT/$name.jsonl" "$@" ${EXTRA:-} > "$OUT/$name.log" 2>&1
    local rc=$?
    [ $rc = 0 ] || echo "$name FAILED (exit $rc): see $OUT/$name.log"
    grep -E "^(summary|comm over)|find_unused_parameters:" "$OUT/$name.log"
}
run_torch() {
    local name=$1; shift
    [ "$HAVE_TORCH" = 1 ] || return 0
    next_port
    (cd tests/torch && timeout -k 10 240 $TORCHRUN --nproc-per-node 2 --master-port "$PORT" bench_ddp_unused.py \
        --steps "$STEPS" --backend "$BACKEND" "$@") > "$OUT/$name.json" 2> "$OUT/$name.log"
}

log "stage 3, $MODE: plain";                                run_stage plain
log "stage 3, $MODE: --find-unused-parameters";             run_stage find --find-unused-parameters
log "stage 3, $MODE: --unused-param --find-unused-parameters"; run_stage unused_find --unused-param --find-unused-parameters
[ "$HAVE_TORCH" = 1 ] && log "PyTorch DDP, $MODE ($BACKEND): the same three"
run_torch pt_plain; run_torch pt_find --find-unused-parameters; run_torch pt_unused_find --unused-param --find-unused-parameters

log "the pitfall: --unused-param without --find-unused-parameters"
next_port
timeout -k 10 120 ./stage3 --nproc-per-node 2 --comm "$COMM" --master-port "$PORT" --model resnet18 --batch-size 128 \
    --steps 5 --progress off --unused-param ${EXTRA:-} > "$OUT/error.log" 2>&1
echo "stage 3: exit $? (expected 2): $(grep -m1 -o 'rank [0-9]*: the previous step.*' "$OUT/error.log" | cut -c1-150)…"
if [ "$HAVE_TORCH" = 1 ]; then
    run_torch pt_error --unused-param; echo "PyTorch: exit $? (expected non-zero): $(grep -o '"error": "[^"]*' "$OUT/pt_error.json" 2>/dev/null | cut -c11-130)…"
else
    echo "PyTorch: not run (its rows need PyTorch and a GPU)"
fi

python3 - "$OUT" "$MODE" <<'PY'
import json, sys
out, mode = sys.argv[1], sys.argv[2]

def last(path, kind):
    try:
        r = [json.loads(l) for l in open(path) if l.startswith("{") and f'"type":"{kind}"' in l.replace(" ", "")]
    except OSError:
        return None
    return r[-1] if r else None

def vs(s, base):
    return "-" if s is base else f"{100 * s['ms_per_iter_median'] / base['ms_per_iter_median'] - 100:+.1f}%"

print()
print(f"ResNet-18, batch 128 per GPU, {mode:22s} {'ms/iter':>8s} {'img/s':>8s} {'vs plain':>9s} {'exposed comm':>13s} "
      f"{'search':>9s} {'all-reduces/step':>17s}")
for who, names in (("stage 3", ("plain", "find", "unused_find")), ("PyTorch DDP", ("pt_plain", "pt_find", "pt_unused_find"))):
    base = None
    for name, label in zip(names, ("plain", "--find-unused-parameters", "--unused-param --find-unused-parameters")):
        s = last(f"{out}/{name}.jsonl", "summary") if who == "stage 3" else last(f"{out}/{name}.json", "summary")
        c = last(f"{out}/{name}.jsonl", "comm_summary") if who == "stage 3" else None
        if not s:
            print(f"{who + ', ' + label:56s} {'not run' if who != 'stage 3' else 'failed':>8s}")
            continue
        base = base or s
        ex = f"{c['exposed_ms_median']:.3f} ms" if c else "-"
        search = f"{1e3 * c['unused_search_ms_median']:.1f} µs" if c and "unused_search_ms_median" in c else "-"
        per = (f"{(c['allreduce_calls'] + c.get('used_map_allreduces', 0)) / c['optimizer_steps']:.2f}" if c else "-")
        print(f"{who + ', ' + label:56s} {s['ms_per_iter_median']:8.2f} {s['img_per_s']:8.0f} "
              f"{vs(s, base):>9s} {ex:>13s} {search:>9s} {per:>17s}")
PY
