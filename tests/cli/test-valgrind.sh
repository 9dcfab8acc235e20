#!/bin/sh
# tests/cli/test-valgrind.sh: under valgrind memcheck, with no error and no definitely or
# indirectly lost byte: `tessera info` (loads and unloads every plugin found), and
# `tessera train --max-steps 20` (data loading, 20 LeNet-5 steps with Adam, evaluation and a
# checkpoint save) on a generated Fashion-MNIST-format set small enough for valgrind's pace
# (2048 training and 512 test images; the whole set takes many minutes under valgrind).
. "${TS_SRCDIR:-.}/tests/cli/lib.sh"
plan 2
NAMES="tessera info is valgrind-clean|tessera train --max-steps 20 is valgrind-clean"
if [ "${TS_SANITIZERS:-no}" = yes ]; then
    echo "$NAMES" | tr '|' '\n' | while read -r n; do
        skip "$n" "sanitizer build: ASan and valgrind do not mix"; done
    finish
fi
if ! command -v valgrind >/dev/null 2>&1; then
    echo "$NAMES" | tr '|' '\n' | while read -r n; do skip "$n" "valgrind is not installed"; done
    finish
fi
vg() {
    "$TS_BUILDDIR/libtool" --mode=execute valgrind -q --leak-check=full \
        --errors-for-leak-kinds=definite,indirect --error-exitcode=9 \
        --suppressions="${TS_SRCDIR:-.}/tests/valgrind.supp" "$TESSERA" "$@"
}

vg info >/dev/null 2>"$TMP/vg.log"
rc=$?
if [ $rc -eq 0 ]; then
    ok "tessera info is valgrind-clean"
else
    fail "tessera info is valgrind-clean" "exit $rc" "$(tail -30 "$TMP/vg.log")"
fi

# IDX files as Fashion-MNIST ships them (gzip, uint8 (N, 28, 28) images, (N) labels).
be32() { printf "$(printf '\\%03o\\%03o\\%03o\\%03o' $(($1 >> 24 & 255)) $(($1 >> 16 & 255)) \
    $(($1 >> 8 & 255)) $(($1 & 255)))"; }
bytes() { LC_ALL=C awk -v n="$1" -v m="$2" -v seed="$3" \
    'BEGIN { srand(seed); for (i = 0; i < n; i++) printf "%c", int(rand() * m) }'; }
mkset() { # prefix count
    { printf '\000\000\010\003'; be32 "$2"; be32 28; be32 28; bytes $(($2 * 784)) 256 "$2"; } |
        gzip -1 >"$TMP/fm/$1-images-idx3-ubyte.gz"
    { printf '\000\000\010\001'; be32 "$2"; bytes "$2" 10 7; } |
        gzip -1 >"$TMP/fm/$1-labels-idx1-ubyte.gz"
}
mkdir -p "$TMP/fm"
mkset train 2048
mkset t10k 512
vg train --max-steps 20 --data "$TMP/fm" --save "$TMP/vg.ckpt" >"$TMP/train.out" 2>"$TMP/vg2.log"
rc=$?
if [ $rc -eq 0 ] && [ -s "$TMP/vg.ckpt" ]; then
    ok "tessera train --max-steps 20 is valgrind-clean"
else
    fail "tessera train --max-steps 20 is valgrind-clean" "exit $rc" \
        "$(tail -30 "$TMP/vg2.log")" "$(tail -5 "$TMP/train.out")"
fi
finish
