#!/bin/sh
# tests/cli/test-schedule.sh: `tessera train` follows the learning-rate schedule it is given
# (cosine and step, after a linear warm-up), step by step as the formula says; a run with a
# schedule, gradient clipping and weight decay on matrices only, stopped and resumed, trains
# exactly what one straight run trains; a resume that would change the schedule, the clipping
# or the decay is refused; bad values exit 2. Needs Fashion-MNIST (skips without it): 256
# training images in batches of 32 make 8 steps an epoch.
. "${TS_SRCDIR:-.}/tests/cli/lib.sh"
DATA=/usr/share/datasets/fashion-mnist
BAD="--lr-schedule=nope --lr-gamma=0 --lr-gamma=1.5 --decay=some --clip-grad-norm=-1
--warmup-steps=-1 --lr-decay-steps=0 --min-lr=nan"
NBAD=$(echo "$BAD" | wc -w)
NTESTS=$((6 + NBAD))
plan $NTESTS
if [ ! -f "$DATA/train-images-idx3-ubyte.gz" ]; then
    i=0
    while [ $i -lt $NTESTS ]; do
        skip "schedule" "Fashion-MNIST is not installed (Debian package dataset-fashion-mnist)"
        i=$((i + 1))
    done
    finish
    exit 0
fi
COMMON="--model mlp --hidden 32 --train-limit 256 --batch-size 32 --data $DATA --seed 3"

# lr of every step, one per line, from --log-steps --json
lrs() { sed -n 's/^{"step": .*"lr": \([^}]*\)}$/\1/p'; }
losses() { sed -n 's/.*"loss": \([^,]*\),.*/\1/p'; }

# 1. cosine after a warm-up of 3, 16 steps, from 0.01 down to 0.001: lr(k) for k = 0..15.
out=$("$TESSERA" train $COMMON --epochs 2 --lr 0.01 --lr-schedule cosine --warmup-steps 3 \
    --min-lr 0.001 --log-steps --json 2>&1)
bad=$(echo "$out" | lrs | awk 'BEGIN { pi = atan2(0, -1) }
    { k = NR - 1; base = 0.01; lo = 0.001; w = 3; T = 16
      want = k < w ? base * (k + 1) / w : lo + 0.5 * (base - lo) * (1 + cos(pi * (k - w) / (T - w)))
      d = $1 - want; if (d < 0) d = -d
      if (d > 1e-12 + 1e-7 * want) printf "step %d: %s, want %.9g\n", k + 1, $1, want }
    END { if (NR != 16) printf "%d steps, want 16\n", NR }')
if [ -z "$bad" ]; then
    ok "cosine with warm-up: the 16 steps' learning rates follow the formula"
else
    fail "cosine with warm-up: the learning rates follow the formula" "$bad" "$out"
fi

# 2. step: halved every 4 steps.
out=$("$TESSERA" train $COMMON --epochs 2 --lr 0.01 --lr-schedule step --lr-step-size 4 \
    --lr-gamma 0.5 --log-steps --json 2>&1)
got=$(echo "$out" | lrs | tr '\n' ' ')
if [ "$got" = "0.01 0.01 0.01 0.01 0.005 0.005 0.005 0.005 0.0025 0.0025 0.0025 0.0025 0.00125 0.00125 0.00125 0.00125 " ]; then
    ok "step schedule: halved every 4 steps"
else
    fail "step schedule: halved every 4 steps" "$got" "$out"
fi

# 3. Stopped at step 6 and resumed = straight, bit for bit, with everything on at once.
ALL="--optimizer adamw --weight-decay 0.1 --decay matrices --lr 0.01 --lr-schedule cosine \
--warmup-steps 2 --lr-decay-steps 16 --clip-grad-norm 0.5"
straight=$("$TESSERA" train $COMMON --epochs 2 $ALL --log-steps --json 2>&1 | losses)
first=$("$TESSERA" train $COMMON --epochs 2 $ALL --max-steps 6 --save "$TMP/ck.st" \
    --log-steps --json 2>&1 | losses)
rest=$("$TESSERA" train $COMMON --epochs 2 --resume "$TMP/ck.st" --log-steps --json 2>&1 | losses)
split=$(printf '%s\n%s\n' "$first" "$rest")
if [ "$(echo "$straight" | wc -l)" -eq 16 ] && [ "$straight" = "$split" ]; then
    ok "schedule, clipping and matrices-only decay: 6 + 10 resumed steps = 16 straight, exactly"
else
    fail "stopped and resumed = straight" "straight: $(echo $straight)" "split: $(echo $split)"
fi

# 4. A resume that would change what the checkpoint says is refused.
out=$("$TESSERA" train $COMMON --epochs 2 --resume "$TMP/ck.st" --clip-grad-norm 2 2>&1)
rc=$?
if [ $rc -eq 2 ] && contains "$out" "trained with --clip-grad-norm 0.5, not 2"; then
    ok "resume with another --clip-grad-norm is refused"
else
    fail "resume with another --clip-grad-norm is refused" "rc=$rc" "$out"
fi
out=$("$TESSERA" train $COMMON --epochs 2 --resume "$TMP/ck.st" --lr-schedule step 2>&1)
rc=$?
if [ $rc -eq 2 ] && contains "$out" "learning-rate schedule 'cosine, warm-up 2 down to 0.001 at step 16'"; then
    ok "resume with another schedule is refused, naming the checkpoint's"
else
    fail "resume with another schedule is refused" "rc=$rc" "$out"
fi
out=$("$TESSERA" train $COMMON --epochs 2 --resume "$TMP/ck.st" --decay all 2>&1)
rc=$?
if [ $rc -eq 2 ] && contains "$out" "trained with --decay matrices, not all"; then
    ok "resume with another --decay is refused"
else
    fail "resume with another --decay is refused" "rc=$rc" "$out"
fi

# 5. Bad values: exit 2 with the option named.
for b in $BAD; do
    opt=${b%%=*}
    val=${b#*=}
    out=$("$TESSERA" train $COMMON "$opt" "$val" --max-steps 1 2>&1)
    rc=$?
    if [ $rc -eq 2 ] && contains "$out" "$opt"; then
        ok "train $opt '$val' exits 2 naming the option"
    else
        fail "train $opt '$val' exits 2 naming the option" "rc=$rc" "$out"
    fi
done
finish
