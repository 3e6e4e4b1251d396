#!/usr/bin/env bash
# gpu_session.sh — everything the GPU machine is needed for, in one go (logs under $OUT or runs/gpu):
#   1. PyTorch fixtures (tests/torch/make_fixtures.py) — copied into tests/fixtures for the tests
#   2. the whole test suite with the GPU visible (CUDA ops vs CPU, CUDA model vs CPU model, …)
#   3. the default ./stage1 run, timed
#   4. the stage 1 vs PyTorch benchmark (tests/bench_stage1.sh)
# Expects ./stage1 and tests/run_tests already built (or builds them with make).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-runs/gpu}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0
log() { echo "=== $* ($(date +%T))"; }
{
  log "gpu"; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  log "fixtures"
  PYTHONUNBUFFERED=1 python3 tests/torch/make_fixtures.py "$OUT/fixtures" && cp "$OUT"/fixtures/*.bin tests/fixtures/
  tar -C "$OUT" -cf "$OUT/fixtures.tar" fixtures && rm -rf "$OUT/fixtures"
  if [ ! -x ./stage1 ] || [ ! -x tests/run_tests ]; then make stage1 tests/run_tests; fi
  log "tests"; ./tests/run_tests; echo "run_tests exit $?"
  log "stage1 default run"; TIMEFORMAT='stage1 default run: wall %R s'
  time ./stage1 --progress off --report "$OUT/stage1_default.jsonl"
  log "bench"; BENCH_OUT="$OUT" bash tests/bench_stage1.sh
  log "done"
} 2>&1 | tee "$OUT/session.log"
