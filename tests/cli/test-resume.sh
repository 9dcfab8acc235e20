#!/bin/sh
# tests/cli/test-resume.sh: `tessera train` stopped and resumed trains exactly what one straight
# run trains, at every stop point and for every optimizer; what a resume cannot honour is said
# and refused, never silently ignored; numeric options are parsed strictly; a diverging run
# stops with an error and leaves the last checkpoint alone. Needs Fashion-MNIST (skips without
# it): 256 training images in batches of 32 make 8 steps an epoch.
# make check: start 3 (the slowest first: tools/gen-lists.sh)
. "${TS_SRCDIR:-.}/tests/cli/lib.sh"
DATA=/usr/share/datasets/fashion-mnist
BAD_VALUES="--lr=-0.1 --lr=inf --lr=1e400 --lr=nan --lr= --lr=0 --momentum=inf --momentum=1
--weight-decay=inf --weight-decay=-1 --batch-size=99999999999999999999 --batch-size=0
--epochs=99999999999999999999 --epochs=1e3 --epochs=0 --max-steps= --max-steps=-1
--seed=-1 --seed= --seed=18446744073709551616 --seed=+5 --seed=0x10 --train-limit=-1
--lr=1,5 --lr=0x1p-3 --weight-decay=_0 --momentum=0.9_"
NCASES=$(echo "$BAD_VALUES" | wc -w)
OPTIMIZERS="sgd sgd-momentum adam adamw"
STOPS="5 8 11"
BENCH_CASES="train:--lr:inf train:--steps:1e3 ops:--reps:-1 compare:--reps:+3 pool:--pairs:+5
cuda:--steps:0 pool:--pairs:1000000000000 pool:--working-set:4294967296 pool:--step:-1
pool:--pairs: pool:--pairs:0"
# key=value written into the checkpoint's metadata: each refused, naming the file and key.
BAD_META="train.step=-1 train.step=+16 train.step=_16 train.step=16_ train.step=1e1 train.step=
train.step=0x10 train.step=99999999999999999999 train.step=18446744073709551616
train.epoch=-2 train.epoch=99999999999 train.batch=-0 train.batch=4294967296
train.rng_offset=-1 train.seed=+1 train.batch_size=32.0 train.format=tessera-train-2
train.step=0- train.epoch=0,train.batch=9,train.step=9"
NMETA=$(echo "$BAD_META" | wc -w)
# Values of --hidden and --init: parsed as strictly as the other numbers.
BAD_ARCH="--hidden=_32 --hidden=+32 --hidden=32,_16 --hidden=32, --hidden=0x20 --hidden=-32
--init=normal:+0.01 --init=normal:_0.01 --init=normal:0x1p-7 --init=normal:1e400
--init=normal:inf --init=normal:0.01_"
NARCH=$(echo "$BAD_ARCH" | wc -w)
NTESTS=$((4 * 3 + 7 + 4 + NCASES + 11 + 11 + NMETA + NARCH))
plan $NTESTS

if [ ! -f "$DATA/train-images-idx3-ubyte.gz" ]; then
    i=0
    while [ $i -lt $NTESTS ]; do
        skip "resume" "Fashion-MNIST is not installed (Debian package dataset-fashion-mnist)"
        i=$((i + 1))
    done
    finish
fi

COMMON="--device cpu_blas --model mlp --hidden 32 --train-limit 256 --batch-size 32 --epochs 2 --log-steps --json"
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
if [ $rc -eq 2 ] && contains "$out" "trained with --lr 0.05" && contains "$out" "not 0.1;"; then
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
    --resume "$ck" --lr 0.05 --max-steps 17 --save "$TMP/elsewhere.st" 2>&1); rc=$?
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
if [ $rc -eq 0 ] && contains "$out" "has finished its 2 epochs (step 16): the run is complete" &&
    cmp -s "$ck" "$TMP/keep.st"; then
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

# setmeta FILE KEY VALUE...: rewrites the checkpoint's metadata KEY to VALUE (the header
# re-padded and its length updated, so only the edited value is wrong).
setmeta() {
    f=$1; shift
    perl -e '
        my ($f, @kv) = @ARGV;
        open(my $h, "<:raw", $f) or die; local $/; my $b = <$h>; close $h;
        my $n = unpack("Q<", substr($b, 0, 8)); my $j = substr($b, 8, $n); my $d = substr($b, 8 + $n);
        while (@kv) { my ($k, $v) = splice(@kv, 0, 2);
            $j =~ s/"\Q$k\E":"[^"]*"/"$k":"$v"/ or die "no $k"; }
        $j =~ s/ +$//; $j .= " " while (8 + length($j)) % 8;
        open($h, ">:raw", $f) or die; print $h pack("Q<", length($j)), $j, $d; close $h;
    ' "$f" "$@"
}

