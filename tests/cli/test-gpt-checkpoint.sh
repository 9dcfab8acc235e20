#!/bin/sh
# tests/cli/test-gpt-checkpoint.sh: one way to read a GPT checkpoint. generate, eval and train
# --resume restore every parameter of any depth (43 and 64 layers: generate once kept a fixed
# array of 512 parameters and sampled from random weights past 42 layers) and refuse alike
# what does not hold together: a train.arch over another body (more layers, fewer layers), an
# unknown train.format, a NaN weight. A resumed run is its checkpoint's run: settings not given
# are taken from it, settings given must agree, --save-initial with --resume is an error. A
# shape that cannot fit is refused before it is built; a missing or damaged checkpoint is
# named as such.
. "${TS_SRCDIR:-.}/tests/cli/lib.sh"
plan 14
printf 'the quick brown fox jumps over the lazy dog. %.0s' $(seq 40) >"$TMP/t.txt"
TINY="--model gpt --text $TMP/t.txt --context 8 --heads 1 --embd 8 --batch-size 2 --eval-batches 1"

# Deep models: what generate writes depends on the trained weights, not on a fresh model's.
for L in 43 64; do
    # shellcheck disable=SC2086
    "$TESSERA" train $TINY --layers $L --steps 10 --lr 0.01 --eval-every 10 \
        --save-initial "$TMP/i$L.st" --save "$TMP/t$L.st" >"$TMP/train$L.log" 2>&1
    a=$("$TESSERA" generate --resume "$TMP/t$L.st" --prompt "the " --tokens 24 --seed 3 2>/dev/null | od -An -tx1)
    b=$("$TESSERA" generate --resume "$TMP/i$L.st" --prompt "the " --tokens 24 --seed 3 2>/dev/null | od -An -tx1)
    if [ -n "$a" ] && [ -n "$b" ] && [ "$a" != "$b" ]; then
        ok "generate samples from a $L-layer GPT's own weights (trained and initial differ)"
    else
        fail "generate samples from a $L-layer GPT's own weights" "$a" "$b" "$(cat "$TMP/train$L.log")"
    fi
done

# A 1-layer body under hostile headers, each edited in place (the header keeps its length).
# shellcheck disable=SC2086
"$TESSERA" train $TINY --layers 1 --dropout 0.5 --steps 2 --eval-every 2 --save "$TMP/one.st" >/dev/null 2>&1
# shellcheck disable=SC2086
"$TESSERA" train $TINY --layers 2 --steps 2 --eval-every 2 --save "$TMP/two.st" >/dev/null 2>&1
LC_ALL=C sed 's/"model.layers":"1"/"model.layers":"64"/; s/"model.dropout":"0.5"/"model.dropout":"0."/' \
    "$TMP/one.st" >"$TMP/deep.st"
LC_ALL=C sed 's/"model.layers":"2"/"model.layers":"1"/' "$TMP/two.st" >"$TMP/shallow.st"
LC_ALL=C sed 's/tessera-train-gpt-1/tessera-train-gpt-9/' "$TMP/one.st" >"$TMP/format.st"
# NaN in the first element of transformer.wte.weight
cp "$TMP/one.st" "$TMP/nan.st"
hlen=$(od -An -tu8 -N8 "$TMP/nan.st" | tr -d ' ')
off=$(head -c $((8 + hlen)) "$TMP/nan.st" | LC_ALL=C grep -a -o '"transformer.wte.weight":{[^}]*}' |
    sed 's/.*"data_offsets":\[\([0-9]*\),.*/\1/')
printf '\377\377\377\177' | dd of="$TMP/nan.st" bs=1 seek=$((8 + hlen + off)) conv=notrunc 2>/dev/null

# refused_by_all NAME FILE NEEDLE: generate, eval and train --resume each fail on FILE
# saying NEEDLE (the same words from all three), and none of them trains or samples.
refused_by_all() {
    name=$1 file=$2 needle=$3
    cmp -s "$file" "$TMP/one.st" && { fail "$name" "the edit did not happen"; return; }
    g=$("$TESSERA" generate --resume "$file" --tokens 5 2>&1); rg=$?
    e=$("$TESSERA" eval --resume "$file" --text "$TMP/t.txt" --eval-batches 1 2>&1); re=$?
    # shellcheck disable=SC2086
    t=$("$TESSERA" train --text "$TMP/t.txt" --eval-batches 1 --resume "$file" 2>&1); rt=$?
    if [ $rg -ne 0 ] && [ $re -ne 0 ] && [ $rt -ne 0 ] && contains "$g" "$needle" &&
        contains "$e" "$needle" && contains "$t" "$needle" && ! contains "$t" "step "; then
        ok "$name: refused by generate, eval and train --resume alike"
    else
        fail "$name" "generate $rg: $g" "eval $re: $e" "train $rt: $t"
    fi
}
refused_by_all "a 64-layer header over a 1-layer body" "$TMP/deep.st" \
    "parameters, but the checkpoint holds 3000"
