#!/usr/bin/env bash
# train_parity.sh — does our trainer learn as PyTorch does? `make parity`.
#
# The unit tests compare every op, and two SGD steps of a small ResNet, with PyTorch
# (tests/torch/make_fixtures.py). This is the same question for a whole training run: ResNet-18
# trained with the stages' default recipe (5 epochs, batch 128, SGD lr 0.1 with cosine decay,
# momentum 0.9, weight decay 5e-4, random crops and flips) by ./stage1 (fp32), ./stage5 (--amp fp16 /
# bf16, one process) or ./stage3 (DDP, 2 ranks of batch 64) and by PyTorch (tests/torch/train_parity.py,
# the same recipe in plain PyTorch; DistributedDataParallel for DDP), on
# the same bytes: the synthetic set written as CIFAR-10 files (tests/write_synthetic) and read by both
# through --data. SEEDS seeds each (the weights, the order, the augmentation; the data stay those of
# seed 0). Two runs never draw the same random numbers — PyTorch's initialisation and augmentation
# draws are not ours — so a single pair of runs differs by the seed-to-seed spread alone; the table
# shows each side's seeds, their mean and range, and the difference of the means against that spread.
#
#   CONFIGS   (default "fp32 fp16 bf16 ddp2") fp32: ./stage1, fp16/bf16: ./stage5 --amp, ddp2: ./stage3
#             --nproc-per-node 2 --batch-size 64 (the same 128 a step; on one GPU its two workers share
#             it through --comm host, and PyTorch's through gloo)
#   SEEDS     (3) seeds 1..SEEDS per config and side
#   EPOCHS    (5, the GPU default) passes over the 50000 training images
#   PARITY_OUT (runs/parity) a new or empty folder, or one this script wrote before
#   QUICK=1   the CPU smoke run (tiny model, 1024 training and 256 test images, 2 epochs, CONFIGS
#             "fp32 bf16 ddp2", SEEDS 1): checks the script end to end, measures nothing (make test runs
#             it); PyTorch's column is left out with a SKIP line where torch is not installed.
# Needs a GPU and python3 with torch unless QUICK=1. Timing plays no part: this is about what is learnt.
set -euo pipefail
cd "$(dirname "$0")/.."
. tests/bench_common.sh
USAGE="[CONFIGS='fp32 fp16 bf16 ddp2'] [SEEDS=N] [EPOCHS=N] [PARITY_OUT=DIR] [QUICK=1] bash tests/train_parity.sh (or make parity)"
bench_ints "$USAGE" SEEDS EPOCHS
bench_choice "$USAGE" QUICK 0 1
OUT=${PARITY_OUT:-runs/parity}
QUICK=${QUICK:-0}
if [ "$QUICK" = 1 ]; then
    CONFIGS=${CONFIGS:-fp32 bf16 ddp2} SEEDS=${SEEDS:-1} EPOCHS=${EPOCHS:-2}
    SIZES=(--train-size 1024 --test-size 256) TRAIN=1024 TEST=256 MODEL=tiny DEVICE=cpu
else
    CONFIGS=${CONFIGS:-fp32 fp16 bf16 ddp2} SEEDS=${SEEDS:-3} EPOCHS=${EPOCHS:-5}
    SIZES=() TRAIN=50000 TEST=10000 MODEL=resnet18 DEVICE=cuda
    bench_need_gpu tests/train_parity.sh '`QUICK=1 bash tests/train_parity.sh`'
fi
COMM=() # ddp2: NCCL needs a GPU per rank; two ranks sharing one GPU (or the CPU) use the host ring
if [ "$DEVICE" = cpu ]; then COMM=(--comm host); else [ "$NGPU" -ge 2 ] || COMM=(--comm host); fi
for c in $CONFIGS; do
    case $c in fp32 | fp16 | bf16 | ddp2) ;; *) bench_die "CONFIGS: '$c' is not one of fp32 fp16 bf16 ddp2 — usage: $USAGE" ;; esac
done
TORCH=1
if ! python3 -c 'import torch' 2> /dev/null; then
    [ "$QUICK" = 1 ] || bench_die "PyTorch is needed for its column (python3 -c 'import torch' fails); QUICK=1 runs ours alone"
    TORCH=0
    echo "SKIP  PyTorch's column: python3 has no torch here (the device machine has it); our runs only"
