#!/bin/sh
# tests/cli/test-resume.sh: `tessera train` stopped and resumed trains exactly what one straight
# run trains, at every stop point and for every optimizer; what a resume cannot honour is said
# and refused, never silently ignored; numeric options are parsed strictly; a diverging run
# stops with an error and leaves the last checkpoint alone. Needs Fashion-MNIST (skips without
# it): 256 training images in batches of 32 make 8 steps an epoch.
. "${TS_SRCDIR:-.}/tests/cli/lib.sh"
DATA=/usr/share/datasets/fashion-mnist
BAD_VALUES="--lr=-0.1 --lr=inf --lr=1e400 --lr=nan --lr= --lr=0 --momentum=inf --momentum=1
--weight-decay=inf --weight-decay=-1 --batch-size=99999999999999999999 --batch-size=0
--epochs=99999999999999999999 --epochs=1e3 --epochs=0 --max-steps= --max-steps=-1
--seed=-1 --seed= --seed=18446744073709551616 --seed=+5 --seed=0x10 --train-limit=-1
--lr=1,5"
NCASES=$(echo "$BAD_VALUES" | wc -w)
OPTIMIZERS="sgd sgd-momentum adam adamw"
STOPS="5 8 11"
BENCH_CASES="train:--lr:inf train:--steps:1e3 ops:--reps:-1 compare:--reps:+3 pool:--pairs:+5
cuda:--steps:0"
plan $((4 * 3 + 7 + 4 + NCASES + 6))

if [ ! -f "$DATA/train-images-idx3-ubyte.gz" ]; then
    i=0
    while [ $i -lt $((4 * 3 + 7 + 4 + NCASES + 6)) ]; do
        skip "resume" "Fashion-MNIST is not installed (Debian package dataset-fashion-mnist)"
        i=$((i + 1))
    done
    finish
fi

COMMON="--model mlp --hidden 32 --train-limit 256 --batch-size 32 --epochs 2 --log-steps --json"
opt_flags() {
    case $1 in
    sgd) echo "--optimizer sgd" ;;
    sgd-momentum) echo "--optimizer sgd --momentum 0.9" ;;
    *) echo "--optimizer $1" ;;
    esac
}
# The step losses of a --log-steps --json run, one "step loss" line each.
losses() { sed -n 's/^{"step": \([0-9]*\), "loss": \([^}]*\)}$/\1 \2/p' "$1"; }

