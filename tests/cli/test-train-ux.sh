#!/bin/sh
# tests/cli/test-train-ux.sh: `tessera train` never loses work and says what it does. SIGTERM
# mid-run finishes the step, saves, exits 143, and the checkpoint resumes to exactly the
# straight run's losses; --save-every leaves a checkpoint of a recent step even after a
# SIGKILL; a --save path that cannot be written is refused before any training; progress goes
# to stderr (plain lines with --log-every when it is not a terminal) and never into the JSON
# on stdout; a text run ends with a summary.
# make check: start 6 (the slowest first: tools/gen-lists.sh)
. "${TS_SRCDIR:-.}/tests/cli/lib.sh"
plan 9
DATA=/usr/share/datasets/fashion-mnist
if [ ! -f "$DATA/train-images-idx3-ubyte.gz" ]; then
    for t in sigterm save-every save-path progress summary resume-infers hostile-arch eval; do
        skip "$t" "Fashion-MNIST is not installed (Debian package dataset-fashion-mnist)"
    done
    finish
fi
C="--model lenet5 --train-limit 4096 --batch-size 32 --device cpu_blas"
losses() { grep '"step": [0-9]*, "loss"' "$1" | sed 's/.*"loss": \([^,]*\),.*/\1/'; }
# Waits (up to 60 s, scaled on a busy machine: hang_limit) until FILE has a progress line of
# batch >= N; 0 when it has.
wait_batch() {
    i=0
    tries=$((10 * $(hang_limit 60)))
    while [ $i -lt $tries ]; do
        b=$(sed -n 's/^epoch [0-9]*\/[0-9]* batch \([0-9]*\)\/.*/\1/p' "$1" 2>/dev/null | tail -1)
        [ -n "$b" ] && [ "$b" -ge "$2" ] && return 0
        sleep 0.1
        i=$((i + 1))
    done
    return 1
}

# SIGTERM: the step finishes, the checkpoint is written, exit 143; resumed, the losses are the
# straight run's, bit for bit.
"$TESSERA" train $C --epochs 100 --save "$TMP/t.ckpt" --log-steps --json --log-every 1 \
    >"$TMP/t1.json" 2>"$TMP/t1.err" &
pid=$!
wait_batch "$TMP/t1.err" 5 && kill -TERM $pid
wait $pid
rc=$?
m=$(losses "$TMP/t1.json" | wc -l)
"$TESSERA" train $C --epochs 100 --max-steps 600 --resume "$TMP/t.ckpt" --log-steps --json \
    >"$TMP/t2.json" 2>"$TMP/t2.err"
rc2=$?
"$TESSERA" train $C --epochs 100 --max-steps 600 --log-steps --json >"$TMP/s.json" 2>&1
cat "$TMP/t1.json" "$TMP/t2.json" >"$TMP/t12.json"
if [ $rc -eq 143 ] && [ $rc2 -eq 0 ] && [ "$m" -ge 5 ] && [ "$m" -lt 600 ] &&
    grep -q "SIGTERM: stopped after step $m .*saved $TMP/t.ckpt" "$TMP/t1.err" &&
    grep -q "resumed from $TMP/t.ckpt at epoch [0-9]*, step $m" "$TMP/t2.err" &&
    [ "$(losses "$TMP/t12.json" | wc -l)" -eq 600 ] &&
    [ "$(losses "$TMP/t12.json")" = "$(losses "$TMP/s.json")" ]; then
    ok "SIGTERM after step $m: exit 143, saved; resumed to step 600 with the straight run's losses, bit for bit"
else
    fail "SIGTERM: stop, save, resume to the straight run's losses" "rc=$rc rc2=$rc2 m=$m" \
        "$(tail -3 "$TMP/t1.err")" "$(tail -3 "$TMP/t2.err")"
fi

# --save-every 3, then SIGKILL (nothing can be saved then): the checkpoint on disk is of a
# step that is a positive multiple of 3, and it resumes.
"$TESSERA" train $C --epochs 100 --save "$TMP/k.ckpt" --save-every 3 --log-every 1 \
    >/dev/null 2>"$TMP/k.err" &
pid=$!
wait_batch "$TMP/k.err" 10 && kill -KILL $pid
wait $pid
rc=$?
# the step it holds (however far the run got before the kill), then one more step from it
at=$("$TESSERA" inspect --json "$TMP/k.ckpt" 2>/dev/null | sed -n 's/.*"train.step":"\([0-9]*\)".*/\1/p')
out=$("$TESSERA" train $C --epochs 100 --max-steps $((${at:-0} + 1)) --resume "$TMP/k.ckpt" 2>&1 >/dev/null)
rc2=$?
st=$(echo "$out" | sed -n 's/.*resumed from .* at epoch [0-9]*, step \([0-9]*\).*/\1/p')
if [ $rc -eq 137 ] && [ $rc2 -eq 0 ] && [ -n "$st" ] && [ "$st" -ge 3 ] && [ $((st % 3)) -eq 0 ]; then
    ok "--save-every 3: after SIGKILL the checkpoint is of step $st and resumes"
else
    fail "--save-every 3 survives SIGKILL" "rc=$rc rc2=$rc2 step=$st" "$out"
fi