refused_by_all "a 1-layer header over a 2-layer body" "$TMP/shallow.st" \
    "(nothing was built)"
refused_by_all "an unknown train.format" "$TMP/format.st" "'train.format' = 'tessera-train-gpt-9'"
refused_by_all "a NaN weight" "$TMP/nan.st" "'transformer.wte.weight' holds a value that is not finite"

# Resume takes the run's settings from the checkpoint: a 6-step run stopped at 3 ends at 6.
# shellcheck disable=SC2086
"$TESSERA" train $TINY --layers 1 --steps 6 --max-steps 3 --lr 0.002 --min-lr 0.0001 \
    --warmup-steps 2 --weight-decay 0.05 --batch-size 3 --seed 9 --eval-every 3 \
    --save "$TMP/run.st" >/dev/null 2>&1
out=$("$TESSERA" train --model gpt --text "$TMP/t.txt" --context 8 --layers 1 --heads 1 \
    --embd 8 --eval-batches 1 --eval-every 3 --resume "$TMP/run.st" --save "$TMP/run2.st" --json 2>&1)
last=$(echo "$out" | grep '"step"' | grep -v '"event"' | tail -1 | "$JSON_CHECK" step 2>/dev/null)
banner=$("$TESSERA" train --model gpt --text "$TMP/t.txt" --context 8 --layers 1 --heads 1 \
    --embd 8 --eval-batches 1 --eval-every 3 --max-steps 4 --resume "$TMP/run.st" \
    --save "$TMP/run3.st" 2>&1 | head -1)
if [ "$last" = "step=6" ] && contains "$banner" "batch 3 x 8 tokens, seed 9, adamw lr 0.002 weight decay 0.05, 2 warm-up steps then cosine to 0.0001, 6 steps, resumed from $TMP/run.st at step 3"; then
    ok "resume without settings takes the checkpoint's (ends at its step 6; the banner shows them)"
else
    fail "resume takes the checkpoint's settings" "$last" "$banner" "$out"
