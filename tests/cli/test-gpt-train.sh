#!/bin/sh
# tests/cli/test-gpt-train.sh: `tessera train --model gpt` on a text file: the first loss is
# ln(256) within a few percent, validation loss falls and is reported in nats and bits per
# byte; a run stopped with --max-steps and resumed trains exactly what the straight run
# trains; another model, text or seed is refused on resume; bad inputs are clear errors.
. "${TS_SRCDIR:-.}/tests/cli/lib.sh"
plan 11

# A deterministic text: 30,000 bytes of words from a small vocabulary.
TEXT="$TMP/corpus.txt"
awk 'BEGIN { split("the quick brown fox jumps over a lazy dog and a curious cat", w, " ");
    s = 7; while (n < 30000) { s = (s * 1103515245 + 12345) % 2147483648; x = w[1 + int(s / 65536) % 12] " ";
    printf "%s", x; n += length(x) } }' >"$TEXT"
SMALL="--model gpt --text $TEXT --context 32 --layers 2 --heads 2 --embd 32 --batch-size 8 \
--warmup-steps 5 --lr 3e-3 --eval-every 20 --eval-batches 4 --device cpu_blas"

out=$("$TESSERA" train $SMALL --steps 60 --log-steps --json 2>&1)
first=$(echo "$out" | sed -n 's/^{"step": 1, "loss": \([^,]*\),.*/\1/p')
vals=$(echo "$out" | sed -n 's/.*"val_loss": \([^,]*\),.*/\1/p' | tr '\n' ' ')
if [ -n "$first" ] && awk "BEGIN { l = log(256); d = $first - l; if (d < 0) d = -d; exit !(d < 0.03 * l) }"; then
    ok "the first step's loss is ln(256) within 3%: $first"
else
    fail "the first step's loss is ln(256) within 3%" "$first" "$out"
fi
if [ "$(echo $vals | wc -w)" -eq 3 ] && echo "$vals" | awk '{ exit !($3 < $1 && $3 < 3.0) }' &&
    echo "$out" | grep -q '"val_bits_per_byte"' && echo "$out" | grep -q '"tokens_per_s"'; then
    ok "validation loss falls and is reported with bits per byte and tokens/s: $vals"
else
    fail "validation loss falls" "$vals" "$out"
fi
bpb=$(echo "$out" | sed -n 's/.*"val_loss": \([^,]*\), "val_bits_per_byte": \([^,]*\),.*/\1 \2/p' | tail -1)
if echo "$bpb" | awk '{ d = $1 / log(2) - $2; if (d < 0) d = -d; exit !(NF == 2 && d < 1e-5) }'; then
    ok "bits per byte = nats / ln 2 ($bpb)"
else
    fail "bits per byte = nats / ln 2" "$bpb"
fi

# Stopped at 30 of 60 and resumed = straight, loss for loss.
straight=$(echo "$out" | sed -n 's/^{"step": [0-9]*, "loss": \([^,]*\),.*/\1/p')
a=$("$TESSERA" train $SMALL --steps 60 --max-steps 30 --save "$TMP/g.st" --log-steps --json 2>&1 |
    sed -n 's/^{"step": [0-9]*, "loss": \([^,]*\),.*/\1/p')
b=$("$TESSERA" train $SMALL --steps 60 --resume "$TMP/g.st" --log-steps --json 2>&1 |
    sed -n 's/^{"step": [0-9]*, "loss": \([^,]*\),.*/\1/p')
split=$(printf '%s\n%s\n' "$a" "$b")
if [ "$(echo "$straight" | wc -l)" -eq 60 ] && [ "$straight" = "$split" ]; then
    ok "30 steps + 30 resumed = 60 straight, exactly"
else
    fail "30 steps + 30 resumed = 60 straight" "straight $(echo $straight | head -c 300)" \
        "split $(echo $split | head -c 300)"
fi

# What a resume cannot honour is refused.
out=$("$TESSERA" train $SMALL --embd 64 --steps 60 --resume "$TMP/g.st" 2>&1)
rc=$?
cp "$TEXT" "$TMP/other.txt" && printf 'x' >>"$TMP/other.txt"
out2=$("$TESSERA" train $(echo "$SMALL" | sed "s|$TEXT|$TMP/other.txt|") --steps 60 \
    --resume "$TMP/g.st" 2>&1)
rc2=$?
if [ $rc -eq 2 ] && contains "$out" "--embd 32" && [ $rc2 -eq 2 ] &&
    contains "$out2" "trained on another text"; then
    ok "resume with another architecture or another text is refused"
else
    fail "resume with another architecture or another text is refused" "$rc: $out" "$rc2: $out2"
fi

# Generation: prompt then --tokens bytes, the same for the same seed, past the context (32)
# by refeeding; greedy at temperature 0.
g1=$("$TESSERA" generate --resume "$TMP/g.st" --prompt "the " --tokens 100 --seed 5 \
    --device cpu_blas 2>/dev/null | od -An -c | tr -d ' \n')
