#!/usr/bin/env bash
# get_cifar10.sh — download the CIFAR-10 binary version and unpack it for --data.
#
# Usage: docs/get_cifar10.sh [DIR]                   (default: ./data/cifar-10-batches-bin)
#        docs/get_cifar10.sh --archive FILE [DIR]    unpack a cifar-10-binary.tar.gz you already have
#                                                    (a machine without network: a workshop's copy)
#
# Afterwards DIR holds data_batch_1.bin .. data_batch_5.bin (50000 training images) and
# test_batch.bin (10000 test images), each record 1 label byte + 3072 pixel bytes, and you can run
#   ./stage1 --data DIR
# The archive (~163 MB) comes from the dataset's official page, https://www.cs.toronto.edu/~kriz/cifar.html,
# and is checked against its published MD5 before anything is unpacked. Running the script again
# when DIR is already complete does nothing. Needs curl or wget, tar, and md5sum (or md5 on macOS).
# --archive FILE: no download; FILE must be that same archive (its MD5 is checked as a download's).
set -euo pipefail

URL="https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz"
MD5="c32a1d4ab5d03f1284b67883e8d87530"
FILES="data_batch_1.bin data_batch_2.bin data_batch_3.bin data_batch_4.bin data_batch_5.bin test_batch.bin"
RECORD_BYTES=30730000 # 10000 records × 3073 bytes in every file

usage() { # $1: the exit code (0 when asked for with --help, to stdout; 2 for a wrong command line)
    echo "usage: $0 [--archive FILE] [DIR]   (default DIR ./data/cifar-10-batches-bin; FILE: a" \
        "cifar-10-binary.tar.gz already downloaded)" >&"$(( ${1:-2} ? 2 : 1 ))"
    exit "${1:-2}"
}
die() {
    echo "error: $*" >&2
    exit 1
}

case "${1:-}" in -h | --help) usage 0 ;; esac
GIVEN="" # --archive FILE
if [ "${1:-}" = "--archive" ]; then
    [ "$#" -ge 2 ] && [ -n "$2" ] || usage
    GIVEN="$2"
    shift 2
fi
DIR="${1:-./data/cifar-10-batches-bin}"
if [ "$#" -gt 1 ] || [ "${DIR#-}" != "$DIR" ]; then usage; fi
if [ -n "$GIVEN" ]; then # before anything is made: a wrong path is the whole run's mistake
    [ -e "$GIVEN" ] || die "--archive $GIVEN: no such file (give the cifar-10-binary.tar.gz you downloaded)"
    [ -f "$GIVEN" ] || die "--archive $GIVEN is not a regular file (give the cifar-10-binary.tar.gz itself)"
    [ -r "$GIVEN" ] || die "--archive $GIVEN is not readable (permission denied): chmod a+r it"
fi

file_size() { wc -c <"$1" | tr -d ' '; }

complete() { # every file present with the official size
    local f
    for f in $FILES; do
        [ -f "$DIR/$f" ] && [ "$(file_size "$DIR/$f")" = "$RECORD_BYTES" ] || return 1
    done
}

if complete; then
    echo "CIFAR-10 is already in $DIR"
    exit 0
fi

# What would stop the unpacking, said now rather than after a 163 MB download: DIR a file (mkdir -p
# said only "File exists"), or a directory under one of the six names (mv would move the new file into
# it, and the final check blame the sizes).
[ ! -e "$DIR" ] || [ -d "$DIR" ] || die "$DIR exists and is not a directory: give the folder to unpack into"
for f in $FILES; do
    if [ -e "$DIR/$f" ] && [ ! -f "$DIR/$f" ]; then
        die "$DIR/$f is not a regular file (a directory?): remove it (rm -r), then run this again"
    fi
done

md5_of() {
    if command -v md5sum >/dev/null 2>&1; then
        md5sum "$1" | cut -d' ' -f1
    elif command -v md5 >/dev/null 2>&1; then
        md5 -q "$1"
    else
        die "neither md5sum nor md5 found: cannot verify the download"
    fi
}

