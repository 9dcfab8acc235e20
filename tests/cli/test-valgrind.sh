#!/bin/sh
# tests/cli/test-valgrind.sh: under valgrind memcheck, with no error and no definitely or
# indirectly lost byte: `tessera info` (loads and unloads every plugin found),
# `tessera train --max-steps 20` (data loading, 20 LeNet-5 steps with Adam, evaluation and a
# checkpoint save) on cpu_blas, and short training runs on cpu_onednn (the installed default
# device), all on a generated Fashion-MNIST-format set small enough for valgrind's pace (2048
# training and 512 test images; the whole set takes many minutes under valgrind).
# The cpu_onednn runs load conf/onednn-jit.supp, which hides only the 32-byte reads past
# buffers that oneDNN's JIT-generated kernels make (first frame in no object file), and turn
# the pool's caching off so that every block is its own allocation whose bounds valgrind sees:
# a bad read or write in tessera's own code on that device is still an error.
# make check: start 2 (the slowest first: tools/gen-lists.sh)
. "${TS_SRCDIR:-.}/tests/cli/lib.sh"
plan 3
NAMES="tessera info is valgrind-clean|tessera train --max-steps 20 is valgrind-clean|tessera train on cpu_onednn is valgrind-clean"
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
        --suppressions="${TS_SRCDIR:-.}/tests/valgrind.supp" $VG_EXTRA "$TESSERA" "$@"
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

# cpu_onednn: 10 MLP steps (oneDNN matmuls, forward and backward, through the primitive cache)
# and 3 LeNet-5 steps (oneDNN convolutions with their reorders into blocked layouts).
name="tessera train on cpu_onednn is valgrind-clean"
if [ ! -f "$TS_BUILDDIR/plugins/cpu_onednn/.libs/cpu_onednn.so" ]; then
    skip "$name" "the cpu_onednn plugin is not built"
    finish
fi
printf '[core]\ndevice = cpu_onednn\nfallback = cpu_blas\nlog_level = warn\n\n%s\n%s\n%s\n' \
    '[plugin.cpu_onednn]' 'threads = 2' 'caching = false' >"$TMP/onednn.ini"
VG_EXTRA="--suppressions=${TS_SRCDIR:-.}/conf/onednn-jit.supp"
rc=0
for run in "--model mlp --max-steps 10" "--model lenet5 --max-steps 3"; do
    # shellcheck disable=SC2086
    vg --config "$TMP/onednn.ini" train $run --device cpu_onednn --data "$TMP/fm" \
        >"$TMP/train3.out" 2>"$TMP/vg3.log"
    rc=$?
    [ $rc -eq 0 ] && ! grep -q "on 'cpu_onednn'" "$TMP/train3.out" && rc=not-on-cpu_onednn
    [ "$rc" = 0 ] || break
done
if [ "$rc" = 0 ]; then
    ok "$name (mlp 10 steps, lenet5 3 steps)"
else
    fail "$name" "train $run: exit $rc" \
        "$(grep -v -e '^==[0-9]*== *$' "$TMP/vg3.log" | grep -m 4 -A 14 -e 'Invalid' \
            -e 'uninitialised' -e 'Mismatched' -e 'definitely lost in' -e 'indirectly lost in' |
            head -60)" "$(tail -5 "$TMP/vg3.log")" "$(tail -5 "$TMP/train3.out")"
fi
finish