for o in $OPTIMIZERS; do
    # shellcheck disable=SC2046
    "$TESSERA" train $COMMON $(opt_flags "$o") --save "$TMP/straight-$o.st" \
        >"$TMP/straight-$o.out" 2>&1
    for k in $STOPS; do
        name="$o: stopped at step $k of 16 and resumed == straight, every loss and the checkpoint"
        ck="$TMP/split-$o-$k.st"
        # shellcheck disable=SC2046
        "$TESSERA" train $COMMON $(opt_flags "$o") --max-steps "$k" --save "$ck" >"$TMP/a.out" 2>&1
        rc1=$?
        # The resume takes the optimizer and its settings from the checkpoint.
        "$TESSERA" train $COMMON --resume "$ck" --save "$ck" >"$TMP/b.out" 2>"$TMP/b.err"
        rc2=$?
        { losses "$TMP/a.out"; losses "$TMP/b.out"; } >"$TMP/split.losses"
        losses "$TMP/straight-$o.out" >"$TMP/straight.losses"
        if [ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && [ "$(wc -l <"$TMP/straight.losses")" -eq 16 ] &&
            cmp -s "$TMP/split.losses" "$TMP/straight.losses" &&
            cmp -s "$ck" "$TMP/straight-$o.st" &&
            grep -q "resumed from .* at epoch $((k / 8 + 1)), step $k" "$TMP/b.err"; then
            ok "$name"
        else
            fail "$name" "rc $rc1/$rc2" "$(diff "$TMP/split.losses" "$TMP/straight.losses" | head -6)" \
                "$(cat "$TMP/b.err" | head -3)"
        fi
    done
done

ck="$TMP/straight-sgd.st"
cp "$ck" "$TMP/keep.st"
# A resumed hyper-parameter that differs from the checkpoint's is refused, naming both.
out=$("$TESSERA" train $COMMON --epochs 3 --resume "$ck" --lr 0.1 2>&1); rc=$?
if [ $rc -eq 2 ] && contains "$out" "trained with --lr 0.05" && contains "$out" "not 0.10000"; then
    ok "--lr that differs from the checkpoint's is refused"
else
    fail "--lr that differs from the checkpoint's is refused" "rc=$rc" "$out"
fi
out=$("$TESSERA" train $COMMON --epochs 3 --resume "$ck" --optimizer adam 2>&1); rc=$?
if [ $rc -eq 2 ] && contains "$out" "trained with --optimizer sgd"; then
    ok "--optimizer that differs from the checkpoint's is refused"
else
    fail "--optimizer that differs from the checkpoint's is refused" "rc=$rc" "$out"
fi
# The same value is fine; the banner prints what is used.
out=$("$TESSERA" train --model mlp --hidden 32 --train-limit 256 --batch-size 32 --epochs 3 \
    --resume "$ck" --lr 0.05 --max-steps 17 2>&1); rc=$?
if [ $rc -eq 0 ] && contains "$out" "sgd lr 0.05" && contains "$out" "resumed from"; then
    ok "the same --lr is accepted and the banner shows the checkpoint's optimizer"
else
    fail "the same --lr is accepted and the banner shows the checkpoint's optimizer" "rc=$rc" "$out"
fi
# --max-steps below the checkpoint's step: refused, no step taken, checkpoint untouched.
out=$("$TESSERA" train $COMMON --resume "$ck" --max-steps 10 --save "$ck" 2>&1); rc=$?
if [ $rc -eq 1 ] && contains "$out" "at step 16, past --max-steps 10" && cmp -s "$ck" "$TMP/keep.st" &&
    ! contains "$out" '"step"'; then
    ok "--max-steps below the checkpoint's step is refused and saves nothing"
else
    fail "--max-steps below the checkpoint's step is refused and saves nothing" "rc=$rc" "$out"
fi
# A finished run resumed: says so, exits 0, saves nothing.
out=$("$TESSERA" train $COMMON --resume "$ck" --save "$ck" 2>&1); rc=$?
if [ $rc -eq 0 ] && contains "$out" "the run is complete" && cmp -s "$ck" "$TMP/keep.st"; then
    ok "resuming a finished run says so and saves nothing"
else
    fail "resuming a finished run says so and saves nothing" "rc=$rc" "$out"
fi
out=$("$TESSERA" train $COMMON --epochs 1 --resume "$ck" --save "$ck" 2>&1); rc=$?
if [ $rc -eq 1 ] && contains "$out" "finished 2 epochs, more than --epochs 1" && cmp -s "$ck" "$TMP/keep.st"; then
    ok "a checkpoint past --epochs is refused"
else
    fail "a checkpoint past --epochs is refused" "rc=$rc" "$out"
fi
# A diverging run stops with an error; the checkpoint at --save is left as it was.
out=$("$TESSERA" train $COMMON --optimizer sgd --lr 1e6 --weight-decay 1000 --save "$ck" 2>&1); rc=$?
if [ $rc -eq 1 ] && contains "$out" "the loss became" && contains "$out" "diverged" &&
    cmp -s "$ck" "$TMP/keep.st"; then
    ok "a non-finite loss stops training with an error and keeps the last checkpoint"
else
    fail "a non-finite loss stops training with an error and keeps the last checkpoint" "rc=$rc" \
        "$(echo "$out" | tail -3)"
fi

# Checkpoint metadata edited in place (same length, so the header stays valid). A checkpoint
# that an older tessera wrote at an epoch's end records (epoch e, batch = batches per epoch):
# resuming it must still start the next epoch, not replay this one.
edit() { perl -0777 -pi -e "s/$2/$3/" "$1"; }
"$TESSERA" train $COMMON --optimizer sgd --max-steps 8 --save "$TMP/legacy.st" >/dev/null 2>&1
edit "$TMP/legacy.st" '"train.epoch":"1","train.batch":"0"' '"train.epoch":"0","train.batch":"8"'
edited=$(grep -c '"train.epoch":"0","train.batch":"8"' "$TMP/legacy.st")
"$TESSERA" train $COMMON --resume "$TMP/legacy.st" --save "$TMP/legacy.st" >"$TMP/l.out" 2>&1
if [ "$edited" = 1 ] && cmp -s "$TMP/legacy.st" "$TMP/keep.st"; then
    ok "a checkpoint saved at (epoch, batches per epoch) resumes at the next epoch"
else
    fail "a checkpoint saved at (epoch, batches per epoch) resumes at the next epoch" \
        "edited: $edited" "$(losses "$TMP/l.out" | head -3)"
fi
# tampered NAME FROM TO NEEDLE: keep.st with FROM replaced by TO is refused, saying NEEDLE.
tampered() {
    cp "$TMP/keep.st" "$TMP/bad.st"
    edit "$TMP/bad.st" "$2" "$3"
    out=$("$TESSERA" train $COMMON --epochs 3 --resume "$TMP/bad.st" 2>&1); rc=$?
    if [ $rc -eq 1 ] && contains "$out" "$4"; then ok "$1"; else fail "$1" "rc=$rc" "$out"; fi
}
tampered "a step that disagrees with the epoch and batch is refused" \
    '"train.step":"16"' '"train.step":"15"' "inconsistent position: step 15 at epoch 2, batch 0"
tampered "a negative step in the checkpoint is refused" \
    '"train.step":"16"' '"train.step":"-1"' "'train.step' = '-1' is not a whole number"
tampered "a batch that is not a number is refused" \
    '"train.batch":"0"' '"train.batch":"x"' "'train.batch' = 'x' is not a whole number"

# Strict numbers: each bad value exits 2 naming the option.
for case in $BAD_VALUES; do
    opt=${case%%=*}
    val=${case#*=}
    out=$(timeout 60 "$TESSERA" train --model mlp --train-limit 64 "$opt" "$val" 2>&1); rc=$?
    if [ $rc -eq 2 ] && contains "$out" "$opt"; then
        ok "$opt '$val' is refused with exit 2"
    else
        fail "$opt '$val' is refused with exit 2" "rc=$rc" "$(echo "$out" | tail -2)"
    fi
done
# The bench commands parse their numbers with the same rule.
for case in $BENCH_CASES; do
    cmd=${case%%:*}
    rest=${case#*:}
    opt=${rest%%:*}
    val=${rest#*:}
    out=$(timeout 60 "$TESSERA" bench "$cmd" "$opt" "$val" 2>&1); rc=$?
    if [ $rc -eq 2 ] && contains "$out" "$opt"; then
        ok "bench $cmd $opt '$val' is refused with exit 2"
    else
        fail "bench $cmd $opt '$val' is refused with exit 2" "rc=$rc" "$(echo "$out" | tail -2)"
    fi
done
finish
