#!/bin/sh
# tests/cli/test-example.sh: examples/c/fashion_cnn.c, the C API's worked example (a custom
# CNN: train, evaluate, save, reload), built by make check against the build tree and run on
# 1024 training images: it learns, and the reloaded model scores exactly what the trained one
# did. The installed copy is the same file (docs/nn.md shows it).
. "${TS_SRCDIR:-.}/tests/cli/lib.sh"
plan 1
EX="$TS_BUILDDIR/examples/c/fashion_cnn"
if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
    skip "the example trains, evaluates, saves and reloads" "Fashion-MNIST is not installed (Debian package dataset-fashion-mnist)"
    finish
fi
out=$(cd "$TMP" && "$EX" 1024 2>&1)
rc=$?
a2=$(echo "$out" | sed -n 's/^epoch 2: test accuracy \([0-9.]*\)$/\1/p')
ar=$(echo "$out" | sed -n 's/^reloaded: test accuracy \([0-9.]*\)$/\1/p')
lines=$(wc -l <"$TS_SRCDIR/examples/c/fashion_cnn.c")
# the whole program stays within 80 lines (PyTorch's takes about 40; it took 164 before)
if [ $rc -eq 0 ] && [ -n "$a2" ] && [ "$a2" = "$ar" ] && awk "BEGIN{exit !($a2 > 0.5)}" &&
    [ "$lines" -le 80 ] &&
    [ -s "$TMP/fashion_cnn.safetensors" ]; then
    ok "the example trains (test accuracy $a2 on 1024 images), saves and reloads to the same accuracy; $lines lines"
else
    fail "the example trains, evaluates, saves and reloads in at most 80 lines" "rc=$rc lines=$lines" "$out"
fi
finish