# A resumed SGD with momentum: the same --momentum is accepted (no --optimizer needed), another
# is refused; the banner shows the checkpoint's optimizer settings.
mck="$TMP/straight-sgd-momentum.st"
out=$("$TESSERA" train $COMMON --epochs 3 --max-steps 17 --resume "$mck" --momentum 0.9 \
    --save "$TMP/m.st" 2>&1); rc=$?
if [ $rc -eq 0 ] && contains "$out" '"step": 17'; then
    ok "the same --momentum is accepted on resume"
else
    fail "the same --momentum is accepted on resume" "rc=$rc" "$(echo "$out" | tail -3)"
fi
out=$("$TESSERA" train $COMMON --epochs 3 --resume "$mck" --momentum 0.5 2>&1); rc=$?
if [ $rc -eq 2 ] && contains "$out" "trained with --momentum 0.9"; then
    ok "--momentum that differs from the checkpoint's is refused"
else
    fail "--momentum that differs from the checkpoint's is refused" "rc=$rc" "$out"
fi
out=$("$TESSERA" train $COMMON --epochs 3 --resume "$ck" --weight-decay 0.01 2>&1); rc=$?
if [ $rc -eq 2 ] && contains "$out" "trained with --weight-decay 0,"; then
    ok "--weight-decay that differs from the checkpoint's is refused"
else
    fail "--weight-decay that differs from the checkpoint's is refused" "rc=$rc" "$out"
fi
out=$("$TESSERA" train --device cpu_blas --model mlp --hidden 32 --train-limit 256 --batch-size 32 \
    --epochs 3 --max-steps 17 --resume "$mck" 2>&1); rc=$?
if [ $rc -eq 0 ] && contains "$out" "sgd lr 0.05 momentum 0.9 weight decay 0,"; then
    ok "the banner prints the checkpoint's lr, momentum and weight decay"
else
    fail "the banner prints the checkpoint's lr, momentum and weight decay" "rc=$rc" "$out"
fi
# A checkpoint stopped by --max-steps, resumed with the same --max-steps: nothing to train.
"$TESSERA" train $COMMON --optimizer sgd --max-steps 5 --save "$TMP/ms5.st" >/dev/null 2>&1
out=$("$TESSERA" train $COMMON --max-steps 5 --resume "$TMP/ms5.st" --save "$TMP/ms5.st" 2>&1)
rc=$?
if [ $rc -eq 0 ] && contains "$out" "is at step 5 and --max-steps 5 is reached"; then
    ok "resuming at --max-steps says the limit is reached"
else
    fail "resuming at --max-steps says the limit is reached" "rc=$rc" "$out"
fi
# A non-zero --momentum against an Adam checkpoint: refused, naming the optimizer.
out=$("$TESSERA" train $COMMON --epochs 3 --resume "$TMP/straight-adam.st" --momentum 0.5 2>&1)
rc=$?
if [ $rc -eq 2 ] && contains "$out" "trained with --optimizer adam, which takes no --momentum"; then
    ok "--momentum on an Adam checkpoint is refused"
else
    fail "--momentum on an Adam checkpoint is refused" "rc=$rc" "$out"
fi
# Nothing to train: no --save file is created either.
out=$("$TESSERA" train $COMMON --resume "$ck" --save "$TMP/none.st" 2>&1); rc=$?
if [ $rc -eq 0 ] && [ ! -e "$TMP/none.st" ] && contains "$out" "nothing to train"; then
    ok "a resume with nothing to train writes no --save file"
else
    fail "a resume with nothing to train writes no --save file" "rc=$rc" "$out"
fi
# A 2-epoch run made of --epochs 1 then --epochs 2 trains 2 epochs (8 + 8 steps), not 3.
"$TESSERA" train $COMMON --optimizer sgd --epochs 1 --save "$TMP/e.st" >"$TMP/e1.out" 2>&1
"$TESSERA" train $COMMON --resume "$TMP/e.st" --save "$TMP/e.st" >"$TMP/e2.out" 2>&1; rc=$?
if [ $rc -eq 0 ] && [ "$(grep -c '"epoch":' "$TMP/e2.out")" = 1 ] &&
    [ "$(losses "$TMP/e2.out" | wc -l)" = 8 ] && cmp -s "$TMP/e.st" "$TMP/keep.st"; then
    ok "--epochs 1 then --epochs 2 resumed trains the second epoch only, as one run does"
else
    fail "--epochs 1 then --epochs 2 resumed trains the second epoch only, as one run does" \
        "rc=$rc" "$(grep '"epoch":' "$TMP/e2.out")"
fi
# A diverging run with --save creates no checkpoint at all.
out=$("$TESSERA" train $COMMON --optimizer sgd --lr 1e6 --weight-decay 1000 \
    --save "$TMP/div.st" 2>&1); rc=$?
if [ $rc -eq 1 ] && [ ! -e "$TMP/div.st" ] && contains "$out" "nothing was saved"; then
    ok "a run that diverges before its first save writes no checkpoint"
else
    fail "a run that diverges before its first save writes no checkpoint" "rc=$rc" "$out"
