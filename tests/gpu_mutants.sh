#!/usr/bin/env bash
# gpu_mutants.sh — do the GPU tests catch what they claim to? Each mutant below is a one-line bug
# planted in the CUDA code, of the kind a test was written for; a test binary built with it must
# FAIL that test's suite on the GPU. (CPU mutants need no script: the CPU suites run everywhere,
# and each test a mutation review added names the mutant it kills.)
#
#   bash tests/gpu_mutants.sh build   where nvcc and Check are (the development machine): one test
#                                     binary per mutant, runs/mutants/run_tests.N (CUDA_ARCH, default 90),
#                                     packed into runs/mutants.tar.xz
#   bash tests/gpu_mutants.sh run     on the GPU machine (unpacks the tar if the binaries are not there):
#                                     each binary's suites, JOBS (4) mutants at a time, KILLED or
#                                     SURVIVED; exits 1 if any survives
#   bash tests/gpu_mutants.sh check   anywhere: each mutant's line is in the code exactly once (the
#                                     ops_cuda suite runs it, so that a changed line cannot rot the list)
#
# The GPU machine has no Check, so the binaries travel from where they were built (the device
# tool's carry: runs/mutants.tar.xz).
set -uo pipefail
cd "$(dirname "$(readlink -f "$0")")/.." || exit 1 # (the sanitizer builds call it through a link)
dir=runs/mutants
pack=runs/mutants.tar.xz
ARCH=${CUDA_ARCH:-90}

