#!/bin/sh
# tests/cli/test-cuda.sh: the cuda plugin from the command line. Everywhere it is built: it
# loads, and `tessera info` reports its devices or "0 devices (reason)". Without a GPU,
# `tessera bench cuda` says "no GPU" and exits 1, and the GPU checks SKIP. On a GPU: a smoke
# run of `tessera bench cuda`, and a seeded LeNet-5 run of 200 steps whose every loss agrees
# with cpu_blas's to 1e-3 relative.
. "${TS_SRCDIR:-.}/tests/cli/lib.sh"
plan 4
if [ ! -f "$TS_BUILDDIR/plugins/cuda/.libs/cuda.so" ]; then
    for t in "cuda plugin loads" "bench cuda" "bench cuda smoke run" "cuda trains like cpu_blas"; do
        skip "$t" "the cuda plugin is not built (no CUDA Toolkit at configure time)"
    done
    finish
fi
out=$("$TESSERA" info 2>&1)
gpus=$(echo "$out" | sed -n 's/^  cuda: \([0-9][0-9]*\) device.*/\1/p')
if [ -n "$gpus" ] && { [ "$gpus" -gt 0 ] || contains "$out" "cuda: 0 devices ("; }; then
    ok "cuda plugin loads: $(echo "$out" | grep '^  cuda:' | cut -c1-160)"
else
    fail "cuda plugin loads and reports its devices or why it has none" "$out"
    gpus=0
fi

out=$("$TESSERA" bench cuda 2>&1 </dev/null); rc=$?
if [ "$gpus" -eq 0 ]; then
    if [ $rc -eq 1 ] && contains "$out" "no GPU"; then ok "bench cuda says 'no GPU' without one"
    else fail "bench cuda says 'no GPU' without one" "rc=$rc" "$out"; fi
    skip "bench cuda smoke run" "no GPU"
    skip "cuda trains like cpu_blas" "no GPU"
    finish
fi
skip "bench cuda says 'no GPU' without one" "this machine has $gpus GPU(s)"
out=$("$TESSERA" bench cuda --steps 2 --no-cpu 2>&1); rc=$?
if [ $rc -eq 0 ] && contains "$out" "TFLOP/s" && contains "$out" "GB/s" && contains "$out" "steps/s"; then
    ok "bench cuda smoke run"
else
    fail "bench cuda smoke run" "rc=$rc" "$out"
fi

if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
    skip "cuda trains like cpu_blas" "Fashion-MNIST is not installed (dataset-fashion-mnist)"
    finish
fi
ARGS="--model lenet5 --max-steps 200 --train-limit 12800 --seed 3 --log-steps"
"$TESSERA" train $ARGS --device cpu_blas >"$TMP/cpu" 2>&1 &&
    "$TESSERA" train $ARGS --device cuda >"$TMP/gpu" 2>&1
rc=$?
grep '^step' "$TMP/cpu" >"$TMP/c"
grep '^step' "$TMP/gpu" >"$TMP/g"
worst=$(paste -d' ' "$TMP/c" "$TMP/g" | awk '{r = $4 - $8; if (r < 0) r = -r; r /= $4;
    if (r > m) m = r; n++} END {if (n != 200) print "missing"; else printf "%.3g\n", m}')
if [ $rc -eq 0 ] && [ "$worst" != missing ] && grep -q "on 'cuda'" "$TMP/gpu" &&
    awk "BEGIN{exit !($worst < 1e-3)}"; then
    ok "cuda trains like cpu_blas: 200 steps, largest relative loss difference $worst"
else
    fail "cuda trains like cpu_blas (200 steps, 1e-3)" "rc=$rc worst=$worst" "$(tail -3 "$TMP/cpu")" "$(tail -3 "$TMP/gpu")"
fi
finish
