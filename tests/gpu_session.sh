#!/usr/bin/env bash
# gpu_session.sh — everything the GPU machine is needed for, in as few calls as possible.
#
#   bash tests/gpu_session.sh [PART...]     PART: stage1 (default), tests, stage2, stage3, stage4, compare,
#                                           variants1, variants2, parity, parityddp, mutants,
#                                           twogpu
#
# When two GPUs are lent (a session has ~30 minutes of device time, each call at most 10), the order
# that answers the open question first: `twogpu` (the 97% scaling measurement and the checks only two
# GPUs can run), then `variants1`, then `variants2` (where the second GPU's cost goes), then `compare`.
#
#   stage1: PyTorch fixtures (tests/torch/make_fixtures.py, copied into tests/fixtures), the whole
#           test suite with the GPU visible, the default ./stage1 run (timed), and make bench
#   tests:  the whole test suite with the GPU(s) visible, each suite its own process, 4 at a time
#           (tests/run_suites.sh: 127 s on one H200 host, 2026-12-05, where one process took 8.5 min)
#   stage2: tests/bench_stage2.sh (DataParallel vs one GPU vs PyTorch nn.DataParallel)
#   stage3: tests/bench_stage3.sh (DDP vs one GPU vs PyTorch DDP)
#   stage4: the accum and ddp suites with the GPU(s) visible, the PyTorch no_sync fixture
#           (tests/torch/ddp_nosync_fixture.py, gloo: regenerated and diffed against the committed one),
#           and tests/bench_stage4.sh (accumulation vs stages 1 and 3 vs PyTorch DDP with no_sync)
#   compare: make compare (tests/compare.sh): every stage side by side; compare.md and compare.svg
#           also land in $OUT/compare/
#   variants1, variants2: tests/bench_stage3_variants.sh (2 GPUs) split in two halves that each fit a
#           10-minute device call: first the exposed-part flags, DDP without a peer, the second GPU
#           alone and both at once, stage 5, --no-cuda-graph and --sync-bn (rows 26-27); then NCCL's
#           CTA and protocol settings, bucket sizes, --no-overlap and the in-backward optimizer overlap.
#           Together they name every row of the script (its ONLY keys) but the references it adds itself
#   twogpu: (2 GPUs) the suites with checks only two GPUs run (ddp, syncbn, accum over NCCL; dp and
#           trace: stage 2's peer copies and GPU0's extra memory on a second physical GPU), STEPS=100
#           tests/bench_stage3.sh (stage 3's scaling, --sync-bn over NCCL), tests/bench_stage5.sh (its
#           2-GPU --grad-comm fp32 / fp16 rows) and tests/gpu_faults.sh nccl — one device call
#   parity: make parity's precisions (tests/train_parity.sh CONFIGS="fp32 fp16 bf16"): stages 1 and 5
#           and PyTorch trained on the same files, 3 seeds each — about 7 minutes on one H200 (2026-12-05)
#   parityddp: its DDP row (CONFIGS=ddp2, 3 seeds): stage 3 and PyTorch DDP on two ranks — about 6.5
#           minutes on one GPU, where both sides' ranks share it through host memory (2 min a seed)
#   mutants: tests/gpu_mutants.sh run — one-line bugs in the CUDA code the GPU suites must catch
#           (build them first where Check is: bash tests/gpu_mutants.sh build; carry runs/mutants.tar.xz)
#
# Logs go to $OUT (the device tool's folder) or runs/gpu: session.log plus one tar of everything.
# Expects the binaries built (make all tests/run_tests), or builds them. A GPU machine without Check
# (the C test library) cannot build tests/run_tests: build it where Check is (it links Check
# statically, so it runs there), copy it over, and run `make all tests/write_synthetic` there.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
. tests/bench_common.sh # bench_gpus
OUT=${OUT:-runs/gpu}
LOGS="$OUT/logs"
mkdir -p "$LOGS"
export NCCL_NVLS_ENABLE=0
log() { echo "=== $* ($(date +%T))"; }
[ $# -gt 0 ] || set -- stage1
{
  log "gpu"; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  if [ ! -x ./stage1 ] || [ ! -x tests/write_synthetic ]; then make all tests/write_synthetic; fi
  if [ ! -x tests/run_tests ] && ! make tests/run_tests; then
    echo "tests/run_tests could not be built here (no Check?): build it where Check is and copy it over"
  fi
  for part in "$@"; do
    case $part in
      stage1)
        log "fixtures"
        mkdir -p tests/fixtures
        PYTHONUNBUFFERED=1 python3 tests/torch/make_fixtures.py "$LOGS/fixtures" && cp "$LOGS"/fixtures/*.bin tests/fixtures/
        log "tests"; JOBS=${JOBS:-4} bash tests/run_suites.sh; echo "run_suites exit $?"
        log "stage1 default run"; TIMEFORMAT='stage1 default run: wall %R s'
        time ./stage1 --progress off --report "$LOGS/stage1_default.jsonl"
        log "bench stage1"; BENCH_OUT="$LOGS/bench1" bash tests/bench_stage1.sh ;;
      tests) log "tests"; JOBS=${JOBS:-4} bash tests/run_suites.sh; echo "run_suites exit $?" ;;
      stage2) log "bench stage2"; BENCH_OUT="$LOGS/bench2" bash tests/bench_stage2.sh ;;
      stage3) log "bench stage3"; BENCH_OUT="$LOGS/bench3" bash tests/bench_stage3.sh ;;
      stage4)
        log "tests accum, ddp"; ./tests/run_tests accum; echo "run_tests accum exit $?"
        ./tests/run_tests ddp; echo "run_tests ddp exit $?"
        log "fixture ddp_nosync"
        python3 tests/torch/ddp_nosync_fixture.py "$LOGS/ddp_nosync.txt" > /dev/null &&
          { diff <(grep -v '^#' tests/fixtures/ddp_nosync.txt) <(grep -v '^#' "$LOGS/ddp_nosync.txt") &&
            echo "ddp_nosync fixture: same counts as committed"; }
        log "bench stage4"; BENCH_OUT="$LOGS/bench4" bash tests/bench_stage4.sh ;;
      compare)
        log "make compare"; COMPARE_OUT="$LOGS/compare" bash tests/compare.sh; echo "compare exit $?"
        mkdir -p "$OUT/compare" && cp "$LOGS"/compare/compare.md "$LOGS"/compare/compare.svg "$OUT/compare/" ;;
      variants1)
        log "bench stage3 variants, first half"
        ONLY="s3 bafter last1 afterbwd all3 one gpu1 both s5 s5exp eager syncbn" BENCH_OUT="$LOGS/variants1" \
          bash tests/bench_stage3_variants.sh ;;
      variants2)
        log "bench stage3 variants, second half"
        ONLY="cta1 ctas4 ctas8 ctas16 simple ll128 b5 b10 b100 noov inbwd oneafter s5cta1" \
          BENCH_OUT="$LOGS/variants2" bash tests/bench_stage3_variants.sh ;;
      parity) log "make parity, precisions"; CONFIGS="fp32 fp16 bf16" PARITY_OUT="$LOGS/parity" bash tests/train_parity.sh
        echo "train_parity exit $?" ;;
      parityddp) log "make parity, DDP"; CONFIGS=ddp2 PARITY_OUT="$LOGS/parityddp" bash tests/train_parity.sh
        echo "train_parity exit $?" ;;
      mutants) log "gpu mutants"; bash tests/gpu_mutants.sh run; echo "gpu_mutants exit $?" ;;
      twogpu)
        bench_gpus # NGPU, GPU_HOW: as the benchmarks count them (CUDA_VISIBLE_DEVICES too)
        [ "$NGPU" -ge 2 ] || { echo "twogpu needs 2 GPUs: $GPU_HOW"; continue; }
        log "tests ddp syncbn accum dp trace (2 GPUs)"; JOBS=3 bash tests/run_suites.sh ddp syncbn accum dp trace
        echo "run_suites exit $?"
        log "bench stage3"; STEPS=100 BENCH_OUT="$LOGS/bench3" bash tests/bench_stage3.sh
        log "bench stage5"; BENCH_OUT="$LOGS/bench5" bash tests/bench_stage5.sh
        log "gpu faults nccl"; bash tests/gpu_faults.sh nccl; echo "gpu_faults exit $?" ;;
      *) echo "unknown part '$part' (stage1, tests, stage2, stage3, stage4, compare, variants1, variants2," \
              "parity, parityddp, mutants, twogpu)"; exit 2 ;;
    esac
  done
  log "done"
} 2>&1 | tee "$OUT/session.log"
tar -C "$OUT" -czf "$OUT/logs.tgz" logs && rm -rf "$LOGS"