if [ -n "$GIVEN" ]; then # checked first: a wrong file makes no folder
    GOT="$(md5_of "$GIVEN")"
    [ "$GOT" = "$MD5" ] || die "--archive $GIVEN has MD5 $GOT, expected $MD5: not the binary version's" \
        "cifar-10-binary.tar.gz (the python or matlab one?), or a damaged copy — get it again from $URL"
fi

# Download next to the destination (same filesystem) and clean up whatever happens: the temporary
# folder always, and on failure the folders this run created for DIR, if they are still empty.
CREATED="" # the topmost folder of DIR's path that did not exist before
d="$DIR"
while [ ! -e "$d" ]; do CREATED="$d"; d="$(dirname "$d")"; done
cleanup() {
    local rc=$? d="$DIR"
    rm -rf "$TMP"
    if [ "$rc" -ne 0 ] && [ -n "$CREATED" ]; then
        while rmdir "$d" 2>/dev/null && [ "$d" != "$CREATED" ]; do d="$(dirname "$d")"; done
    fi
}
TMP=""
trap cleanup EXIT
trap 'exit 130' INT TERM HUP # so that the cleanup runs on Ctrl-C too
err="$(mkdir -p "$DIR" 2>&1)" || die "cannot create $DIR (${err#mkdir: }): give a folder you may write to"
TMP="$(mktemp -d "$DIR/.download.XXXXXX" 2>&1)" || {
    err="$TMP" TMP=""
    die "cannot write into $DIR (${err#mktemp: }): give a folder you may write to"
}
ARCHIVE="$TMP/cifar-10-binary.tar.gz"

# A stalled network must not hang the script: give up on a connection after 20 s, and on a
# transfer slower than 1 kB/s for 60 s (wget: nothing received for 60 s), retrying 3 times.
if [ -n "$GIVEN" ]; then
    ARCHIVE="$GIVEN"
    echo "unpacking $GIVEN (MD5 $MD5: the official archive)"
elif command -v curl >/dev/null 2>&1; then
    echo "downloading $URL"
    curl -fL --retry 3 --connect-timeout 20 --speed-limit 1024 --speed-time 60 -o "$ARCHIVE" "$URL" ||
        die "download failed (curl): no network, a stalled connection, or the URL moved?"
elif command -v wget >/dev/null 2>&1; then
    echo "downloading $URL"
    wget --tries=3 --dns-timeout=20 --connect-timeout=20 --read-timeout=60 -O "$ARCHIVE" "$URL" ||
        die "download failed (wget): no network, a stalled connection, or the URL moved?"
else
    die "neither curl nor wget found: install one, or download $URL by hand and unpack it into $DIR"
fi

if [ -z "$GIVEN" ]; then # a given archive was checked before DIR was made
    GOT="$(md5_of "$ARCHIVE")"
    [ "$GOT" = "$MD5" ] || die "MD5 of the download is $GOT, expected $MD5: corrupt or incomplete download; run again"
fi

# The archive holds cifar-10-batches-bin/{data_batch_*.bin,test_batch.bin,batches.meta.txt,readme.html}.
tar -xzf "$ARCHIVE" -C "$TMP" || die "could not unpack $ARCHIVE"
for f in $FILES; do
    [ -f "$TMP/cifar-10-batches-bin/$f" ] || die "$f is missing from the archive"
    mv -f "$TMP/cifar-10-batches-bin/$f" "$DIR/$f"
done
for f in batches.meta.txt readme.html; do # the class names and the dataset's readme, if present
    if [ -f "$TMP/cifar-10-batches-bin/$f" ]; then mv -f "$TMP/cifar-10-batches-bin/$f" "$DIR/$f"; fi
done

complete || die "files in $DIR do not have the expected size of $RECORD_BYTES bytes"
echo "CIFAR-10 ready in $DIR — train with: ./stage1 --data $DIR"