# name | file | the line as it is | the line mutated | the suites that must fail, any of them
# ('\|' is a literal bar). The first three were written with their tests (2026-12-04); the rest
# (2026-12-06) probe the paths added since the GPU audit of 2026-12-02 — clipping, the 16-byte tails,
# SyncBatchNorm's exchange, the skipped Adam step — and the accumulate flags of every backward; the
# last five, host code only a GPU runs: the CUDA graph cache's key, the conv plan's batch sizes and
# cuBLAS's math mode. (Four more of that round are not kept: three break a guard another line
# repeats — model_prepare clears the graphs and sizes each conv's own workspace for every batch it
# prepares, and a TF32 algorithm is both filtered out and given fp32 math — and the fourth, graphs
# captured while --trace records, is reached only through a stage binary, which `build` leaves as it is.)
# xent-merge-ignores-nan came with test_xent_nan_is_the_maximum (2026-12-07).
MUTANTS=(
  "bn-eps-outside-sqrt|common/kernels.cu|save_invstd[ch] = 1.f / sqrtf(var + eps);|save_invstd[ch] = 1.f / (sqrtf(var) + eps);|ops_cuda"
  "relu-backward-at-zero|common/kernels.cu|float g = y[i] > 0.f ? dy[i] : 0.f;|float g = y[i] >= 0.f ? dy[i] : 0.f;|ops_cuda"
  "scaler-misses-nan|common/kernels.cu|if (!isfinite(v) \|\| !isfinite(inv)) *found_inf = 1.f;|if (isinf(v) \|\| !isfinite(inv)) *found_inf = 1.f;|ops_cuda"
  "sgd-vec4-w-lane-reads-x|common/kernels.cu|sgd_update(p.w, g.w, b.w, lr, momentum, wd, first);|sgd_update(p.w, g.x, b.w, lr, momentum, wd, first);|ops_cuda"
  "avgpool-bwd-nhwc-drops-image|common/kernels.cu|int64_t row = nhwc ? (i / ((int64_t)hw * c)) * c + i % c : i / hw;|int64_t row = nhwc ? i % c : i / hw;|ops_cuda amp"
  "nhwc-cast-transposed|common/kernels.cu|dst[o] = from_f<T>(src[(i * c + ch) * hw + j]);|dst[o] = from_f<T>(src[(i * hw + j) * c + ch]);|ops_cuda amp"
  "cast-add-clear-tail-keeps-src|common/kernels.cu|src[k] = from_f<T>(0.f);|src[k] = src[k];|ops_cuda amp"
  "add-relu-bwd-vec-loads-b-on-acc-a|common/kernels.cu|if (acc_b) vload(db + i * V, b);|if (acc_a) vload(db + i * V, b);|ops_cuda amp"
  "bn-running-var-biased|common/kernels.cu|running_var[ch] = (1.f - momentum) * running_var[ch] + momentum * var * n / (n - 1.f);|running_var[ch] = (1.f - momentum) * running_var[ch] + momentum * var;|ops_cuda"
  "bn-vec-stats-tail-m2|common/kernels.cu|m2[j] += d * (a[j] - mean[j]);|m2[j] += d * d;|ops_cuda amp"
  "bn-vec-grad-no-relu-mask|common/kernels.cu|const float d = relu && !(ay[u][j] > 0.f) ? 0.f : ady[u][j];|const float d = ady[u][j];|ops_cuda amp"
  "bn-dbeta-written-not-added|common/kernels.cu|dbeta[ch] += sdy;|dbeta[ch] = sdy;|ops_cuda"
  "syncbn-stats-drop-m2|common/kernels.cu|chan_merge(n, mean, m2, t[0], t[1], t[2]);|chan_merge(n, mean, m2, t[0], t[1], 0.f);|syncbn"
  "syncbn-grad-last-rank-only|common/kernels.cu|n += t[0], sdy += t[1], sdyx += t[2];|n += t[0], sdy += t[1], sdyx = t[2];|syncbn"
  "syncbn-exchange-keeps-stale-slots|common/kernels.cu|t[0] = mine ? a : 0.f, t[1] = mine ? b : 0.f, t[2] = mine ? d : 0.f;|if (mine) t[0] = a, t[1] = b, t[2] = d;|syncbn"
  "clip-sumsq-drops-vec-tail|common/kernels.cu|VEC_TAIL(k, count, 4) acc += (double)g[k] * (double)g[k];|VEC_TAIL(k, count, 4) acc += 0.0;|clip ops_cuda"
  "clip-sumsq-unaligned-not-squared|common/kernels.cu|GRID_STRIDE(i, count) acc += (double)g[i] * (double)g[i];|GRID_STRIDE(i, count) acc += (double)g[i];|clip ops_cuda"
  "clip-coef-not-clamped|common/kernels.cu|if (c > 1.0f) c = 1.0f;|if (c > 1.0f) c = c;|clip ops_cuda"
  "clip-counts-inf-norm|common/kernels.cu|if (c < 1.0f && isfinite(n)) *clipped += 1;|if (c < 1.0f) *clipped += 1;|clip ops_cuda"
  "scale-vec-drops-tail|common/kernels.cu|VEC_TAIL(k, count, 4) x[k] *= a;|VEC_TAIL(k, count, 4) x[k] *= 1.f;|clip ops_cuda"
  "xent-merge-ignores-nan|common/kernels.cu|if (oa >= 0 && (arg < 0 \|\| om > m \|\| (onan && !mnan) \|\| ((om == m \|\| (onan && mnan)) && oa < arg))) {|if (oa >= 0 && (arg < 0 \|\| om > m \|\| ((om == m \|\| (onan && mnan)) && oa < arg))) {|ops_cuda"
  "adam-skipped-step-applied|common/adam.cu|if (!sc->active) return;|if (!sc->active && 0) return;|adam amp"
  "conv-bwd-data-always-writes|common/ops_cuda.c|accumulate ? &ONE : &ZERO, e->x_desc, dx));|&ZERO, e->x_desc, dx));|ops_cuda"
  "linear-bwd-dx-always-writes|common/ops_cuda.c|out, accumulate ? &ONE : &ZERO, dx, in));|out, &ZERO, dx, in));|ops_cuda"
  "graph-key-ignores-fresh|common/graph.c|if (e->key.x == k.x && e->key.n == k.n && e->key.part == k.part && e->key.fresh == k.fresh) return e;|if (e->key.x == k.x && e->key.n == k.n && e->key.part == k.part) return e;|model"
  "graph-key-ignores-batch-size|common/graph.c|if (e->key.x == k.x && e->key.n == k.n && e->key.part == k.part && e->key.fresh == k.fresh) return e;|if (e->key.x == k.x && e->key.part == k.part && e->key.fresh == k.fresh) return e;|model"
  "graph-key-ignores-part|common/graph.c|if (e->key.x == k.x && e->key.n == k.n && e->key.part == k.part && e->key.fresh == k.fresh) return e;|if (e->key.x == k.x && e->key.n == k.n && e->key.fresh == k.fresh) return e;|model"
  "conv-plan-any-batch-size|common/ops_cuda.c|if (p->entry[i].n == n) return &p->entry[i];|return &p->entry[i];|ops_cuda model"
  "linear-tf32|common/device.c|CHECK_CUBLAS(cublasSetMathMode(d->cublas, CUBLAS_DEFAULT_MATH));|CHECK_CUBLAS(cublasSetMathMode(d->cublas, CUBLAS_TF32_TENSOR_OP_MATH));|ops_cuda"
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
    # One copy of the tree, built once; then each mutant is its file mutated, rebuilt (make redoes
    # that object and the link: ~10 s for kernels.cu), stripped, and the file put back.
    mkdir -p "$dir" && rm -f "$dir"/run_tests.* "$pack"
    work=$(mktemp -d /tmp/gpu_mutant.XXXXXX)
    tar --exclude=./build --exclude=./.git --exclude=./runs --exclude='./tests/run_tests*' \
        --exclude='./stage[0-9]' -cf - . | tar -C "$work" -xf -
    echo "building the tree once (CUDA_ARCH=$ARCH)"
    (cd "$work" && make -s -j"$(nproc)" CUDA_ARCH="$ARCH" tests/run_tests) > "$dir/build.log" 2>&1 ||
      { echo "gpu_mutants: the unmutated tree does not build: $dir/build.log"; exit 1; }
    for i in "${!MUTANTS[@]}"; do
      m=${MUTANTS[$i]} name=$(field "${MUTANTS[$i]}" 1)
      f="$work/$(field "$m" 2)"
      cp -p "$f" "$f.orig"
      mutate "$f.orig" "$(field "$m" 3)" "$(field "$m" 4)" > "$f" || exit 1
      echo "building mutant $i ($name)"
      (cd "$work" && make -s -j"$(nproc)" CUDA_ARCH="$ARCH" tests/run_tests) > "$dir/build.$i.log" 2>&1 ||
        { echo "gpu_mutants: mutant $i ($name) does not build: $dir/build.$i.log"; exit 1; }
      strip -o "$dir/run_tests.$i" "$work/tests/run_tests"
      mv "$f.orig" "$f" && touch "$f" # newer than its object: the next build redoes it
    done
    rm -rf "$work"
    # ~7 MB a binary, too many for the device tool's 64 MiB carry; nearly the same bytes, so xz over
    # the tar (its window spans several binaries) packs them into a few MB.
    (cd "$dir" && tar -cf - run_tests.*) | xz -9 -T"$(nproc)" > "$pack"
    echo "built ${#MUTANTS[@]} mutants in $dir; packed into $pack ($(du -h "$pack" | cut -f1)): carry it" ;;
  run)
    command -v nvidia-smi > /dev/null || { echo "gpu_mutants: no GPU here (nvidia-smi not found)"; exit 2; }
    if [ -f "$pack" ] && [ "$pack" -nt "$dir/run_tests.0" ]; then mkdir -p "$dir" && xz -dc "$pack" | tar -C "$dir" -xf -; fi
    res=$(mktemp -d)
    # JOBS mutants at a time (default 4): each its own test binary, suites and GPU processes
    for i in "${!MUTANTS[@]}"; do
      m=${MUTANTS[$i]} name=$(field "${MUTANTS[$i]}" 1) suites=$(field "${MUTANTS[$i]}" 5)
      [ -x "$dir/run_tests.$i" ] || { echo "gpu_mutants: $dir/run_tests.$i missing: run 'build' first"; exit 2; }
      while [ "$(jobs -rp | wc -l)" -ge "${JOBS:-4}" ]; do wait -n; done
      (
        # shellcheck disable=SC2086 # the suites, one word each
        out=$("$dir/run_tests.$i" $suites 2>&1)
        rc=$?
        if [ $rc -ne 0 ] && ! grep -q "no CUDA device visible" <<< "$out"; then
          echo "KILLED   $name ($suites): $(grep -m1 -E ':F:|:E:' <<< "$out" | cut -c1-160)"
        else
          echo "SURVIVED $name ($suites): exit $rc"
          tail -3 <<< "$out"
        fi > "$res/$i"
      ) &
    done
    wait
    survived=0
    for i in "${!MUTANTS[@]}"; do
      cat "$res/$i"
      grep -q '^SURVIVED' "$res/$i" && survived=$((survived + 1))
    done
    rm -rf "$res"
    echo "gpu_mutants: ${#MUTANTS[@]} mutants, $((${#MUTANTS[@]} - survived)) killed, $survived survived"
    [ "$survived" -eq 0 ] ;;
  check)
    for m in "${MUTANTS[@]}"; do
      mutate "$(field "$m" 2)" "$(field "$m" 3)" "$(field "$m" 4)" > /dev/null || exit 1
    done
    echo "gpu_mutants: ${#MUTANTS[@]} mutants, each line found once" ;;
  *) echo "usage: bash tests/gpu_mutants.sh build|run|check"; exit 2 ;;
esac