# A --save path that cannot be written: refused at once, before the data is even loaded.
mkdir "$TMP/adir"
out1=$("$TESSERA" train $C --save "$TMP/missing/x.ckpt" 2>&1)
rc1=$?
out2=$("$TESSERA" train $C --save "$TMP/adir" 2>&1)
rc2=$?
if [ $rc1 -eq 1 ] && [ $rc2 -eq 1 ] && contains "$out1" "$TMP/missing/x.ckpt: cannot save the checkpoint there" &&
    contains "$out2" "the path is a directory" && ! contains "$out1$out2" "epoch" &&
    [ -z "$(ls "$TMP/adir")" ]; then
    ok "a --save path in a missing directory or naming a directory is refused before training"
else
    fail "a bad --save path is refused before training" "rc=$rc1/$rc2" "$out1" "$out2"
fi

# Progress: plain lines on stderr with --log-every (not a terminal here), stdout all JSON.
"$TESSERA" train $C --max-steps 20 --log-every 10 --json >"$TMP/p.json" 2>"$TMP/p.err"
rc=$?
nl=$(grep -c '^epoch 1/1 batch [0-9]*/128: loss [0-9.]*, [0-9]* images/s, .* elapsed, ETA ' "$TMP/p.err")
if [ $rc -eq 0 ] && [ "$nl" -eq 2 ] && ! grep -qv '^{' "$TMP/p.json"; then
    ok "--log-every 10: 2 progress lines with throughput, elapsed and ETA on stderr; stdout only JSON"
else
    fail "--log-every progress on stderr" "rc=$rc lines=$nl" "$(cat "$TMP/p.err")" "$(cat "$TMP/p.json")"
fi

# The summary of a text run: steps, time, last and best accuracy, the checkpoint.
out=$("$TESSERA" train $C --epochs 2 --save "$TMP/sum.ckpt" 2>/dev/null)
if echo "$out" | tail -1 | grep -q "^done: 256 steps in .*; test accuracy 0\.[0-9]* (best 0\.[0-9]*, epoch [12]); checkpoint $TMP/sum.ckpt$"; then
    ok "a run ends with a summary: $(echo "$out" | tail -1)"
else
    fail "a run ends with a summary" "$out"
fi
# --resume alone: the model and its architecture come from the checkpoint (train.arch).
"$TESSERA" train --model mlp --hidden 48 --train-limit 512 --max-steps 4 --save "$TMP/a.ckpt" >/dev/null 2>&1
out=$("$TESSERA" train --train-limit 512 --max-steps 8 --resume "$TMP/a.ckpt" 2>&1)
rc=$?
if [ $rc -eq 0 ] && contains "$out" "the model from $TMP/a.ckpt: mlp --hidden 48" &&
    contains "$out" "resumed from $TMP/a.ckpt at epoch 1, step 4"; then
    ok "--resume without --model takes the checkpoint's model: mlp --hidden 48"
else
    fail "--resume without --model takes the checkpoint's model" "rc=$rc" "$out"
fi
# A checkpoint of the format before the model.* keys (train.arch = "mlp --hidden 4", written
# by the previous release) resumes with its model.
LEGACY="$TS_SRCDIR/tests/data/legacy/mlp-hidden4.safetensors"
cp "$LEGACY" "$TMP/legacy.ckpt"
out=$("$TESSERA" train --train-limit 256 --batch-size 64 --max-steps 4 --resume "$TMP/legacy.ckpt" 2>&1)
rc=$?
if [ $rc -eq 0 ] && contains "$out" "the model from $TMP/legacy.ckpt: mlp --hidden 4" &&
    contains "$out" "resumed from $TMP/legacy.ckpt at epoch 1, step 2"; then
    ok "a checkpoint of the previous format resumes with its model (mlp --hidden 4)"
else
    fail "a checkpoint of the previous format resumes" "rc=$rc" "$out"
fi
# A checkpoint's model configuration is plain keys (model.name, model.hidden, ...), each value
# checked on load: an edited one stops the run naming the file, the key and the value, and
# nothing is trained; no text from the file becomes options.
LC_ALL=C sed 's|"model.hidden":"48"|"model.hidden":"-4"|' "$TMP/a.ckpt" >"$TMP/evil.ckpt"
out=$(cd "$TMP" && "$TESSERA" train --train-limit 512 --max-steps 8 --resume "$TMP/evil.ckpt" 2>&1)
rc=$?
if grep -q -a '"model.hidden":"-4"' "$TMP/evil.ckpt" && [ $rc -eq 1 ] &&
    ! contains "$out" "the model from" &&
    contains "$out" "evil.ckpt: model configuration: metadata 'model.hidden' = '-4'"; then
    ok "a checkpoint with an edited model key is refused, naming the file, the key and the value"
else
    fail "an edited model key is refused" "rc=$rc" "$out"
fi
# tessera eval: the checkpoint's test accuracy, exactly what training reported after its last
# epoch (same weights, same 10,000 images); the seed, batch and slice come from the file.
"$TESSERA" train --model mlp --hidden 32 --train-limit 640 --epochs 1 --seed 5 --json --save "$TMP/e.ckpt" >"$TMP/e.json" 2>/dev/null
want=$(grep '"epoch"' "$TMP/e.json" | tail -1 | "$JSON_CHECK" test_acc | sed 's/.*=//')
got=$("$TESSERA" eval --resume "$TMP/e.ckpt" --json 2>/dev/null | "$JSON_CHECK" test_acc | sed 's/.*=//')
out=$("$TESSERA" eval 2>&1)
rc=$?
if [ -n "$want" ] && [ "$want" = "$got" ] && [ $rc -eq 2 ] && contains "$out" "which checkpoint?"; then
    ok "tessera eval reports the trained checkpoint's test accuracy ($got, as training did); no --resume is a usage error"
else
    fail "tessera eval" "want=$want got=$got rc=$rc" "$out"
fi
finish
