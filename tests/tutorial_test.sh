#!/usr/bin/env bash
# tutorial_test.sh — the doc test: run every command of the tutorial that works on the CPU backend,
# so the tutorial cannot rot. `./tests/run_tests tutorial` calls it; it also runs on its own:
#
#   bash tests/tutorial_test.sh [TUTORIAL.md]     (default docs/tutorial.md)
#
# Which blocks run is said in the Markdown itself, by the words after the fence's language:
#   ```sh cpu-test           run it (from the repository root, under bash -e -o pipefail); it must exit 0
#   ```sh cpu-test exit=N    run it; it must exit with status N (`diff` of two files that differ exits 1;
#                            a demonstrated error, e.g. a rank dying, exits with its own code)
#   ```sh cpu-test-pending   a CPU command whose stage is not merged yet: listed, not run (flip it to
#                            cpu-test once it is)
#   ```sh                    shown, never run (GPU commands, `make`, long runs)
# Inside a cpu-test block, a comment line `# expect: TEXT` says the block's output must contain TEXT
# (a fixed string): what the page's prose quotes from that output, so the figures cannot drift.
#
# A bare ``` block whose first line starts with `$ ` is a transcript (a stage README's way to show a
# run): its `$ ` lines run, in order, and must exit 0; every other line is output that must appear,
# in order, as a whole line — where `…` or `...` stands for any text, and a line of just `...` for any
# lines. So a README's quoted run cannot drift either. A page with transcripts needs no cpu-test block.
# That the Chinese translation holds the same blocks, markers and commands is tests/doc_check.py's
# check (every translation's, this one's included).
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
abs() { case "$1" in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
md=$(abs "${1:-$here/docs/tutorial.md}")
[ -f "$md" ] || { echo "tutorial_test: $md not found"; exit 2; }
tmp=$(mktemp -d /tmp/tutorial_test.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/files" # the blocks' /tmp and runs/ (see below)

# Split a Markdown file's ```sh blocks into $2/N.sh (the commands), $2/N.tag (the marker words) and
# $2/N.line (the fence's line number); an unterminated fence is an error.
split_blocks() {
    mkdir -p "$2"
    awk -v dir="$2" '
        !inb && /^```sh([ \t].*)?$/ { inb = 1; n++; tag = $0; sub(/^```sh[ \t]*/, "", tag)
                                      print tag > (dir "/" n ".tag"); print NR > (dir "/" n ".line")
                                      printf "" > (dir "/" n ".sh"); next }
        inb && /^```[ \t]*$/       { inb = 0; next }
        inb                        { print > (dir "/" n ".sh") }
        END { if (inb) { print "unterminated ```sh block at the end of the file"; exit 1 } print n + 0 > (dir "/count") }
    ' "$1"
}
# A Markdown file's transcripts (bare ``` blocks whose first line starts with "$ ") into $2/tN.cmd (the
# commands, "$ " dropped), $2/tN.want (the output lines) and $2/tN.line; their count into $2/tcount.
split_transcripts() {
    mkdir -p "$2"
    awk -v dir="$2" '
        !inb && /^```[ \t]*$/ { inb = 1; first = 1; next }
        !inb && /^```/        { inb = 2; next }
        inb && /^```[ \t]*$/  { inb = 0; next }
        inb == 1 && first     { first = 0
                                if (substr($0, 1, 2) != "$ ") { inb = 2; next }
                                n++; printf "" > (dir "/t" n ".cmd"); printf "" > (dir "/t" n ".want")
                                print NR > (dir "/t" n ".line") }
        inb == 1 && substr($0, 1, 2) == "$ " { print substr($0, 3) > (dir "/t" n ".cmd"); next }
        inb == 1              { print > (dir "/t" n ".want") }
        END { print n + 0 > (dir "/tcount") }
    ' "$1"
}
# The first line of $1 (wanted output lines, `…`/`...` as wildcards) that $2 (the output) lacks, in
# order; nothing when every one is there.
first_missing() {
    awk -v want="$1" '
        function matches(l, w,   parts, k, i, at, p) {
            gsub(/\.\.\./, "…", w); sub(/[ \t]+$/, "", w); sub(/[ \t]+$/, "", l)
            k = split(w, parts, "…")
            if (k == 1) return l == w
            if (substr(l, 1, length(parts[1])) != parts[1]) return 0
            at = length(parts[1]) + 1
            for (i = 2; i < k; i++) {
                p = index(substr(l, at), parts[i]); if (!p) return 0
                at += p - 1 + length(parts[i])
            }
            return length(parts[k]) == 0 || (length(l) - at + 1 >= length(parts[k]) &&
                                              substr(l, length(l) - length(parts[k]) + 1) == parts[k])
        }
        BEGIN { while ((getline w < want) > 0) { t = w; gsub(/[ \t]/, "", t); if (t != "...") W[++nw] = w } j = 1 }
        j <= nw && matches($0, W[j]) { j++ }
        END { if (j <= nw) print W[j] }
    ' "$2"
}
# A loopback port nothing listens on, below the kernel's ephemeral range (32768 and up).
free_port() {
    local p
    while :; do
        p=$((20000 + RANDOM % 12000))
        (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo "$p"; return; }
    done
}
# The commands of a block without its comments.
strip_comments() { sed -e '/^[[:space:]]*#/d' -e 's/[[:space:]][[:space:]]*# .*$//' -e 's/[[:space:]]*$//' "$1"; }

split_blocks "$md" "$tmp/en" || { echo "tutorial_test: $md: cannot parse"; exit 2; }
n=$(cat "$tmp/en/count")
fail=0
name=${md#$here/}

# Run the commands in file $1 under bash -e -o pipefail, from the repository root: output into
# $tmp/out, exit status into rc. The blocks use the default rendezvous port (29500), as a reader types
# them. Another job on this machine holding it is not the tutorial's fault, so each ./stage3–5 gets a
# free port first (a --master-port the block gives itself comes later on the line, and wins; a line
# with --standalone, which picks its own, is left as it is).
# Likewise the page's files: those under runs/ (`rm -rf runs/tutorial/ddp_run`, `--save
# runs/tutorial/ddp_run`, reports; a reader's go into their own clone) and any under /tmp go into
# this run's own directory instead, shared by its blocks, so that the checkout keeps a reader's
# runs/ as it was, and two runs of this test on one machine do not delete or lock each other's
# files. Only a path that starts with runs/ or ./runs/ as a word moves: not ./stage1, tests/…,
# docs/logs/runs/… or my_runs/.
run_block() {
    local port
    port=$(free_port)
    sed -E -e "/--standalone/!s#(^|[[:space:]])\./stage([345])([[:space:]]|\$)#\1./stage\2 --master-port $port\3#g" \
        -e "s#(^|[^[:alnum:]_.])/tmp/#\1$tmp/files/#g" \
        -e "s#(^|[^[:alnum:]_./-])(\./)?runs/#\1$tmp/files/runs/#g" "$1" > "$tmp/run.sh"
    timeout 300 bash -e -o pipefail "$tmp/run.sh" > "$tmp/out" 2>&1 < /dev/null
    rc=$?
}

# Run the CPU blocks.
cd "$here" || exit 1
ran=0 pending=0
for i in $(seq 1 "$n"); do
    tag=$(cat "$tmp/en/$i.tag") line=$(cat "$tmp/en/$i.line")
    case " $tag " in
        *" cpu-test-pending "*) pending=$((pending + 1)); continue ;;
        *" cpu-test "*) ;;
        *) continue ;;
    esac
    expect=0
    for w in $tag; do case "$w" in exit=*) expect=${w#exit=} ;; esac; done
    first=$(strip_comments "$tmp/en/$i.sh" | head -n1)
    t0=$(date +%s.%N)
    run_block "$tmp/en/$i.sh"
    dt=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    ran=$((ran + 1))
    missing=""
    while IFS= read -r want; do
        [ -z "$missing" ] && ! grep -qF -- "$want" "$tmp/out" && missing=$want
    done < <(sed -n 's/^[[:space:]]*# expect: //p' "$tmp/en/$i.sh")
    if [ "$rc" != "$expect" ] || [ -n "$missing" ]; then
        what="exited with code $rc (the tutorial expects $expect)"
        [ "$rc" = "$expect" ] && what="printed no '$missing' (its '# expect:' line)"
        echo "FAIL: block $i ($name line $line) $what:"
        sed 's/^/    $ /' "$tmp/en/$i.sh"
        echo "  last lines of its output:"
        tail -n 15 "$tmp/out" | sed 's/^/    /'
        fail=1
    else
        printf 'ok   block %2d (line %3d, %5s s, exit %d): %s\n' "$i" "$line" "$dt" "$rc" "$first"
    fi
done

# The transcripts, run as the blocks are (run_block).
split_transcripts "$md" "$tmp/tr"
nt=$(cat "$tmp/tr/tcount")
for i in $(seq 1 "$nt"); do
    line=$(cat "$tmp/tr/t$i.line")
    run_block "$tmp/tr/t$i.cmd"
    missing=$(first_missing "$tmp/tr/t$i.want" "$tmp/out")
    if [ "$rc" != 0 ] || [ -n "$missing" ]; then
        what="exited with code $rc"
        [ "$rc" = 0 ] && what="printed no line like '$missing' (after the lines before it)"
        echo "FAIL: transcript $i ($name line $line) $what:"
        sed 's/^/    $ /' "$tmp/tr/t$i.cmd"
        echo "  last lines of its output:"
        tail -n 15 "$tmp/out" | sed 's/^/    /'
        fail=1
    else
        printf 'ok   transcript %2d (line %3d): %s\n' "$i" "$line" "$(head -n1 "$tmp/tr/t$i.cmd")"
    fi
done
echo "tutorial_test: $ran CPU blocks run, $pending pending (cpu-test-pending), $n \`\`\`sh blocks, $nt transcripts in $name"
[ "$ran" -gt 0 ] || [ "$nt" -gt 0 ] || { echo "FAIL: no cpu-test block or transcript found in $name"; fail=1; }
exit $fail
