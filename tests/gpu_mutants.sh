#!/usr/bin/env bash
# gpu_mutants.sh — do the GPU tests catch what they claim to? Each mutant below is a one-line bug
# planted in the CUDA code, of the kind a test was written for; a test binary built with it must
# FAIL that test's suite on the GPU. (CPU mutants need no script: the CPU suites run everywhere,
# and each test a mutation review added names the mutant it kills.)
#
#   bash tests/gpu_mutants.sh build   where nvcc and Check are (the development machine): one test
#                                     binary per mutant, runs/mutants/run_tests.N (CUDA_ARCH, default 90)
#   bash tests/gpu_mutants.sh run     on the GPU machine: each binary's suite, KILLED or SURVIVED;
#                                     exits 1 if any survives
#   bash tests/gpu_mutants.sh check   anywhere: each mutant's line is in the code exactly once (the
#                                     ops_cuda suite runs it, so that a changed line cannot rot the list)
#
# The GPU machine has no Check, so the binaries travel from where they were built (the device
# tool's carry: runs/mutants, ~12 MB each). `build` copies the tree once per mutant.
set -uo pipefail
cd "$(dirname "$(readlink -f "$0")")/.." || exit 1 # (the sanitizer builds call it through a link)
dir=runs/mutants
ARCH=${CUDA_ARCH:-90}

# name | file | the line as it is | the line mutated | the suite that must fail ('\|' is a literal bar)
MUTANTS=(
  "bn-eps-outside-sqrt|common/kernels.cu|save_invstd[ch] = 1.f / sqrtf(var + eps);|save_invstd[ch] = 1.f / (sqrtf(var) + eps);|ops_cuda"
  "relu-backward-at-zero|common/kernels.cu|float g = y[i] > 0.f ? dy[i] : 0.f;|float g = y[i] >= 0.f ? dy[i] : 0.f;|ops_cuda"
  "scaler-misses-nan|common/kernels.cu|if (!isfinite(v) \|\| !isfinite(inv)) *found_inf = 1.f;|if (isinf(v) \|\| !isfinite(inv)) *found_inf = 1.f;|ops_cuda"
)

field() { # field K of mutant line $1
  printf '%s' "$1" | sed 's/\\|/\x01/g' | cut -d'|' -f"$2" | tr '\001' '|'
}
# File $1 with line $2 replaced by $3, on stdout; fails unless $2 is there exactly once.
mutate() {
  python3 -c '
import sys
path, old, new = sys.argv[1:4]
s = open(path).read()
if s.count(old) != 1:
    sys.exit(f"gpu_mutants: {old!r} is in {path} {s.count(old)} times, not once: update the mutant")
sys.stdout.write(s.replace(old, new))' "$@"
}

case ${1:-} in
  build)
    mkdir -p "$dir"
    for i in "${!MUTANTS[@]}"; do
      m=${MUTANTS[$i]} name=$(field "${MUTANTS[$i]}" 1)
      work=$(mktemp -d /tmp/gpu_mutant.XXXXXX)
      tar --exclude=./build --exclude=./.git --exclude=./runs --exclude='./tests/run_tests*' \
          --exclude='./stage[0-9]' -cf - . | tar -C "$work" -xf -
      f="$work/$(field "$m" 2)"
      mutate "$f" "$(field "$m" 3)" "$(field "$m" 4)" > "$f.mutant" && mv "$f.mutant" "$f" || exit 1
      echo "building mutant $i ($name)"
      (cd "$work" && make -s -j"$(nproc)" CUDA_ARCH="$ARCH" tests/run_tests) > "$dir/build.$i.log" 2>&1 ||
        { echo "gpu_mutants: mutant $i ($name) does not build: $dir/build.$i.log"; exit 1; }
      cp "$work/tests/run_tests" "$dir/run_tests.$i"
      rm -rf "$work"
    done
    echo "built ${#MUTANTS[@]} mutants in $dir" ;;
  run)
    command -v nvidia-smi > /dev/null || { echo "gpu_mutants: no GPU here (nvidia-smi not found)"; exit 2; }
    survived=0
    for i in "${!MUTANTS[@]}"; do
      m=${MUTANTS[$i]} name=$(field "${MUTANTS[$i]}" 1) suite=$(field "${MUTANTS[$i]}" 5)
      [ -x "$dir/run_tests.$i" ] || { echo "gpu_mutants: $dir/run_tests.$i missing: run 'build' first"; exit 2; }
      out=$("$dir/run_tests.$i" "$suite" 2>&1)
      rc=$?
      if [ $rc -ne 0 ] && ! grep -q "no CUDA device visible" <<< "$out"; then
        echo "KILLED   $name ($suite): $(grep -m1 -E ':F:|:E:' <<< "$out" | cut -c1-160)"
      else
        echo "SURVIVED $name ($suite): exit $rc"; survived=1
        tail -3 <<< "$out"
      fi
    done
    exit $survived ;;
  check)
    for m in "${MUTANTS[@]}"; do
      mutate "$(field "$m" 2)" "$(field "$m" 3)" "$(field "$m" 4)" > /dev/null || exit 1
    done
    echo "gpu_mutants: ${#MUTANTS[@]} mutants, each line found once" ;;
  *) echo "usage: bash tests/gpu_mutants.sh build|run|check"; exit 2 ;;
esac
