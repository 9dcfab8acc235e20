#!/bin/sh
# tests/cli/test-threads-invariant.sh: cpu_blas's adaptive_threads (on by default) runs its
# kernels on fewer threads while other processes use the cores, but every kernel cuts its work
# for the `threads` setting (GEMM bands, a split reduction's parts, a convolution's image
# slots), so the bits do not follow the machine's load. Here TESSERA_RUN_THREADS=1 pins the
# running threads to 1 of the 2 configured, as adaptive_threads would with one core taken, and
# each model's checkpoint after 10 steps must be byte-identical to the one trained on both
# threads. Then live: beside a process spinning on a core, with each plugin's default settings
# (cpu_onednn does not adapt by default: oneDNN's matmuls partition by the count they run on),
# the same checkpoints as alone. Needs Fashion-MNIST for the image models (skipped without
# it); the GPT trains on a generated text.
# make check: start 8 (the slowest first: tools/gen-lists.sh)
. "${TS_SRCDIR:-.}/tests/cli/lib.sh"
# LeakSanitizer's tracer crashes once oneDNN's threads have run in a process (the exit status
# of the run, not its checkpoint, would fail); tessera's own objects are checked elsewhere.
if [ "${TS_SANITIZERS:-no}" = yes ]; then
    ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
    export ASAN_OPTIONS
fi
DATA=/usr/share/datasets/fashion-mnist
CASES="mlp lenet5 cnn gpt gpt-bf16 gpt-fused"
LIVE="cpu_blas:lenet5 cpu_blas:gpt"
[ -f "$TS_BUILDDIR/plugins/cpu_onednn/.libs/cpu_onednn.so" ] && LIVE="$LIVE cpu_onednn:gpt"
plan $(($(echo $CASES | wc -w) + $(echo $LIVE | wc -w)))
awk 'BEGIN { split("the quick brown fox jumps over a lazy dog and a curious cat", w, " ");
    s = 7; while (n < 20000) { s = (s * 1103515245 + 12345) % 2147483648; x = w[1 + int(s / 65536) % 12] " ";
    printf "%s", x; n += length(x) } }' >"$TMP/g.txt"
train() { # TAG CASE PLUGIN [ENV...]: the 10-step checkpoint $TMP/TAG.ckpt
    tag=$1 case=$2 plugin=$3
    shift 3
    printf '[core]\ndevice = %s\n[plugin.%s]\nthreads = 2\n' "$plugin" "$plugin" >"$TMP/$plugin.ini"
    case $case in
    gpt*)
        extra="--context 32 --batch-size 8"
        [ "$case" = gpt-bf16 ] && extra="$extra --precision bf16"
        # from 512 keys the CPU plugins run the fused attention kernel
        [ "$case" = gpt-fused ] && extra="--context 512 --batch-size 2"
        env "$@" TESSERA_CONFIG="$TMP/$plugin.ini" "$TESSERA" train --model gpt --text "$TMP/g.txt" \
            --steps 10 --layers 2 --heads 2 --embd 32 --eval-every 10 --seed 7 $extra \
            --save "$TMP/$tag.ckpt" >"$TMP/$tag.out" 2>&1 ;;
    *)
        env "$@" TESSERA_CONFIG="$TMP/$plugin.ini" "$TESSERA" train --model "$case" \
            --train-limit 256 --batch-size 32 --epochs 1 --max-steps 10 --seed 7 \
            --save "$TMP/$tag.ckpt" >"$TMP/$tag.out" 2>&1 ;;
    esac
}
for case in $CASES; do
    what="cpu_blas $case: 10 steps on 1 running thread of 2 == on 2, byte for byte"
    if [ "${case#gpt}" = "$case" ] && [ ! -f "$DATA/train-images-idx3-ubyte.gz" ]; then
        skip "$what" "Fashion-MNIST is not installed (Debian package dataset-fashion-mnist)"
        continue
    fi
    if train two "$case" cpu_blas X=1 && train one "$case" cpu_blas TESSERA_RUN_THREADS=1 &&
        cmp -s "$TMP/two.ckpt" "$TMP/one.ckpt"; then
        ok "$what"
    else
        fail "$what" "$(tail -3 "$TMP/two.out")" "$(tail -3 "$TMP/one.out")" \
            "$(cmp "$TMP/two.ckpt" "$TMP/one.ckpt" 2>&1)"
    fi
done
# And as it happens: each plugin's defaults beside a process that keeps a core busy, against
# the same run alone.
for live in $LIVE; do
    plugin=${live%:*} case=${live#*:}
    what="$plugin $case: 10 steps beside a busy process (default settings) == alone, byte for byte"
    if [ "$case" = lenet5 ] && [ ! -f "$DATA/train-images-idx3-ubyte.gz" ]; then
        skip "$what" "Fashion-MNIST is not installed (Debian package dataset-fashion-mnist)"
        continue
    fi
    sh -c 'while :; do :; done' &
    hog=$!
    sleep 1 # a sample of the machine sees it
    train busy "$case" "$plugin" X=1
    rc=$?
    kill $hog
    wait $hog 2>/dev/null
    if [ $rc -eq 0 ] && train alone "$case" "$plugin" X=1 && cmp -s "$TMP/busy.ckpt" "$TMP/alone.ckpt"; then
        ok "$what"
    else
        fail "$what" "rc=$rc" "$(tail -3 "$TMP/busy.out")" "$(cmp "$TMP/busy.ckpt" "$TMP/alone.ckpt" 2>&1)"
    fi
done
finish
