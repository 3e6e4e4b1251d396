#!/usr/bin/env bash
# regen_fixtures.sh — every committed PyTorch fixture (tests/fixtures/), made again by the script
# that made it, so a fixture is never a number someone typed.
#   CHECK=1 bash tests/torch/regen_fixtures.sh   # make each into a scratch folder and compare it with
#                                                # the committed file, byte for byte (exit 1 if any differ;
#                                                # another torch version in a header line, or float64
#                                                # values within 1e-12 relative, count as the same)
#   bash tests/torch/regen_fixtures.sh           # rewrite tests/fixtures/ (after a PyTorch upgrade;
#                                                # then `make test`, and commit with the version)
#   LIST=1 bash tests/torch/regen_fixtures.sh    # which script makes which file (needs no torch)
# Needs python3 with torch. Four fixtures need a CUDA GPU (fused Adam, fused SGD, CUDA autocast,
# SyncBatchNorm); without one they are skipped, visibly, and the committed files stay. CHECK also
# runs the GradScaler trajectories on CUDA and compares them with the CPU's (scaler.txt says they
# are the same rule).
# Where a fixture differs, tests/torch/compare_fixtures.py says which records and by how much.
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
T=tests/torch

# fixture(s) | needs | command; @ is the output folder
GENERATORS=(
    "layers.bin tiny.bin resnet18.bin rng.bin sampler.bin|cpu|python3 $T/make_fixtures.py @"
    "amp.bin|cpu|python3 $T/amp_fixtures.py --out @"
    "amp_cuda.bin|cuda|python3 $T/amp_fixtures.py --device cuda --out @"
    "adam.bin|cpu|python3 $T/make_adam_fixture.py @/adam.bin"
    "clip.bin|cpu|python3 $T/clip_fixture.py @/clip.bin"
    "adam_scaler.bin|cuda|python3 $T/adam_scaler_fixture.py @/adam_scaler.bin"
    "sgd_scaler.bin|cuda|python3 $T/sgd_scaler_fixture.py @/sgd_scaler.bin"
    "syncbn.bin|cuda|python3 $T/syncbn_fixture.py @/syncbn.bin"
    "scaler.txt|cpu|python3 $T/scaler_fixture.py > @/scaler.txt"
    "schedule.txt|cpu|python3 $T/schedule_fixture.py > @/schedule.txt"
    "flops.txt|cpu|python3 $T/flop_count.py @/flops.txt"
    "ddp_nosync.txt|cpu|python3 $T/ddp_nosync_fixture.py @/ddp_nosync.txt"
    "ddp_unused.txt|cpu|python3 $T/ddp_unused_fixture.py @/ddp_unused.txt"
    "ddp_buckets.txt|cpu|python3 $T/ddp_buckets_fixture.py @/ddp_buckets.txt"
)

if [ "${LIST:-0}" = 1 ]; then
    for g in "${GENERATORS[@]}"; do
        IFS='|' read -r files needs cmd <<<"$g"
        for f in $files; do printf '%s\t%s\t%s\n' "$f" "$needs" "${cmd//@/tests/fixtures}"; done
    done
    exit 0
fi

if ! python3 -c "import torch" 2>/dev/null; then
    echo "error: regen_fixtures.sh needs python3 with PyTorch (pip install torch); the committed fixtures" \
         "are what \`make test\` checks against without it" >&2
    exit 2
fi
CUDA=$(python3 -c "import torch; print(int(torch.cuda.is_available()))")
CHECK=${CHECK:-0}
if [ "$CHECK" = 1 ]; then
    DIR=$(mktemp -d); trap 'rm -rf "$DIR"' EXIT
else
    DIR=tests/fixtures
fi
echo "torch $(python3 -c 'import torch; print(torch.__version__)'), CUDA $([ "$CUDA" = 1 ] && echo yes || echo no);" \
     "writing into $DIR"

same=0 alike=0 differ=0 failed=0 skipped=0
for g in "${GENERATORS[@]}"; do
    IFS='|' read -r files needs cmd <<<"$g"
    if [ "$needs" = cuda ] && [ "$CUDA" != 1 ]; then
        echo "SKIP $files — needs a CUDA GPU (the committed file stays)"
        skipped=$((skipped + 1))
        continue
    fi
    run=${cmd//@/$DIR}
    if ! log=$(eval "$run" 2>&1); then
        echo "FAIL $files — \`$run\` exited non-zero:"; echo "$log" | tail -5 | sed 's/^/  /'
        failed=$((failed + 1))
        continue
    fi
    [ "$CHECK" = 1 ] || { echo "made $files"; continue; }
    for f in $files; do
        python3 $T/compare_fixtures.py "tests/fixtures/$f" "$DIR/$f"
        case $? in
            0) echo "same $f"; same=$((same + 1)) ;;
            2) echo "same $f but for another build's torch version line or float64 rounding (above)"
               alike=$((alike + 1)) ;;
            *) echo "DIFFERS $f (above: where)"; differ=$((differ + 1)) ;;
        esac
    done
done

if [ "$CHECK" = 1 ] && [ "$CUDA" = 1 ]; then # the GradScaler rule on CUDA: the CPU trajectories, line for line
    if diff <(python3 $T/scaler_fixture.py cuda | tail -n +2) <(tail -n +2 tests/fixtures/scaler.txt) >/dev/null; then
        echo "same scaler.txt trajectories on CUDA"; same=$((same + 1))
    else
        echo "DIFFERS scaler.txt on CUDA: GradScaler's trajectories are not the CPU's"; differ=$((differ + 1))
    fi
fi
[ "$CHECK" = 1 ] && echo "fixtures: $same the same byte for byte, $alike the same but for the torch version or float64" \
    "rounding, $differ differ, $failed failed, $skipped skipped"
[ $differ = 0 ] && [ $failed = 0 ]
