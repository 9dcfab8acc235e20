#!/bin/sh
# tests/cli/test-resume-run.sh: resuming restores the whole run. A run stopped by --max-steps
# or by SIGINT and resumed with only --resume CKPT (plus where the data is) finishes
# byte-identical to the straight run, for an MNIST model and the GPT: model, optimizer,
# schedule, seed, batch size, training slice and run length come from the checkpoint, and the
# run saves where it was resumed from. The SIGINT message prints the command that continues.
# The same with gradient accumulation and (the GPT) activation checkpointing with dropout,
# which the checkpoint carries; given otherwise on --resume, they are accepted overrides.
. "${TS_SRCDIR:-.}/tests/cli/lib.sh"
plan 7
DATA=/usr/share/datasets/fashion-mnist
cd "$TMP" || exit 1

# sigint_then_resume LABEL STRAIGHT CUT EXTRA ARGS...: trains ARGS straight into STRAIGHT.ckpt,
# then again into CUT.ckpt stopped by SIGINT after its first step; the message must print
# `tessera train --resume CUT.ckpt EXTRA`, and running that must end byte-identical.
sigint_then_resume() {
    label=$1 straight=$2 cut=$3 extra=$4
    shift 4
    "$TESSERA" train "$@" --save "$straight.ckpt" >"$straight.out" 2>&1
    "$TESSERA" train "$@" --save "$cut.ckpt" --log-steps >"$cut.out" 2>"$cut.err" &
    pid=$!
    end=$(($(date +%s) + $(hang_limit 60)))
    while ! grep -q '^step ' "$cut.out" 2>/dev/null && kill -0 $pid 2>/dev/null &&
        [ "$(date +%s)" -lt "$end" ]; do
        sleep 0.05
    done
    kill -INT $pid 2>/dev/null
    wait $pid
    rc=$?
    cmd=$(grep -A1 'continue with:' "$cut.err" | tail -1)
    if [ $rc -eq 130 ] && [ "$cmd" = "  tessera train --resume $cut.ckpt${extra:+ $extra}" ]; then
        out=$(eval "\"\$TESSERA\" ${cmd#  tessera }" 2>&1)
        if cmp -s "$straight.ckpt" "$cut.ckpt"; then
            ok "$label: SIGINT prints '${cmd#  }'; running it ends byte-identical to the straight run"
        else
            fail "$label: SIGINT then the printed command" "$out" "$(cmp "$straight.ckpt" "$cut.ckpt" 2>&1)"
        fi
    elif [ $rc -eq 0 ]; then
        skip "$label: SIGINT then the printed command" "the run ended before the signal came"
    else
        fail "$label: SIGINT then the printed command" "rc=$rc" "$(cat "$cut.err")"
    fi
}

# The GPT, split by --max-steps: needs no data set.
printf 'the quick brown fox jumps over the lazy dog. %.0s' $(seq 100) >t.txt
G="--model gpt --text t.txt --context 16 --layers 1 --heads 2 --embd 16 --batch-size 3 --steps 20
  --warmup-steps 4 --lr 0.003 --eval-every 5 --eval-batches 1 --seed 3"
# shellcheck disable=SC2086
"$TESSERA" train $G --save ga.ckpt >ga.out 2>&1
# shellcheck disable=SC2086
"$TESSERA" train $G --max-steps 7 --save gb.ckpt >gb.out 2>&1
out=$("$TESSERA" train --resume gb.ckpt --text t.txt 2>&1)
if cmp -s ga.ckpt gb.ckpt && contains "$out" "resumed from gb.ckpt at step 7"; then
    ok "gpt: 7 steps, then train --resume CKPT --text alone: the straight run's checkpoint, byte for byte"
else
    fail "gpt: --max-steps then --resume alone" "$out" "$(cmp ga.ckpt gb.ckpt 2>&1)"
fi

# Accumulation over uneven micro-batches (4 rows: 2, 1, 1) and checkpointed blocks that draw
# dropout masks: the stopped run resumes with neither flag and ends byte-identical.
G2="--model gpt --text t.txt --context 16 --layers 2 --heads 2 --embd 16 --batch-size 4
  --steps 12 --warmup-steps 2 --lr 0.003 --eval-every 6 --eval-batches 1 --seed 4 --dropout 0.1
  --accumulate 3 --checkpoint-activations on"
