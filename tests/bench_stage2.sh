#!/usr/bin/env bash
# bench_stage2.sh — DataParallel against one GPU, ours and PyTorch's, measured in one run (~3 min).
#
#   bash tests/bench_stage2.sh      (./stage1 and ./stage2 built; python3 with torch for the PyTorch rows)
#
#  1. tests/torch/calibrate_dp.py times nn.DataParallel's Python on this machine → the --gil-* flags;
#  2. resnet18 and tiny at batch 128 per GPU: ./stage1 (one GPU); ./stage2 --gpus 2 with the
#     calibrated Python; ./stage2 --gpus 2 --gil-op-us 0 --gil-host-us 0 (no Python at all); for
#     resnet18 also --dp-thread-pool, --p2p off and --gpus 1, while the time budget allows;
#  3. tests/torch/bench_dp.py: PyTorch one GPU against nn.DataParallel, same models and batch;
#  4. stage 2's phase breakdowns, then the table, last: ms/iter, images/s, speed relative to one GPU,
#     peak memory of GPU0 and GPU1 and their ratio, whether stage 2's phases add up to its step.
# With one GPU, stage 2 runs its two logical devices on it (the mechanics and the memory split are
# real, the speed is not a scaling result) and the PyTorch DataParallel rows are skipped.
# Everything runs with cudnn.benchmark off (stage flags: no --cudnn-benchmark). Logs: $BENCH_OUT.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
export NCCL_NVLS_ENABLE=0
OUT=${BENCH_OUT:-runs/bench_stage2}
STEPS=${STEPS:-60}
BUDGET=${BUDGET:-170} # seconds after which the optional runs are skipped
mkdir -p "$OUT"
rm -f "$OUT"/*.jsonl "$OUT"/*.log
if [ ! -x ./stage1 ] || [ ! -x ./stage2 ]; then make stage1 stage2 >/dev/null || exit 1; fi
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
echo "GPUs visible: $NGPU"
nvidia-smi --query-gpu=index,name,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/  /'
[ "$NGPU" -ge 1 ] || { echo "error: no GPU visible (nvidia-smi -L lists none)"; exit 1; }
[ "$NGPU" -ge 2 ] || echo "note: one GPU — stage 2 runs its 2 logical devices on it; PyTorch DataParallel is skipped"

# 1. calibration -----------------------------------------------------------------------------------
echo "=== calibrate_dp.py ($(date +%T))"
GIL_FLAGS="" GIL_SRC="stage 2's built-in (calibrated) defaults (calibration failed: see $OUT/calibrate.log)"
if timeout 120 python3 tests/torch/calibrate_dp.py --model resnet18 --repeat 100 > "$OUT/calibrate.log" 2>&1; then
  GIL_FLAGS=$(grep '^flags:' "$OUT/calibrate.log" | tail -n 1 | sed 's/^flags: //')
  [ -n "$GIL_FLAGS" ] && GIL_SRC="calibrated on this machine"
fi
cat "$OUT/calibrate.log"
echo "stage 2's modelled Python: ${GIL_FLAGS:-defaults} ($GIL_SRC)"

# 2. the stages ------------------------------------------------------------------------------------
# Enough synthetic data for STEPS steps at the global batch 256 inside one epoch; one small
# evaluation at the end. The input pipeline is real (loader threads, pinned memory, async copies).
COMMON=(--batch-size 128 --steps "$STEPS" --epochs 1000 --schedule const --progress off --log-every 100000
        --workers 4 --pin-memory --train-size $(((STEPS + 2) * 256)) --test-size 512)
run() { # name binary model [flags...]
  local name=$1 bin=$2 model=$3
  shift 3
  echo "=== $name: ./$bin --model $model $* ($(date +%T))"
  timeout 150 "./$bin" --model "$model" "${COMMON[@]}" --report "$OUT/$name.jsonl" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  if [ $rc -ne 0 ]; then
    echo "  FAILED (exit $rc); last lines of $OUT/$name.log:"
    tail -n 5 "$OUT/$name.log" | sed 's/^/  /'
  else
    grep '^summary:' "$OUT/$name.log" | sed 's/^/  /'
  fi
}
# shellcheck disable=SC2086 # GIL_FLAGS is a list of flags
for m in resnet18 tiny; do
  run "stage1_$m" stage1 "$m"
  run "stage2_$m" stage2 "$m" --gpus 2 $GIL_FLAGS
  run "stage2_nopy_$m" stage2 "$m" --gpus 2 $GIL_FLAGS --gil-op-us 0 --gil-host-us 0
done

# 3. PyTorch ---------------------------------------------------------------------------------------
echo "=== PyTorch: one GPU and nn.DataParallel ($(date +%T))"
timeout 150 python3 tests/torch/bench_dp.py --models resnet18,tiny --batch 128 --steps "$STEPS" \
  > "$OUT/pytorch.jsonl" 2> "$OUT/pytorch.log" || { echo "  PyTorch bench failed (exit $?):"; tail -n 5 "$OUT/pytorch.log" | sed 's/^/  /'; }

# optional experiments, while there is time
for extra in "pool:--dp-thread-pool" "p2poff:--p2p off" "gpus1:--gpus 1"; do
  if [ "$SECONDS" -gt "$BUDGET" ]; then echo "(skipping stage2_${extra%%:*}_resnet18: time budget)"; continue; fi
  # shellcheck disable=SC2086
  run "stage2_${extra%%:*}_resnet18" stage2 resnet18 --gpus 2 $GIL_FLAGS ${extra#*:}
done

# 4. report ----------------------------------------------------------------------------------------
for f in "$OUT"/stage2_resnet18.log "$OUT"/stage2_tiny.log; do
  [ -f "$f" ] || continue
  echo "=== $(basename "$f" .log): DataParallel notes, phases and GIL"
  grep -E '^(note|DataParallel:|modelled Python)' "$f"
  sed -n '/^DataParallel phases/,/^summary:/p' "$f" | grep -v '^summary:'
done
python3 - "$OUT" "$NGPU" "$GIL_SRC" "$STEPS" <<'PY'
import json, os, sys
out, ngpu, gil_src, steps = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]

def records(path):
    try:
        return [json.loads(l) for l in open(path) if l.strip().startswith("{")]
    except OSError:
        return []

def stage(name):
    rs = records(os.path.join(out, name + ".jsonl"))
    s = [r for r in rs if r.get("type") == "summary"]
    p = [r for r in rs if r.get("type") == "phases"]
    return (s[-1] if s else None), (p[-1] if p else None)

pt = records(os.path.join(out, "pytorch.jsonl"))
def mem(b):  # 10 columns
    return f"{b / 2**30:6.2f} GiB" if b >= 2**30 else f"{b / 2**20:6.0f} MiB"
shared = " (2 logical devices on 1 GPU)" if ngpu < 2 else ""
print()
print(f"DataParallel vs one GPU — batch 128 per GPU, fp32, cudnn.benchmark off, median ms/iter over "
      f"{steps} steps (warm-up excluded); stage 2's Python: {gil_src}{shared}")
hdr = f"{'':4s}{'run':46s} {'ms/iter':>8s} {'img/s':>8s} {'x 1 GPU':>8s} {'GPU0 peak':>10s} {'GPU1 peak':>10s} {'GPU0/GPU1':>9s}  phases"
print(hdr)
print("-" * len(hdr))
for m in ("resnet18", "tiny"):
    print(m)
    base, _ = stage(f"stage1_{m}")
    rows = [("stage1, 1 GPU", f"stage1_{m}"), ("stage2 --gpus 2, modelled Python", f"stage2_{m}"),
            ("stage2 --gpus 2, no Python (--gil-*-us 0)", f"stage2_nopy_{m}")]
    if m == "resnet18":
        rows += [("stage2 --gpus 2 --dp-thread-pool", "stage2_pool_resnet18"),
                 ("stage2 --gpus 2 --p2p off", "stage2_p2poff_resnet18"),
                 ("stage2 --gpus 1 (modelled Python, 1 GPU)", "stage2_gpus1_resnet18")]
    for label, name in rows:
        s, p = stage(name)
        if not s:
            if os.path.exists(os.path.join(out, name + ".log")):
                print(f"    {label:46s} failed: see {out}/{name}.log")
            continue
        peaks = s["peak_mem_bytes"]
        rel = s["img_per_s"] / base["img_per_s"] if base and name != f"stage1_{m}" else 1.0
        g1 = mem(peaks[1]) if len(peaks) > 1 else f"{'-':>10s}"
        ratio = f"{peaks[0] / peaks[1]:9.2f}" if len(peaks) > 1 and peaks[1] else f"{'-':>9s}"
        ph = "-"
        if p:
            ph = f"{'add up' if p['adds_up'] else 'DO NOT add up'} ({p['sum_ms']:.2f} vs {p['step_ms']:.2f} ms)"
        print(f"    {label:46s} {s['ms_per_iter_median']:8.2f} {s['img_per_s']:8.0f} {rel:7.2f}x "
              f"{mem(peaks[0])} {g1} {ratio}  {ph}")
    single = [r for r in pt if r.get("model") == m and r.get("mode") == "single" and r.get("type") == "summary"]
    dp = [r for r in pt if r.get("model") == m and r.get("mode") == "dp"]
    for label, rs in (("PyTorch, 1 GPU", single), ("PyTorch nn.DataParallel, 2 GPUs", dp)):
        if not rs:
            print(f"    {label:46s} not measured (see {out}/pytorch.log)")
            continue
        r = rs[-1]
        if r.get("type") == "skipped":
            print(f"    {label:46s} skipped: {r['why']}")
            continue
        peaks = r["peak_mem_bytes"]
        rel = r["img_per_s"] / single[-1]["img_per_s"] if single else float("nan")
        g1 = mem(peaks[1]) if len(peaks) > 1 else f"{'-':>10s}"
        ratio = f"{peaks[0] / peaks[1]:9.2f}" if len(peaks) > 1 and peaks[1] else f"{'-':>9s}"
        print(f"    {label + ' (torch ' + r['torch'] + ')':46s} {r['ms_per_iter_median']:8.2f} {r['img_per_s']:8.0f} "
              f"{rel:7.2f}x {mem(peaks[0])} {g1} {ratio}  -")
print("x 1 GPU: images/s relative to the same family's one-GPU run (stage1, or PyTorch 1 GPU).")
PY
