#!/bin/sh
# tests/cli/test-cuda.sh: the cuda plugin from the command line. Everywhere it is built: it
# loads, and `tessera info` reports its devices or "0 devices (reason)". Without a GPU,
# `tessera bench cuda` says "no GPU" and exits 1, and the GPU checks SKIP. On a GPU: a smoke
# run of `tessera bench cuda`, and 20 LeNet-5 training steps on cuda with a finite loss each.
# Whether cuda computes a training step correctly is tests/plugins/test-train-reference
# (test_gpu_steps: the step against float64 reference kernels with bounds derived from
# float32 rounding), not a comparison of two 200-step trajectories, which amplify one-ulp
# differences exponentially and depend on the CPU the cpu_blas side ran on.
. "${TS_SRCDIR:-.}/tests/cli/lib.sh"
plan 4
if [ ! -f "$TS_BUILDDIR/plugins/cuda/.libs/cuda.so" ]; then
    for t in "cuda plugin loads" "bench cuda" "bench cuda smoke run" "cuda trains"; do
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
    skip "cuda trains" "no GPU"
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
    skip "cuda trains" "Fashion-MNIST is not installed (dataset-fashion-mnist)"
    finish
fi
ARGS="--model lenet5 --max-steps 20 --train-limit 2000 --seed 3 --log-steps"
"$TESSERA" train $ARGS --device cuda >"$TMP/gpu" 2>&1
rc=$?
n=$(grep -c '^step' "$TMP/gpu")
bad=$(grep '^step' "$TMP/gpu" | awk '{if (!($4 + 0 == $4 + 0) || $4 == "nan" || $4 == "inf" || $4 == "-nan") n++} END {print n + 0}')
if [ $rc -eq 0 ] && [ "$n" -eq 20 ] && [ "$bad" -eq 0 ] && grep -q "on 'cuda'" "$TMP/gpu"; then
    ok "cuda trains: 20 steps, every loss finite"
else
    fail "cuda trains (20 steps, finite losses)" "rc=$rc steps=$n non-finite=$bad" "$(tail -3 "$TMP/gpu")"
fi
finish
