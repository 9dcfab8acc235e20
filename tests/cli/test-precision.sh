#!/bin/sh
# tests/cli/test-precision.sh: --precision on tessera train and bench train. A bf16 run records
# its precision in the checkpoint and the start record; stopped by --max-steps and resumed
# with --resume alone it continues in bf16 and ends byte-identical to the straight bf16 run
# (the GPT and an MNIST model); its weights stay float32 and differ from the fp32 run's; fp16
# keeps its loss scale in the checkpoint and resumes byte-identical as well; an
# unknown precision is a usage error naming the choices; an edited checkpoint value is refused;
# bench train --precision fp32,bf16 reports both side by side.
. "${TS_SRCDIR:-.}/tests/cli/lib.sh"
plan 12
DATA=/usr/share/datasets/fashion-mnist
cd "$TMP" || exit 1

printf 'the quick brown fox jumps over the lazy dog. %.0s' $(seq 100) >t.txt
G="--model gpt --text t.txt --context 16 --layers 1 --heads 2 --embd 16 --batch-size 3 --steps 16
  --warmup-steps 4 --lr 0.003 --eval-every 8 --eval-batches 1 --seed 3"
# shellcheck disable=SC2086
"$TESSERA" train $G --precision bf16 --save ba.ckpt >ba.out 2>&1
# shellcheck disable=SC2086
"$TESSERA" train $G --precision bf16 --max-steps 5 --save bb.ckpt >bb.out 2>&1
cp bb.ckpt b5.ckpt
out=$("$TESSERA" train --resume bb.ckpt --text t.txt 2>&1)
# shellcheck disable=SC2086
"$TESSERA" train $G --save fa.ckpt >fa.out 2>&1
meta=$("$TESSERA" inspect ba.ckpt 2>&1)
if cmp -s ba.ckpt bb.ckpt && contains "$meta" "train.precision = bf16" &&
    contains "$meta" " F32 " && ! contains "$meta" " BF16 " && ! cmp -s ba.ckpt fa.ckpt; then
    ok "gpt --precision bf16: recorded, resumed in bf16 byte-identical, float32 weights unlike fp32's"
else
    fail "gpt --precision bf16 resume" "$out" "$meta" "$(cmp ba.ckpt bb.ckpt 2>&1)"
fi

out=$("$TESSERA" train --model gpt --text t.txt --precision fp8 2>&1)
rc=$?
if [ $rc -eq 2 ] && contains "$out" "fp32" && contains "$out" "bf16" && contains "$out" "fp16"; then
    ok "--precision fp8 is a usage error naming the choices"
else
    fail "--precision fp8" "rc=$rc" "$out"
fi

# an edited checkpoint value
sed 's/"train.precision":"bf16"/"train.precision":"bf17"/' b5.ckpt >bad.ckpt
out=$("$TESSERA" train --resume bad.ckpt --text t.txt 2>&1)
rc=$?
if cmp -s b5.ckpt bad.ckpt; then
    skip "an edited train.precision is refused" "the metadata is not stored as plain JSON text"
elif [ $rc -ne 0 ] && contains "$out" "train.precision" && contains "$out" "bf17"; then
    ok "an edited train.precision is refused, naming the key and value"
else
    fail "an edited train.precision" "rc=$rc" "$out"
fi

# given on --resume otherwise: an accepted override (as --accumulate)
out=$("$TESSERA" train --resume b5.ckpt --text t.txt --precision fp32 --save bc.ckpt 2>&1)
rc=$?
if [ $rc -eq 0 ] && contains "$("$TESSERA" inspect bc.ckpt 2>&1)" "train.precision = fp32"; then
    ok "--precision given on --resume overrides the checkpoint's"
else
    fail "--precision on --resume" "rc=$rc" "$out"
fi

if [ -r "$DATA/train-images-idx3-ubyte.gz" ] || [ -r "$DATA/train-images-idx3-ubyte" ]; then
    M="--model mlp --max-steps 12 --train-limit 640 --batch-size 32 --seed 5 --data $DATA"
    # shellcheck disable=SC2086
    "$TESSERA" train $M --precision bf16 --save ma.ckpt >ma.out 2>&1
    # shellcheck disable=SC2086
    "$TESSERA" train $M --precision bf16 --max-steps 5 --save mb.ckpt >mb.out 2>&1
    out=$("$TESSERA" train --resume mb.ckpt --data "$DATA" --max-steps 12 2>&1)
    # shellcheck disable=SC2086
    js=$("$TESSERA" train $M --precision bf16 --json 2>&1 | head -1)
    if cmp -s ma.ckpt mb.ckpt && contains "$js" '"precision":"bf16"'; then
        ok "mlp --precision bf16: in the start record; resumed byte-identical"
    else
        fail "mlp --precision bf16" "$out" "$js" "$(cmp ma.ckpt mb.ckpt 2>&1)"
    fi
