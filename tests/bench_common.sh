# bench_common.sh — sourced by the scripts that run the stages for a table (tests/compare.sh,
# tests/bench_stage1.sh … bench_stage5.sh, bench_stage3_variants.sh, tests/bench_unused.sh) and by
# tests/gpu_faults.sh:
# checks of the knobs they read from the environment, how many GPUs are visible, and the rule for
# the folder their results go to. Every refusal is one line naming the fix, and exits 2.
#
#   bench_ints USAGE VAR...        each VAR that is set must be a whole number ≥ 1
#   bench_choice USAGE VAR WORD... VAR, if set, must be one of the WORDs
#   bench_gpus                     NGPU (GPUs this process may use) and GPU_HOW (how we know)
#   bench_need_gpu SCRIPT CPU_HINT refuse when NGPU is 0, naming what to run on the CPU instead
#   bench_out_dir VAR DIR DEFAULT SCRIPT PATTERN...   DIR made this script's results folder (below)
# shellcheck shell=bash

bench_die() {
    echo "error: $*" >&2
    exit 2
}

# Bash arithmetic dies on "1.5", reads "abc" as an unset variable and "010" as octal: knobs are
# checked before any of them is used. Empty counts as unset, as ${VAR:-default} has it.
bench_ints() {
    local usage=$1 v val
    shift
    for v in "$@"; do
        val=${!v:-}
        [ -z "$val" ] || [[ $val =~ ^[1-9][0-9]{0,8}$ ]] ||
            bench_die "$v=$val is not a whole number from 1 to 999999999 — usage: $usage"
    done
}

bench_choice() {
    local usage=$1 v=$2 w
    shift 2
    [ -z "${!v:-}" ] && return 0
    for w in "$@"; do [ "${!v}" = "$w" ] && return 0; done
    bench_die "$v=${!v} is not one of: $* — usage: $usage"
}

# How many entries of CUDA_VISIBLE_DEVICES CUDA uses: indices or GPU-/MIG- UUIDs, up to the first
# invalid one (CUDA hides that one and every one after it; "" and "-1" hide all).
bench_cvd_count() {
    local n=0 e list
    IFS=, read -r -a list <<< "$CUDA_VISIBLE_DEVICES"
    for e in "${list[@]}"; do
        e=${e// /}
        [[ $e =~ ^[0-9]+$ || $e == GPU-* || $e == MIG-* ]] || break
        n=$((n + 1))
    done
    echo "$n"
}

# nvidia-smi -L lists the machine's GPUs (it ignores CUDA_VISIBLE_DEVICES, which then caps the
# count); without nvidia-smi, PyTorch's count (which honours it); without either, the list itself.
bench_gpus() {
    local n cap=""
    [ -n "${CUDA_VISIBLE_DEVICES+set}" ] && cap=$(bench_cvd_count)
    if command -v nvidia-smi > /dev/null 2>&1; then
        n=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU') || n=0
        GPU_HOW="nvidia-smi -L lists $n"
        if [ -n "$cap" ] && [ "$cap" -lt "$n" ]; then
            n=$cap
            GPU_HOW="$GPU_HOW, CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES leaves $n"
        fi
    elif n=$(python3 -c 'import torch; print(torch.cuda.device_count())' 2> /dev/null | tail -n 1) &&
        [[ $n =~ ^[0-9]+$ ]]; then
        GPU_HOW="no nvidia-smi; PyTorch sees $n"
    elif [ -n "$cap" ]; then
        n=$cap
        GPU_HOW="no nvidia-smi, no PyTorch; CUDA_VISIBLE_DEVICES=$CUDA_VISIBLE_DEVICES lists $n"
    else
        n=0
        GPU_HOW="no nvidia-smi, no PyTorch, no CUDA_VISIBLE_DEVICES"
    fi
    NGPU=$n
}

# The GPU benchmarks time ResNet-18 on CUDA: without a GPU they would grind on the CPU for many
# minutes (or fail in PyTorch's rows) and measure nothing, so they stop at once.
bench_need_gpu() {
    bench_gpus
    [ "$NGPU" -ge 1 ] ||
        bench_die "$1 needs a CUDA GPU and none is visible ($GPU_HOW); on the CPU run $2 instead"
}

# The results folder. Each run deletes the kinds of files it writes there (PATTERN..., e.g.
# '*.jsonl') so that nothing stale reaches the table; so it must be a folder this script made, never
# one holding a student's own files (runs/scaler.jsonl). A new or empty folder gets the marker
# .written-by-SCRIPT and is cleaned on every later run; a non-empty folder without the marker is
# refused — except the script's DEFAULT folder when every file in it is of those kinds (results of
# a run from before the marker existed).
bench_out_dir() {
    local var=$1 dir=$2 default=$3 script=$4 f p foreign="" fix
    shift 4
    local mark="$dir/.written-by-$script"
    if [ ! -f "$mark" ]; then
        [ ! -e "$dir" ] || [ -d "$dir" ] || bench_die "$var=$dir is not a folder — give a new or empty folder"
        for f in "$dir"/* "$dir"/.[!.]* "$dir"/..?*; do
            [ -e "$f" ] || [ -L "$f" ] || continue
            if [ "${dir%/}" = "$default" ] && [ -f "$f" ]; then
                # shellcheck disable=SC2053 # $p is a glob on purpose
                for p in "$@"; do [[ ${f##*/} == $p ]] && continue 2; done
            fi
            [ -n "$foreign" ] || foreign=${f##*/}
            [ -f "$f" ] && { foreign=${f##*/}; break; } # name a file if there is one: it is what would be lost
        done
        fix="give a new or empty folder (or leave $var unset: $default)"
        [ "${dir%/}" = "$default" ] && fix="move such files out, or give a new or empty folder as $var=DIR"
        [ -z "$foreign" ] || bench_die "$var=$dir holds files tests/$script.sh did not write (e.g. $foreign; no" \
            "$mark), and each run deletes its $* there — $fix"
        mkdir -p "$dir" 2> /dev/null || bench_die "cannot create the folder $var=$dir"
        printf '%s\n' "This folder holds the results of tests/$script.sh; each of its runs deletes the $* here" \
            "and writes them anew. Keep your own files elsewhere." > "$mark" 2> /dev/null ||
            bench_die "cannot write into $var=$dir"
    fi
    # a folder an earlier run wrote, now read-only: said once here, not as a failure of every row
    [ -w "$dir" ] && [ -x "$dir" ] ||
        bench_die "cannot write into $var=$dir (an earlier run's results are there) — make it writable," \
            "or give a new or empty folder as $var=DIR"
    for p in "$@"; do rm -f -- "$dir"/$p; done
}
