#!/bin/sh
# tests/cli/test-example.sh: the C API's worked examples, built by make check against the build
# tree and run on 1024 training images a epoch: examples/c/fashion_cnn.c (the built-in CNN:
# train, evaluate, save, reload) learns, the reloaded model scores exactly what the trained one
# did, in at most 40 lines of code; examples/c/custom_block.c (a residual block with an RMSNorm
# of its own) learns, in at most 60. The installed copies are the same files (docs/nn.md).
# make check: start 7 (the slowest first: tools/gen-lists.sh)
. "${TS_SRCDIR:-.}/tests/cli/lib.sh"
plan 2
if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
    skip "the examples train" "Fashion-MNIST is not installed (Debian package dataset-fashion-mnist)"
    skip "the examples train" "Fashion-MNIST is not installed (Debian package dataset-fashion-mnist)"
    finish
fi
# Lines of code: not blank, not a comment line.
code_lines() { grep -v '^[[:space:]]*$' "$1" | grep -cv '^[[:space:]]*/\{0,1\}\*'; }
acc_of() { sed -n "s/^$1.*test accuracy \([0-9.]*\)\$/\1/p"; }

out=$(cd "$TMP" && "$TS_BUILDDIR/examples/c/fashion_cnn" 1024 2>&1)
rc=$?
a2=$(echo "$out" | acc_of "epoch 2:")
ar=$(echo "$out" | acc_of "reloaded:")
lines=$(code_lines "$TS_SRCDIR/examples/c/fashion_cnn.c")
if [ $rc -eq 0 ] && [ -n "$a2" ] && [ "$a2" = "$ar" ] && awk "BEGIN{exit !($a2 > 0.5)}" &&
    [ "$lines" -le 40 ] && [ -s "$TMP/fashion_cnn.safetensors" ]; then
    ok "fashion_cnn trains (test accuracy $a2 on 1024 images), saves and reloads to the same accuracy; $lines lines of code"
else
    fail "fashion_cnn trains, evaluates, saves and reloads in at most 40 lines of code" "rc=$rc lines=$lines" "$out"
fi

out=$(cd "$TMP" && "$TS_BUILDDIR/examples/c/custom_block" 1024 2>&1)
rc=$?
a2=$(echo "$out" | acc_of "epoch 2:")
lines=$(code_lines "$TS_SRCDIR/examples/c/custom_block.c")
if [ $rc -eq 0 ] && [ -n "$a2" ] && awk "BEGIN{exit !($a2 > 0.5)}" && [ "$lines" -le 60 ]; then
    ok "custom_block (RMSNorm in a residual block) trains: test accuracy $a2 on 1024 images; $lines lines of code"
else
    fail "custom_block trains in at most 60 lines of code" "rc=$rc lines=$lines" "$out"
fi
finish