fi
bench_out_dir PARITY_OUT "$OUT" runs/parity train_parity '*.jsonl' '*.log'
for b in stage1 stage3 stage5 tests/write_synthetic; do [ -x "./$b" ] || make "$b" > /dev/null; done
# The 150 MB of files go to a folder of our own making, removed however the run ends — or, after a run
# killed outright (SIGKILL, a lost machine), by the next run: each carries a marker file, and only
# folders with it are removed. Nothing else in PARITY_OUT is touched but the kinds bench_out_dir names.
for d in "$OUT"/data.*; do
    [ -f "$d/.written-by-train_parity" ] && rm -rf "$d" && echo "removed $d, left by a run that was killed"
done
DATA=$(mktemp -d "$OUT/data.XXXXXX") || bench_die "cannot create a folder in PARITY_OUT=$OUT"
trap 'rm -rf "$DATA"' EXIT
: > "$DATA/.written-by-train_parity"
./tests/write_synthetic "$DATA" --train-size "$TRAIN" --test-size "$TEST"
nvidia-smi --query-gpu=name --format=csv,noheader 2> /dev/null | head -n1 | sed 's/^/gpu: /' || true

for c in $CONFIGS; do
    for s in $(seq 1 "$SEEDS"); do
        common=(--data "$DATA" --seed "$s" --epochs "$EPOCHS" --model "$MODEL" --device "$DEVICE" --progress off
            --report "$OUT/ours_${c}_$s.jsonl" "${SIZES[@]}")
        case $c in
            fp32) ./stage1 "${common[@]}" > "$OUT/ours_${c}_$s.log" ;;
            ddp2) ./stage3 --nproc-per-node 2 --batch-size 64 --standalone "${COMM[@]}" "${common[@]}" > "$OUT/ours_${c}_$s.log" ;;
            *) ./stage5 --nproc-per-node 1 --amp "$c" "${common[@]}" > "$OUT/ours_${c}_$s.log" ;;
        esac
        grep '^summary' "$OUT/ours_${c}_$s.log" | sed "s/^/ours  $c seed $s: /"
        if [ "$TORCH" = 1 ]; then
            if [ "$c" = ddp2 ]; then torch=(--nproc 2 --batch-size 64); else torch=(--amp "${c/fp32/off}"); fi
            python3 tests/torch/train_parity.py "$DATA" --seed "$s" --epochs "$EPOCHS" --model "$MODEL" \
                --device "$DEVICE" "${torch[@]}" "${SIZES[@]}" > "$OUT/torch_${c}_$s.jsonl"
            tail -n 1 "$OUT/torch_${c}_$s.jsonl" | sed "s/^/torch $c seed $s: /"
        fi
    done
done

python3 - "$OUT" "$CONFIGS" "$SEEDS" "$TORCH" <<'PY'
import json, statistics, sys
out, configs, seeds, torch_on = sys.argv[1], sys.argv[2].split(), int(sys.argv[3]), sys.argv[4] == "1"
def lines(path, kind):
    return [j for j in map(json.loads, open(path)) if j.get("type") == kind]
def side(name, c):
    finals, curves = [], []
    for s in range(1, seeds + 1):
        p = f"{out}/{name}_{c}_{s}.jsonl"
        summ = lines(p, "summary")[-1]
        finals.append(100 * summ["test_acc"])
        curves.append([100 * e["test_acc"] for e in lines(p, "epoch")])
    return finals, [statistics.mean(e) for e in zip(*curves)]
def cell(v):
    return f"{statistics.mean(v):6.2f} ({min(v):.2f}–{max(v):.2f})"
print()
print(f"test accuracy after training, % — mean over {seeds} seed{'s' * (seeds > 1)} (min–max)")
print(f"{'config':8s} {'ours':>22s} {'PyTorch':>22s} {'ours − PyTorch':>15s}  per-epoch means, ours | PyTorch")
for c in configs:
    ours, ocurve = side("ours", c)
    row = f"{c:8s} {cell(ours):>22s}"
    curve = " ".join(f"{a:.1f}" for a in ocurve)
    if torch_on:
        pt, pcurve = side("torch", c)
        d = statistics.mean(ours) - statistics.mean(pt)
        spread = max(max(ours) - min(ours), max(pt) - min(pt))
        verdict = "within the seeds' spread" if abs(d) <= spread else f"outside the seeds' spread ({spread:.2f})"
        if seeds == 1:
            verdict = "one seed a side, no spread to compare it with"
        row += f" {cell(pt):>22s} {d:+14.2f}   {curve} | {' '.join(f'{a:.1f}' for a in pcurve)}"
        print(row)
        print(f"{'':8s} difference of means {d:+.2f} points: {verdict}")
    else:
        print(row + f" {'(no torch)':>22s} {'':>15s}   {curve}")
PY
