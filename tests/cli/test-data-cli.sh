#!/bin/sh
# tests/cli/test-data-cli.sh: `tessera train` on data that must not train: a training or test
# set of 0 images, and a gzip IDX file with bytes after its gzip member, each exit non-zero
# with a message naming the file. A sound set of the same shape trains (the control).
. "${TS_SRCDIR:-.}/tests/cli/lib.sh"
plan 4

# IDX files as Fashion-MNIST ships them (gzip, uint8 (N, 28, 28) images, (N) labels).
be32() { printf "$(printf '\\%03o\\%03o\\%03o\\%03o' $(($1 >> 24 & 255)) $(($1 >> 16 & 255)) \
    $(($1 >> 8 & 255)) $(($1 & 255)))"; }
bytes() { LC_ALL=C awk -v n="$1" -v m="$2" -v seed="$3" \
    'BEGIN { srand(seed); for (i = 0; i < n; i++) printf "%c", int(rand() * m) }'; }
mkset() { # dir prefix count
    mkdir -p "$1"
    { printf '\000\000\010\003'; be32 "$3"; be32 28; be32 28; bytes $(($3 * 784)) 256 "$3"; } |
        gzip -1 >"$1/$2-images-idx3-ubyte.gz"
    { printf '\000\000\010\001'; be32 "$3"; bytes "$3" 10 7; } |
        gzip -1 >"$1/$2-labels-idx1-ubyte.gz"
}
train() { # dir [options]: a short training run on cpu_blas
    d=$1; shift
    "$TESSERA" train --device cpu_blas --model mlp --hidden 8 --batch-size 4 --max-steps 2 \
        --data "$d" "$@"
}
# expect_fail NAME NEEDLE... -- COMMAND...: the command exits non-zero (not by a signal) and
# its stderr holds every needle.
expect_fail() {
    name=$1; shift
    needles=
    while [ "$1" != -- ]; do needles="$needles$1|"; shift; done
    shift
    "$@" >"$TMP/out" 2>"$TMP/err"
    rc=$?
    if [ $rc -eq 0 ] || [ $rc -gt 125 ]; then
        fail "$name" "exit $rc" "$(tail -3 "$TMP/err")"
        return
    fi
    missing=
    old_ifs=$IFS; IFS='|'
    for n in $needles; do contains "$(cat "$TMP/err")" "$n" || missing="$missing '$n'"; done
    IFS=$old_ifs
    if [ -n "$missing" ]; then fail "$name" "stderr lacks$missing" "$(tail -3 "$TMP/err")"
    else ok "$name"; fi
}

mkset "$TMP/good" train 16
mkset "$TMP/good" t10k 8
check "a sound 16-image set trains" train "$TMP/good"

mkset "$TMP/empty-train" train 0
mkset "$TMP/empty-train" t10k 8
expect_fail "0 training images: an error naming the file" "0 images" \
    "$TMP/empty-train/train-images-idx3-ubyte.gz" -- train "$TMP/empty-train"

mkset "$TMP/empty-test" train 16
mkset "$TMP/empty-test" t10k 0
expect_fail "0 test images: an error naming the file" "0 images" \
    "$TMP/empty-test/t10k-images-idx3-ubyte.gz" -- train "$TMP/empty-test"

mkset "$TMP/garbage" train 16
mkset "$TMP/garbage" t10k 8
printf 'GARBAGE' >>"$TMP/garbage/train-labels-idx1-ubyte.gz"
expect_fail "bytes after the gzip member: an error naming the file" \
    "bytes after the end of the gzip stream" "$TMP/garbage/train-labels-idx1-ubyte.gz" -- \
    train "$TMP/garbage"

finish