fi
# Each setting given otherwise is refused, naming both values.
bad=""
for opt in "--lr 0.001:0.002" "--steps 7:6" "--warmup-steps 1:2" "--min-lr 0.0002:0.0001" \
    "--weight-decay 0.1:0.05" "--batch-size 2:3" "--seed 1:9"; do
    given=${opt%%:*} want=${opt##*:} name=${given%% *}
    # shellcheck disable=SC2086
    o=$("$TESSERA" train --model gpt --text "$TMP/t.txt" --context 8 --layers 1 --heads 1 \
        --embd 8 --eval-batches 1 --resume "$TMP/run.st" $given 2>&1)
    rc=$?
    if [ $rc -ne 2 ] || ! contains "$o" "was trained with $name $want, and this run gives $given"; then
        bad="$bad
$given: rc=$rc $o"
    fi
done
if [ -z "$bad" ]; then
    ok "resume refuses --lr, --steps, --warmup-steps, --min-lr, --weight-decay, --batch-size, --seed that differ"
else
    fail "resume refuses settings that differ" "$bad"
fi
o=$("$TESSERA" train --model gpt --text "$TMP/t.txt" --resume "$TMP/run.st" \
    --save-initial "$TMP/x.st" 2>&1)
rc=$?
if [ $rc -eq 2 ] && contains "$o" "--save-initial" && [ ! -e "$TMP/x.st" ]; then
    ok "--save-initial with --resume is a usage error"
else
    fail "--save-initial with --resume is a usage error" "rc=$rc" "$o"
fi

# A checkpoint of the format before the model.* keys (train.model and train.arch, written by
# the previous release; tests/data/legacy) still generates, evaluates and resumes.
LEGACY="$TS_SRCDIR/tests/data/legacy/gpt-1layer.safetensors"
printf 'the quick brown fox jumps over the lazy dog. %.0s' $(seq 200) >"$TMP/t200.txt"
g=$("$TESSERA" generate --resume "$LEGACY" --tokens 20 --seed 2 2>/dev/null | wc -c)
e=$("$TESSERA" eval --resume "$LEGACY" --text "$TMP/t200.txt" --eval-batches 1 2>&1); re=$?
t=$("$TESSERA" train --resume "$LEGACY" --text "$TMP/t200.txt" --eval-batches 1 2>&1); rt=$?
if [ "$g" -eq 21 ] && [ $re -eq 0 ] && contains "$e" "validation loss" && [ $rt -eq 0 ] &&
    contains "$t" "the model from $LEGACY: gpt --context 8 --layers 1 --heads 1 --embd 8"; then
    ok "a checkpoint of the previous format generates, evaluates and resumes"
else
    fail "a checkpoint of the previous format" "generate: $g bytes" "eval $re: $e" "train $rt: $t"
fi

# A model configuration that does not match the tensors stored with it is refused before the
# model is built (a hostile one could otherwise make root allocate and initialise gigabytes).
LC_ALL=C sed 's/"mlp --hidden 4"/"mlp --hidden 9"/' "$TS_SRCDIR/tests/data/legacy/mlp-hidden4.safetensors" \
    >"$TMP/wide.st"
o=$("$TESSERA" train --resume "$TMP/wide.st" 2>&1); rc=$?
if [ $rc -eq 1 ] && contains "$o" "('mlp --hidden 9') has 7165 parameters, but the checkpoint holds 3190" &&
    contains "$o" "nothing was built"; then
    ok "a model configuration that does not match its tensors is refused before building"
else
    fail "a model configuration that does not match its tensors" "rc=$rc" "$o"
fi

# On a terminal, control bytes generate writes (the prompt's, or a hostile model's) are shown
# as \xNN, never sent to the terminal; redirected, bytes go out as they are.
if command -v script >/dev/null 2>&1; then
    P="$(printf 'a\033]0;X\007b')"
    o=$(script -qec "\"$TESSERA\" generate --resume \"$LEGACY\" --prompt '$P' --tokens 3 --seed 1" /dev/null 2>&1)
    r=$("$TESSERA" generate --resume "$LEGACY" --prompt "$P" --tokens 3 --seed 1 2>/dev/null | head -c 8)
    if contains "$o" 'a\x1b]0;X\x07b' && ! contains "$o" "$(printf '\033')" && [ "$r" = "$P" ]; then
        ok "generate shows control bytes as \\xNN on a terminal and writes them as they are when redirected"
    else
        fail "generate escapes control bytes on a terminal" "$o" "$r"
    fi
else
    skip "generate escapes control bytes on a terminal" "no script(1) to make a terminal"
fi

# An absurd shape is refused at once, with the sizes, before anything is built (it once built
# for over 15 minutes at 10.9 GB).
printf 'abcdefghijklmnopqrstuvwxyz0123456789. %.0s' $(seq 1500) >"$TMP/long.txt"
start=$(date +%s)
o=$(timeout "$(hang_limit 60)" "$TESSERA" train --model gpt --text "$TMP/long.txt" --context 4096 --layers 64 \
    --heads 64 --embd 8192 --batch-size 4096 2>&1)
rc=$?
took=$(($(date +%s) - start))
if [ $rc -eq 1 ] && contains "$o" "needs at least" && contains "$o" "million parameters" &&
    contains "$o" "raise memory_fraction"; then
    ok "a GPT too big for the pool is refused before it is built (${took} s)"
else
    fail "a GPT too big for the pool is refused before it is built" "rc=$rc after ${took} s" "$o"
fi
# A missing or damaged checkpoint is named as such by eval and train --resume.
echo garbage >"$TMP/damaged.st"
e1=$("$TESSERA" eval --resume "$TMP/none.st" --text "$TMP/t.txt" 2>&1); r1=$?
e2=$("$TESSERA" eval --resume "$TMP/damaged.st" --text "$TMP/t.txt" 2>&1); r2=$?
e3=$("$TESSERA" train --resume "$TMP/damaged.st" --text "$TMP/t.txt" 2>&1); r3=$?
if [ $r1 -eq 1 ] && contains "$e1" "$TMP/none.st': cannot open: No such file" &&
    [ $r2 -eq 1 ] && contains "$e2" "$TMP/damaged.st: header length" && [ $r3 -eq 1 ] &&
    contains "$e3" "$TMP/damaged.st: header length" && ! contains "$e1$e2$e3" "unexpected argument"; then
    ok "eval and train --resume name a missing or damaged checkpoint"
else
    fail "eval and train --resume name a missing or damaged checkpoint" "$r1: $e1" "$r2: $e2" "$r3: $e3"
fi
finish