fi
# A run that saved at the end of epoch 1 and diverges in epoch 2 (3 steps an epoch) keeps the
# epoch-1 checkpoint, byte for byte the one a 1-epoch run saves, and says so.
D="--device cpu_blas --model mlp --hidden 32 --train-limit 96 --batch-size 32 --optimizer sgd
--lr 1e6 --weight-decay 1000"
# shellcheck disable=SC2086
"$TESSERA" train $D --epochs 1 --save "$TMP/d1.st" >/dev/null 2>&1
# shellcheck disable=SC2086
out=$("$TESSERA" train $D --epochs 3 --save "$TMP/d3.st" 2>&1); rc=$?
# (the two runs differ only in their planned length, train.epochs: 1 and 3)
LC_ALL=C sed 's/"train.epochs":"1"/"train.epochs":"3"/' "$TMP/d1.st" >"$TMP/d1-as-3.st"
if [ $rc -eq 1 ] && contains "$out" "diverged" && contains "$out" "d3.st is left as saved at step 3" &&
    cmp -s "$TMP/d1-as-3.st" "$TMP/d3.st"; then
    ok "a run diverging after a save keeps that checkpoint and names its step"
else
    fail "a run diverging after a save keeps that checkpoint and names its step" "rc=$rc" "$out"
fi
# A batch beyond the batches per epoch, with a step that agrees (0 x 8 + 16): refused.
cp "$TMP/keep.st" "$TMP/bad.st"
setmeta "$TMP/bad.st" train.epoch 0 train.batch 16
out=$("$TESSERA" train $COMMON --epochs 3 --resume "$TMP/bad.st" 2>&1); rc=$?
if [ $rc -eq 1 ] && contains "$out" "$TMP/bad.st" && contains "$out" "batch 16" &&
    contains "$out" "8 batches per epoch"; then
    ok "a batch beyond the batches per epoch is refused"
else
    fail "a batch beyond the batches per epoch is refused" "rc=$rc" "$out"
fi
# Each damaged train.* value: exit 1, naming the file and the key; nothing written.
# A value with a character other than a digit must be called not a whole number; key=v,key=v
# edits several keys (a batch one past the batches per epoch, with a step that agrees).
for case in $BAD_META; do
    key=${case%%=*}
    val=$(echo "${case#*=}" | tr _ ' ')
    cp "$TMP/keep.st" "$TMP/bad.st"
    case $case in
    # shellcheck disable=SC2046
    *,*) setmeta "$TMP/bad.st" $(echo "$case" | tr ',=' '  ') ;;
    *) setmeta "$TMP/bad.st" "$key" "$val" ;;
    esac
    cp "$TMP/bad.st" "$TMP/bad-before.st"
    out=$("$TESSERA" train $COMMON --epochs 3 --resume "$TMP/bad.st" --save "$TMP/bad.st" 2>&1)
    rc=$?
    want="'$key'"
    case $key:$val in
    *,*) want="batch 9, with 8 batches per epoch" ;;
    train.format:*) ;;
    *:*[!0-9]* | *:) want="'$key' = '$val' is not a whole number" ;;
    esac
    if [ $rc -eq 1 ] && contains "$out" "$TMP/bad.st" && contains "$out" "$want" &&
        cmp -s "$TMP/bad.st" "$TMP/bad-before.st"; then
        ok "checkpoint $key '$val' is refused naming the file and key"
    else
        fail "checkpoint $key '$val' is refused naming the file and key" "rc=$rc" "$out"
    fi
done
# --hidden and --init: exit 2 naming the option.
for case in $BAD_ARCH; do
    opt=${case%%=*}
    val=$(echo "${case#*=}" | tr _ ' ')
    out=$(timeout "$(hang_limit 60)" "$TESSERA" train --model mlp --train-limit 64 --max-steps 1 "$opt" "$val" 2>&1)
    rc=$?
    if [ $rc -eq 2 ] && contains "$out" "$opt"; then
        ok "$opt '$val' is refused with exit 2"
    else
        fail "$opt '$val' is refused with exit 2" "rc=$rc" "$(echo "$out" | tail -2)"
    fi
done

# Strict numbers: each bad value exits 2 naming the option.
for case in $BAD_VALUES; do
    opt=${case%%=*}
    val=$(echo "${case#*=}" | tr _ ' ')
    out=$(timeout "$(hang_limit 60)" "$TESSERA" train --model mlp --train-limit 64 "$opt" "$val" 2>&1); rc=$?
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
    out=$(timeout "$(hang_limit 60)" "$TESSERA" bench "$cmd" "$opt" "$val" 2>&1); rc=$?
    case $cmd:$opt:$val in pool:--pairs:1000000000000) contains "$out" "1..10000000" || rc=99 ;; esac
    if [ $rc -eq 2 ] && contains "$out" "$opt"; then
        ok "bench $cmd $opt '$val' is refused with exit 2"
    else
        fail "bench $cmd $opt '$val' is refused with exit 2" "rc=$rc" "$(echo "$out" | tail -2)"
    fi
done
finish
