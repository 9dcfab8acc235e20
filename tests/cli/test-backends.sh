#!/bin/sh
# tests/cli/test-backends.sh: the plugin boundary is real: the same seeded LeNet-5 run on
# cpu_blas and cpu_onednn (OpenBLAS im2col+GEMM vs oneDNN primitives) gives the same losses.
# Float32 results differ in summation order, and training amplifies that chaotically (with
# Adam the relative difference passes 1e-3 after about 150 steps), so the check covers the
# first 100 steps, where they agree to better than 1e-6, with a 1e-4 bound.
. "${TS_SRCDIR:-.}/tests/cli/lib.sh"
plan 1
if [ ! -f "$TS_BUILDDIR/plugins/cpu_onednn/.libs/cpu_onednn.so" ]; then
    skip "cpu_blas and cpu_onednn train alike" "the cpu_onednn plugin is not built"
    finish
fi
if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
    skip "cpu_blas and cpu_onednn train alike" "Fashion-MNIST is not installed (dataset-fashion-mnist)"
    finish
fi
# LeakSanitizer's exit-time tracer crashes once oneDNN's primitives have run their threads
# (see tests/plugins/test-onednn.c); this test is about numbers, not leaks.
if [ "${TS_SANITIZERS:-no}" = yes ]; then
    ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
    export ASAN_OPTIONS
fi
ARGS="--model lenet5 --max-steps 100 --train-limit 6400 --seed 3 --log-steps"
"$TESSERA" train $ARGS --device cpu_blas >"$TMP/blas" 2>&1 &&
    "$TESSERA" train $ARGS --device cpu_onednn >"$TMP/dnn" 2>&1
rc=$?
grep '^step' "$TMP/blas" >"$TMP/b"
grep '^step' "$TMP/dnn" >"$TMP/d"
worst=$(paste -d' ' "$TMP/b" "$TMP/d" | awk '{r = $4 - $8; if (r < 0) r = -r; r /= $4;
    if (r > m) m = r; n++} END {if (n != 100) print "missing"; else printf "%.3g\n", m}')
if [ $rc -eq 0 ] && [ "$worst" != missing ] && awk "BEGIN{exit !($worst < 1e-4)}"; then
    ok "cpu_blas and cpu_onednn train alike: 100 steps, largest relative loss difference $worst"
else
    fail "cpu_blas and cpu_onednn train alike" "rc=$rc worst=$worst" "$(tail -3 "$TMP/blas")" "$(tail -3 "$TMP/dnn")"
fi
finish