# shellcheck disable=SC2086
"$TESSERA" train $G2 --save gc.ckpt >gc.out 2>&1
# shellcheck disable=SC2086
"$TESSERA" train $G2 --max-steps 5 --save gd.ckpt >gd.out 2>&1
out=$("$TESSERA" train --resume gd.ckpt --text t.txt 2>&1)
if cmp -s gc.ckpt gd.ckpt && contains "$out" "each batch in 3 micro-batches" &&
    contains "$out" "activation checkpointing: each block recomputed"; then
    ok "gpt --accumulate 3 --checkpoint-activations on --dropout 0.1: 5 steps, then --resume alone: byte for byte"
else
    fail "gpt: accumulation and checkpointing through --resume" "$out" "$(cmp gc.ckpt gd.ckpt 2>&1)"
fi
# Given otherwise on --resume: an override, shown in the start record.
# shellcheck disable=SC2086
"$TESSERA" train $G2 --max-steps 5 --save gf.ckpt >gf.out 2>&1
out=$("$TESSERA" train --resume gf.ckpt --text t.txt --accumulate 1 --checkpoint-activations off \
    --max-steps 6 --save ge.ckpt --json 2>&1)
if [ $? -eq 0 ] && contains "$out" '"accumulate":1' && contains "$out" '"checkpoint_activations":false'; then
    ok "gpt: --accumulate and --checkpoint-activations given on --resume override the checkpoint's"
else
    fail "gpt: overrides on --resume" "$out"
fi

# SIGINT in a GPT run with accumulation and checkpointing: the printed command finishes it
# byte-identical to the straight run.
G3="--model gpt --text t.txt --context 16 --layers 2 --heads 2 --embd 16 --batch-size 4
  --steps 300 --warmup-steps 2 --lr 0.003 --eval-every 100 --eval-batches 1 --seed 6 --dropout 0.1
  --accumulate 2 --checkpoint-activations on"
# shellcheck disable=SC2086
sigint_then_resume "gpt --accumulate 2 --checkpoint-activations on" gs gi "--text t.txt" $G3

if [ ! -d "$DATA" ]; then
    skip "mlp: --max-steps then --resume alone" "Fashion-MNIST is not installed (Debian package dataset-fashion-mnist)"
    skip "mlp --accumulate: --max-steps then --resume alone" "Fashion-MNIST is not installed"
    skip "mlp: SIGINT then the printed command" "Fashion-MNIST is not installed"
    finish
fi
M="--model mlp --hidden 32 --train-limit 640 --epochs 3 --batch-size 32 --seed 5 --lr 0.01
  --optimizer sgd --momentum 0.9"
# shellcheck disable=SC2086
"$TESSERA" train $M --save a.ckpt >a.out 2>&1
# shellcheck disable=SC2086
"$TESSERA" train $M --max-steps 13 --save b.ckpt >b.out 2>&1
out=$("$TESSERA" train --resume b.ckpt 2>&1)
if cmp -s a.ckpt b.ckpt && contains "$out" "resumed from b.ckpt at epoch 1, step 13"; then
    ok "mlp: 13 steps, then train --resume CKPT alone: the straight run's checkpoint, byte for byte"
else
    fail "mlp: --max-steps then --resume alone" "$out" "$(cmp a.ckpt b.ckpt 2>&1)"
fi

# shellcheck disable=SC2086
"$TESSERA" train $M --accumulate 4 --save c.ckpt >c.out 2>&1
# shellcheck disable=SC2086
"$TESSERA" train $M --accumulate 4 --max-steps 13 --save d.ckpt >d.out 2>&1
out=$("$TESSERA" train --resume d.ckpt 2>&1)
if cmp -s c.ckpt d.ckpt && ! cmp -s a.ckpt c.ckpt && contains "$out" "each batch in 4 micro-batches"; then
    ok "mlp --accumulate 4: 13 steps, then train --resume CKPT alone: byte for byte"
else
    fail "mlp --accumulate: --max-steps then --resume alone" "$out" "$(cmp c.ckpt d.ckpt 2>&1)"
fi

# SIGINT after the first steps: the message names the command that continues; running it
# finishes the run as the straight one did.
L="--model mlp --hidden 32 --train-limit 640 --epochs 30 --batch-size 32 --seed 5 --lr 0.01"
# shellcheck disable=SC2086
sigint_then_resume mlp straight cut "" $L
finish
