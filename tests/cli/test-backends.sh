#!/bin/sh
# tests/cli/test-backends.sh: the plugin boundary is real: the same seeded LeNet-5 run on
# cpu_blas and cpu_onednn (OpenBLAS im2col+GEMM vs oneDNN primitives) gives the same losses.
# Float32 results differ in summation order (convolution weight gradients by up to 2.6e-6 of
# their scale), and training with momentum amplifies that exponentially: with Adam the
# relative loss difference passes 1e-3 between steps 98 and 138 depending on the seed
# (docs/backends.md has the step-by-step figures). So the checks are: Adam (the training
# default) for the first 100 steps, where they agree to better than 1e-6, with a 1e-4 bound;
# and plain SGD for 200 steps (2 epochs of 6400 images), where they agree to better than 1e-6,
# with the issue's 1e-3 bound.
. "${TS_SRCDIR:-.}/tests/cli/lib.sh"
plan 4
if [ ! -f "$TS_BUILDDIR/plugins/cpu_onednn/.libs/cpu_onednn.so" ]; then
    for t in "bench compare runs" "bench compare refuses an unknown work" \
        "cpu_blas and cpu_onednn train alike (adam)" "cpu_blas and cpu_onednn train alike (sgd)"; do
        skip "$t" "the cpu_onednn plugin is not built"
    done
    finish
fi
# LeakSanitizer's exit-time tracer crashes once oneDNN's primitives have run their threads
# (see tests/plugins/test-onednn.c); this test is about numbers, not leaks.
if [ "${TS_SANITIZERS:-no}" = yes ]; then
    ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
    export ASAN_OPTIONS
fi
# A smoke test of the side-by-side benchmark (timings are not checked: benchmarks only).
out=$("$TESSERA" bench compare --reps 1 --cpu-time --only "exp 4096" 2>&1)
if [ $? -eq 0 ] && echo "$out" | grep -q "CPU milliseconds" && echo "$out" | grep -q "^  exp 4096 .*cpu_"; then
    ok "bench compare runs"
else
    fail "bench compare runs" "$out"
fi
"$TESSERA" bench compare --only no-such-work >"$TMP/out" 2>&1
rc=$?
if [ $rc -eq 2 ] && grep -q "no work matches" "$TMP/out"; then
    ok "bench compare refuses an unknown work"
else
    fail "bench compare refuses an unknown work" "rc=$rc" "$(cat "$TMP/out")"
fi
if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
    skip "cpu_blas and cpu_onednn train alike (adam)" "Fashion-MNIST is not installed (dataset-fashion-mnist)"
    skip "cpu_blas and cpu_onednn train alike (sgd)" "Fashion-MNIST is not installed (dataset-fashion-mnist)"
    finish
fi
# compare NAME STEPS BOUND ARGS...: trains with ARGS on both, checks every step's loss.
compare() {
    name=$1 steps=$2 bound=$3
    shift 3
    "$TESSERA" train "$@" --device cpu_blas >"$TMP/blas" 2>&1 &&
        "$TESSERA" train "$@" --device cpu_onednn >"$TMP/dnn" 2>&1
    rc=$?
    grep '^step' "$TMP/blas" >"$TMP/b"
    grep '^step' "$TMP/dnn" >"$TMP/d"
    worst=$(paste -d' ' "$TMP/b" "$TMP/d" | awk -v steps="$steps" '{r = $4 - $8; if (r < 0) r = -r;
        r /= $4; if (r > m) m = r; n++} END {if (n != steps) print "missing"; else printf "%.3g\n", m}')
    if [ $rc -eq 0 ] && [ "$worst" != missing ] && awk "BEGIN{exit !($worst < $bound)}"; then
        ok "cpu_blas and cpu_onednn train alike ($name): $steps steps, largest relative loss difference $worst"
    else
        fail "cpu_blas and cpu_onednn train alike ($name)" "rc=$rc worst=$worst" "$(tail -3 "$TMP/blas")" "$(tail -3 "$TMP/dnn")"
    fi
}
COMMON="--model lenet5 --train-limit 6400 --seed 3 --log-steps"
compare adam 100 1e-4 $COMMON --max-steps 100
# One thread per plugin for the 200-step run: with 2 threads cpu_blas spreads a convolution's
# images over threads and adds their weight-gradient partial sums at the end, a different
# summation order from its own 1-thread run; on this trajectory that alone makes cpu_blas at
# 2 threads and cpu_blas at 1 thread differ by 2.8e-2 at step 200 (first at step 136, 6e-8),
# so the bound would measure chaos, not the kernels (docs/backends.md).
sed 's/^threads = .*/threads = 1/' "${TS_SRCDIR:-.}/tests/data/test.ini" >"$TMP/t1.ini"
printf '\n[plugin.cpu_onednn]\nthreads = 1\n' >>"$TMP/t1.ini"
TESSERA_CONFIG="$TMP/t1.ini" compare sgd 200 1e-3 $COMMON --epochs 2 --max-steps 200 \
    --optimizer sgd --lr 0.05
finish
