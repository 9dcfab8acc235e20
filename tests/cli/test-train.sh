#!/bin/sh
# tests/cli/test-train.sh: `tessera train` as a user runs it, on a small slice of the real
# Fashion-MNIST (--train-limit): it learns, --json parses, --resume continues bit-identically
# (2 epochs straight == 1 epoch, save, resume 1 more), and bad input gives one clear error.
. "${TS_SRCDIR:-.}/tests/cli/lib.sh"
plan 7
DATA=/usr/share/datasets/fashion-mnist
if [ ! -f "$DATA/train-images-idx3-ubyte.gz" ]; then
    for t in learns json resume-equal resume-mismatch corrupt-resume; do
        skip "$t" "Fashion-MNIST is not installed (Debian package dataset-fashion-mnist)"
    done
else
    COMMON="--model mlp --train-limit 1024 --batch-size 64 --seed 7"

    out=$("$TESSERA" train $COMMON --epochs 3 --json 2>&1)
    last=$(echo "$out" | grep '"epoch"' | tail -1)
    acc=$(echo "$last" | "$JSON_CHECK" test_acc | sed 's/.*=//')
    if [ -n "$acc" ] && awk "BEGIN{exit !($acc > 0.6)}"; then
        ok "learns: test accuracy $acc after 3 epochs on 1024 images"
    else
        fail "learns" "$out"
    fi

    n=$(echo "$out" | wc -l)
    first=$(echo "$out" | head -1 | "$JSON_CHECK" event model arch device optimizer lr batch_size epochs seed world_size start_step 2>&1)
    end=$(echo "$out" | tail -1 | "$JSON_CHECK" event steps steps_this_run seconds last_test_acc best_test_acc best_epoch 2>&1)
    if [ "$n" -eq 5 ] && echo "$out" | sed -n '2,4p' | while read -r l; do echo "$l" | "$JSON_CHECK" epoch train_loss train_acc test_acc seconds pool_in_use pool_reserved pool_peak_reserved >/dev/null || exit 1; done &&
        contains "$first" 'event="start"' && contains "$first" 'model="mlp"' && contains "$first" 'start_step=0' &&
        contains "$end" 'event="end"' && contains "$end" 'steps=48' && contains "$end" 'best_epoch='; then
        ok "--json prints a start record with the configuration, one object per epoch, an end record"
    else
        fail "--json prints start, one object per epoch, end" "$out" "$first" "$end"
    fi

    "$TESSERA" train $COMMON --epochs 2 --save "$TMP/straight.ckpt" --json >/dev/null 2>"$TMP/e1" &&
        "$TESSERA" train $COMMON --epochs 1 --save "$TMP/half.ckpt" --json >/dev/null 2>"$TMP/e2" &&
        "$TESSERA" train $COMMON --epochs 2 --resume "$TMP/half.ckpt" --save "$TMP/resumed.ckpt" \
            --json >/dev/null 2>"$TMP/e3"
    rc=$?
    if [ $rc -eq 0 ] && cmp -s "$TMP/straight.ckpt" "$TMP/resumed.ckpt"; then
        ok "resume: 1 epoch + save + resume 1 epoch == 2 epochs straight, byte for byte"
    else
        fail "resume: 1 epoch + save + resume 1 epoch == 2 epochs straight, byte for byte" \
            "rc=$rc" "$(cat "$TMP/e1" "$TMP/e2" "$TMP/e3")" "$(cmp "$TMP/straight.ckpt" "$TMP/resumed.ckpt" 2>&1)"
    fi

    out=$("$TESSERA" train --model lenet5 --train-limit 1024 --seed 7 --resume "$TMP/half.ckpt" 2>&1)
    rc=$?
    if [ $rc -eq 1 ] && contains "$out" "holds a 'mlp' model"; then
        ok "resuming with another model is a clear error"
    else
        fail "resuming with another model is a clear error" "rc=$rc" "$out"
    fi

    head -c 100 "$TMP/half.ckpt" >"$TMP/cut.ckpt"
    out=$("$TESSERA" train $COMMON --resume "$TMP/cut.ckpt" 2>&1)
    rc=$?
    if [ $rc -eq 1 ] && contains "$out" "cut.ckpt" && [ "$(echo "$out" | wc -l)" -eq 1 ]; then
        ok "a truncated checkpoint is refused with one line naming it"
    else
        fail "a truncated checkpoint is refused with one line naming it" "rc=$rc" "$out"
    fi
fi

out=$("$TESSERA" train --data "$TMP/nowhere" 2>&1)
rc=$?
if [ $rc -eq 1 ] && contains "$out" "dataset-fashion-mnist"; then
    ok "missing data names the Debian package"
else
    fail "missing data names the Debian package" "rc=$rc" "$out"
fi

out=$("$TESSERA" train --model resnet 2>&1)
rc=$?
if [ $rc -eq 2 ] && contains "$out" "unknown model 'resnet'" && "$TESSERA" train --help | grep -q "usage: tessera train"; then
    ok "misuse exits 2; --help prints the usage"
else
    fail "misuse exits 2; --help prints the usage" "rc=$rc" "$out"
fi
finish
