#!/usr/bin/env bash
# run_suites.sh — every test suite as its own tests/run_tests process, JOBS at a time.
#
#   bash tests/run_suites.sh [SUITE...]        (JOBS=3 by default; no SUITE: every suite)
#   make test-parallel [TEST_JOBS=N]
#
# `make test` runs all suites in one process, one after another: on a GPU host that is 7+ minutes,
# most of it a few suites that start whole training runs (resume, dist, ddp, clip). Here each suite
# is a process of its own, the long ones start first, and a machine with cores to spare finishes in
# the time of its longest lane (one H200 host, 16 cores, 4 lanes: 127 s where one process took 8.5
# min, docs/logs/gpu_suites_H200_2026-12-05b.txt; 2 cores, 2 lanes: 232 s where make test took 428). The suites
# can share a machine: each test makes its own temporary directory and picks a free port pair.
# Output: one line per suite, "suite rc=N Ts <Check's summary>", its SKIP lines under it, then the
# total; the full output of a suite that failed is printed after its line. Exit 1 if any suite failed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
JOBS=${JOBS:-3}
case $JOBS in '' | *[!0-9]* | 0) echo "run_suites.sh: JOBS must be a whole number of at least 1, not '$JOBS'" >&2; exit 2 ;; esac
BIN=${TEST_BIN:-tests/run_tests}
[ -x "$BIN" ] || { echo "run_suites.sh: $BIN is not built (make tests/run_tests)" >&2; exit 2; }

all=$(sed -n 's/^ *suite_\([a-z0-9_]*\),$/\1/p' tests/test_main.c)
if [ $# -gt 0 ]; then
    for s in "$@"; do
        grep -qx "$s" <<<"$all" || { echo "run_suites.sh: no suite named '$s' (the suites: $(echo $all))" >&2; exit 2; }
    done
    want="$*"
else
    # the longest first (wall times of one H200 host, 2026-12-05), so no long suite starts last
    slow=$(printf '%s\n' resume dist ddp clip model compare e2e accum dp | grep -xF -f <(echo "$all"))  # those that exist
    want=$(echo "$slow"; grep -vxF -f <(echo "$slow") <<<"$all")
fi

dir=$(mktemp -d "${TMPDIR:-/tmp}/run_suites.XXXXXX") || exit 2
trap 'rm -rf "$dir"' EXIT
t_all=$SECONDS
run_one() {
    local s=$1 t0=$SECONDS
    "$BIN" "$s" > "$dir/$s.out" 2>&1
    echo "$? $((SECONDS - t0))" > "$dir/$s.rc"
}
running=0
for s in $want; do
    if [ "$running" -ge "$JOBS" ]; then wait -n; running=$((running - 1)); fi
    run_one "$s" &
    running=$((running + 1))
done
wait

fail=0 checks=0 failures=0 errors=0
for s in $want; do
    read -r rc wall < "$dir/$s.rc"
    summary=$(grep -E '^[0-9]+%: Checks:' "$dir/$s.out" | tail -n 1)
    echo "$s rc=$rc ${wall}s ${summary:-(no summary: the runner did not finish)}"
    if [[ $summary =~ Checks:\ ([0-9]+),\ Failures:\ ([0-9]+),\ Errors:\ ([0-9]+) ]]; then
        checks=$((checks + BASH_REMATCH[1])) failures=$((failures + BASH_REMATCH[2])) errors=$((errors + BASH_REMATCH[3]))
    fi
    if [ "$rc" != 0 ]; then fail=1; sed 's/^/    /' "$dir/$s.out"
    else grep -E '^SKIP' "$dir/$s.out" | sort -u | sed 's/^/    /'; fi   # what did not run, and why
done
echo "total: $checks checks, $failures failures, $errors errors; $((SECONDS - t_all)) s with $JOBS lanes"
exit $fail