else
    skip "mlp --precision bf16" "Fashion-MNIST is not installed"
fi

# fp16: its loss scale is kept in the checkpoint, and a resumed run ends byte-identical
# shellcheck disable=SC2086
"$TESSERA" train $G --precision fp16 --save ha.ckpt >ha.out 2>&1
# shellcheck disable=SC2086
"$TESSERA" train $G --precision fp16 --max-steps 6 --save hb.ckpt >hb.out 2>&1
meta=$("$TESSERA" inspect hb.ckpt 2>&1)
out=$("$TESSERA" train --resume hb.ckpt --text t.txt 2>&1)
if cmp -s ha.ckpt hb.ckpt && contains "$meta" "train.precision = fp16" &&
    contains "$meta" "train.loss_scale = " && contains "$meta" "train.loss_scale_clean = 6"; then
    ok "gpt --precision fp16: the loss scale in the checkpoint; resumed byte-identical"
else
    fail "gpt --precision fp16 resume" "$out" "$meta" "$(cmp ha.ckpt hb.ckpt 2>&1)"
fi

# an edited loss scale (NaN, infinite, negative, zero, empty) is refused by name
bad=0
for v in 'nan  ' 'inf  ' '-1   ' '0    ' '     '; do
    sed "s/\"train.loss_scale\":\"[0-9]*\"/\"train.loss_scale\":\"$v\"/" hb.ckpt >hs.ckpt
    cmp -s hb.ckpt hs.ckpt && bad=1 # the key was not found
    out=$("$TESSERA" train --resume hs.ckpt --text t.txt 2>&1) && bad=1
    contains "$out" "train.loss_scale" || bad=1
done
if [ $bad -eq 0 ]; then
    ok "an edited train.loss_scale (nan, inf, -1, 0, empty) is refused, naming the key"
else
    fail "edited train.loss_scale" "$out"
fi

# dropout under autocast: its draws in float32, the model trains
# shellcheck disable=SC2086
out=$("$TESSERA" train $G --dropout 0.1 --precision bf16 2>&1)
rc=$?
if [ $rc -eq 0 ] && contains "$out" "done:"; then
    ok "gpt --dropout 0.1 --precision bf16 trains"
else
    fail "gpt --dropout with bf16" "rc=$rc" "$out"
fi

# only a float16 trainer writes its loss scale: not a bf16 run, not --save-initial
# shellcheck disable=SC2086
"$TESSERA" train $G --precision fp16 --max-steps 2 --save-initial hi.ckpt --save hj.ckpt >hi.out 2>&1
if ! contains "$("$TESSERA" inspect b5.ckpt 2>&1)" "train.loss_scale" &&
    ! contains "$("$TESSERA" inspect hi.ckpt 2>&1)" "train.loss_scale" &&
    contains "$("$TESSERA" inspect hj.ckpt 2>&1)" "train.loss_scale = 65536"; then
    ok "the loss scale is written by a float16 trainer only"
else
    fail "where the loss scale is written" "$(cat hi.out)"
fi

out=$("$TESSERA" generate --resume ba.ckpt --tokens 20 --precision bf16 2>&1)
rc=$?
bad=$("$TESSERA" generate --resume ba.ckpt --precision fp64 2>&1)
rcb=$?
if [ $rc -eq 0 ] && contains "$out" "20 tokens" && [ $rcb -eq 2 ] && contains "$bad" "bf16"; then
    ok "generate --precision bf16 samples; an unknown precision is a usage error"
else
    fail "generate --precision" "rc=$rc" "$out" "rc=$rcb" "$bad"
fi

out=$("$TESSERA" bench gpt --steps 200 --context 8 --layers 1 --heads 1 --embd 8 --batch-size 2 \
    --precision bf16 --json 2>&1)
rc=$?
if [ $rc -eq 0 ] && contains "$out" '"precision": "bf16"' &&
    contains "$out" '"raw_allocs_per_step": 0.000000'; then
    ok "bench gpt --precision bf16: flat (no raw pool allocations per steady step)"
else
    fail "bench gpt --precision bf16" "rc=$rc" "$out"
fi

out=$("$TESSERA" bench train --model gpt --context 16 --layers 1 --heads 2 --embd 16 \
    --batch-size 4 --steps 3 --warmup 1 --precision fp32,bf16 2>&1)
rc=$?
if [ $rc -eq 0 ] && contains "$out" " fp32 " && contains "$out" " bf16 " &&
    contains "$out" "bf16 against fp32:" && contains "$out" "step MiB"; then
    ok "bench train --precision fp32,bf16: both rows and the ratio line"
else
    fail "bench train --precision fp32,bf16" "rc=$rc" "$out"
fi
finish