g2=$("$TESSERA" generate --resume "$TMP/g.st" --prompt "the " --tokens 100 --seed 5 \
    --device cpu_blas 2>/dev/null | od -An -c | tr -d ' \n')
n=$("$TESSERA" generate --resume "$TMP/g.st" --prompt "the " --tokens 100 --seed 5 \
    --device cpu_blas 2>/dev/null | wc -c)
err=$("$TESSERA" generate --resume "$TMP/g.st" --tokens 10 --temperature 0 --device cpu_blas 2>&1 >/dev/null)
if [ -n "$g1" ] && [ "$g1" = "$g2" ] && [ "$n" -eq 104 ] && contains "$err" "tokens/s"; then
    ok "generate: 4 + 100 bytes past the context, the same for the same seed, speed on stderr"
else
    fail "generate: prompt + tokens, reproducible" "n=$n" "$g1" "$g2" "$err"
fi
out=$("$TESSERA" generate --tokens 5 2>&1); rc1=$?
out2=$("$TESSERA" generate --resume "$TMP/none.st" 2>&1); rc2=$?
if [ $rc1 -eq 2 ] && contains "$out" "--resume CKPT is required" && [ $rc2 -eq 1 ] &&
    contains "$out2" "none.st"; then
    ok "generate without --resume exits 2; a missing checkpoint is named"
else
    fail "generate misuse" "$rc1: $out" "$rc2: $out2"
fi

# Bad inputs.
mkdir "$TMP/dir"
out=$("$TESSERA" train --model gpt --text "$TMP/dir" --steps 1 2>&1); rc1=$?
printf 'short' >"$TMP/short.txt"
out2=$("$TESSERA" train --model gpt --text "$TMP/short.txt" --steps 1 2>&1); rc2=$?
out3=$("$TESSERA" train --model gpt --text "$TEXT" --embd 30 --heads 4 --steps 1 2>&1); rc3=$?
if [ $rc1 -eq 1 ] && contains "$out" "not a regular file (a directory)" && [ $rc2 -eq 1 ] &&
    contains "$out2" "the text has 5 bytes" && [ $rc3 -eq 2 ] && contains "$out3" "multiple of --heads"; then
    ok "a directory, a too short text and --embd not a multiple of --heads are clear errors"
else
    fail "bad inputs are clear errors" "$rc1: $out" "$rc2: $out2" "$rc3: $out3"
fi
out=$("$TESSERA" help train 2>&1; "$TESSERA" train --model gpt --help 2>&1)
if contains "$out" "--model gpt --help" && contains "$out" "usage: tessera train --model gpt"; then
    ok "train --help points at the GPT's help, which lists its options"
else
    fail "train --help points at the GPT's help" "$out"
fi
# SIGTERM: the step finishes, the checkpoint is written, exit 143; it resumes from there.
"$TESSERA" train $SMALL --steps 100000 --save "$TMP/sig.ckpt" >"$TMP/sig.out" 2>"$TMP/sig.err" &
pid=$!
sleep 2
kill -TERM $pid
wait $pid
rc=$?
n=$(sed -n 's/.*SIGTERM: stopped after step \([0-9]*\); saved .*/\1/p' "$TMP/sig.err")
out=$("$TESSERA" train $SMALL --steps 100000 --max-steps $((${n:-0} + 3)) --resume "$TMP/sig.ckpt" --log-steps --json 2>&1)
rc2=$?
if [ $rc -eq 143 ] && [ -n "$n" ] && [ $rc2 -eq 0 ] &&
    [ "$(echo "$out" | grep -c '"step": [0-9]*, "loss"')" -eq 3 ] &&
    contains "$out" "{\"step\": $((n + 1)), \"loss\""; then
    ok "SIGTERM after step $n: exit 143, saved; --resume continues at step $((n + 1))"
else
    fail "SIGTERM: stop, save, resume" "rc=$rc rc2=$rc2 n=$n" "$(cat "$TMP/sig.err")" "$out"
fi
# tessera eval of a GPT checkpoint: the validation loss of training's last evaluation (the
# same windows, the same weights).
"$TESSERA" train $SMALL --steps 20 --save "$TMP/ev.ckpt" --json >"$TMP/ev.json" 2>/dev/null
want=$(grep '"val_loss"' "$TMP/ev.json" | grep -v event | tail -1 | sed 's/.*"val_loss": \([^,]*\),.*/\1/')
got=$("$TESSERA" eval --resume "$TMP/ev.ckpt" --text "$TEXT" --eval-batches 4 --json 2>/dev/null | "$JSON_CHECK" val_loss | sed 's/.*=//')
if [ -n "$want" ] && [ -n "$got" ] && awk "BEGIN{d=$want-$got; if(d<0)d=-d; exit !(d < 5e-6)}"; then
    ok "tessera eval of a GPT checkpoint gives training's last validation loss ($got)"
else
    fail "tessera eval of a GPT checkpoint" "want=$want got=$got" "$(cat "$TMP/ev.json" | tail -3)"
fi
finish
