#!/bin/sh
# tests/cli/test-inspect.sh: `tessera inspect FILE` lists any safetensors file: a training
# checkpoint (tensors, shapes, bytes, metadata; --json parses), a file with half, bfloat16 and
# bool tensors as PyTorch writes them (shown with the dtype they load as), and refuses a
# damaged file, a directory or a FIFO with one line naming it, never hanging.
. "${TS_SRCDIR:-.}/tests/cli/lib.sh"
plan 4

# A checkpoint of 2 mlp steps on random-free synthetic data is not needed: any safetensors
# file tessera writes will do. Without Fashion-MNIST, a GPT checkpoint on a small text.
awk 'BEGIN { for (i = 0; i < 400; i++) printf "the cat sat on the mat %d ", i }' >"$TMP/t.txt"
"$TESSERA" train --model gpt --text "$TMP/t.txt" --context 8 --layers 1 --heads 1 --embd 8 \
    --batch-size 2 --steps 2 --eval-every 2 --eval-batches 1 --save "$TMP/g.ckpt" >/dev/null 2>&1
out=$("$TESSERA" inspect "$TMP/g.ckpt" 2>&1)
rc=$?
js=$("$TESSERA" inspect --json "$TMP/g.ckpt" 2>&1)
vals=$(echo "$js" | "$JSON_CHECK" file bytes tensors.[0].name tensors.[0].dtype tensors.[0].shape.[0] 2>&1)
n=$(echo "$out" | sed -n 's/.*: \([0-9]*\) tensors, .*/\1/p')
if [ $rc -eq 0 ] && [ -n "$n" ] && [ "$n" -gt 5 ] && contains "$out" "  meta model.name = gpt" &&
    contains "$out" "of tensor data" && contains "$vals" 'tensors.[0].dtype="F32"' &&
    contains "$js" '"metadata":{' && contains "$js" '"model.name":"gpt"'; then
    ok "inspect lists a checkpoint's $n tensors and its metadata; --json parses"
else
    fail "inspect lists a checkpoint" "rc=$rc" "$out" "$js" "$vals"
fi

# Half, bfloat16 and bool tensors: 1.0 and -2.0 in F16, 1.0 in BF16, one bool.
hdr='{"h":{"dtype":"F16","shape":[2],"data_offsets":[0,4]},"b":{"dtype":"BF16","shape":[1],"data_offsets":[4,6]},"m":{"dtype":"BOOL","shape":[1],"data_offsets":[6,7]}}'
len=$(printf '%s' "$hdr" | wc -c)
{
    printf "\\$(printf '%03o' "$len")\\000\\000\\000\\000\\000\\000\\000"
    printf '%s' "$hdr"
    printf '\000\074\000\300\200\077\001'
} >"$TMP/half.safetensors"
out=$("$TESSERA" inspect "$TMP/half.safetensors" 2>&1)
rc=$?
if [ $rc -eq 0 ] && contains "$out" "h  F16  (2)  4 B" && ! contains "$out" "F16 (loads" &&
    contains "$out" "b  BF16  (1)  2 B" && contains "$out" "m  BOOL (loads as uint8)  (1)  1 B"; then
    ok "inspect shows F16 and BF16 tensors as they load, BOOL with the dtype it loads as"
else
    fail "inspect shows converted dtypes" "rc=$rc" "$out"
fi

# Damaged and special files: one line naming the file, exit 1, no hang.
head -c 40 "$TMP/g.ckpt" >"$TMP/cut.ckpt"
mkfifo "$TMP/fifo"
bad=""
for f in "$TMP/cut.ckpt" "$TMP" "$TMP/fifo" "$TMP/missing"; do
    o=$(timeout "$(hang_limit 10)" "$TESSERA" inspect "$f" 2>&1)
    r=$?
    if [ $r -ne 1 ] || ! contains "$o" "$f" || [ "$(echo "$o" | wc -l)" -ne 1 ]; then
        bad="$bad [$f: rc=$r: $o]"
    fi
done
if [ -z "$bad" ]; then
    ok "a truncated file, a directory, a FIFO and a missing file are each one error line, exit 1"
else
    fail "damaged and special files are refused" "$bad"
fi

out=$("$TESSERA" inspect 2>&1)
rc=$?
out2=$("$TESSERA" inspect a b 2>&1)
rc2=$?
if [ $rc -eq 2 ] && [ $rc2 -eq 2 ] && contains "$out" "which file?" && contains "$out2" "one FILE at a time"; then
    ok "inspect without a file, or with two, is a usage error"
else
    fail "inspect usage errors" "$rc $rc2" "$out" "$out2"
fi
finish
