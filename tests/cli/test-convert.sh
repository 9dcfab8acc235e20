#!/bin/sh
# tests/cli/test-convert.sh: `tessera convert`. numpy's own files (tests/data/npy) go into a
# safetensors file and come back byte for byte; a tensor name that is no safe file name is
# refused instead of becoming a path; hostile inputs and outputs (a corrupt array, a FIFO, a
# symbolic link) are refused by name without hanging; misuse is exit status 2. --to bf16
# exports a training checkpoint's weights in bfloat16 (optimizer state left out): half the
# bytes, each weight rounded once, and eval and generate read it.
. "${TS_SRCDIR:-.}/tests/cli/lib.sh"
plan 11
D="$TS_SRCDIR/tests/data/npy"

out=$("$TESSERA" convert "$D/f32_2x3.npy" "$D/i8_scalar.npy" "$D/f32_4d_fortran.npy" \
    "$D/bool_4.npy" -o "$TMP/m.safetensors" 2>&1)
rc=$?
ins=$("$TESSERA" inspect "$TMP/m.safetensors" 2>&1)
if [ $rc -eq 0 ] && contains "$out" "4 tensors" && contains "$ins" "f32_2x3  F32  (2, 3)  24 B" &&
    contains "$ins" "i8_scalar  I64  ()  8 B" && contains "$ins" "f32_4d_fortran  F32  (2, 3, 4, 5)" &&
    contains "$ins" "bool_4  U8  (4)"; then
    ok "arrays into one safetensors file, named after their files"
else
    fail "arrays into one safetensors file" "rc=$rc" "$out" "$ins"
fi

mkdir "$TMP/back"
out=$("$TESSERA" convert "$TMP/m.safetensors" -o "$TMP/back/" 2>&1)
rc=$?
if [ $rc -eq 0 ] && contains "$out" "4 arrays" && cmp -s "$TMP/back/f32_2x3.npy" "$D/f32_2x3.npy" &&
    cmp -s "$TMP/back/i8_scalar.npy" "$D/i8_scalar.npy" &&
    cmp -s "$TMP/back/f32_4d_fortran.npy" "$D/f32_4d.npy"; then
    ok "back to .npy: numpy's files byte for byte (Fortran order comes back as C order)"
else
    fail "back to .npy byte for byte" "rc=$rc" "$out" "$(ls -l "$TMP/back")"
fi

o1=$("$TESSERA" convert "$TMP/m.safetensors" --name i8_scalar -o "$TMP/one.npy" 2>&1); r1=$?
o2=$("$TESSERA" convert "$TMP/m.safetensors" --name nosuch -o "$TMP/none.npy" 2>&1); r2=$?
o3=$("$TESSERA" convert "$TMP/m.safetensors" -o "$TMP/all.npy" 2>&1); r3=$?
o4=$("$TESSERA" convert "$D/i4_big_endian.npy" -o "$TMP/le.npy" 2>&1); r4=$?
if [ $r1 -eq 0 ] && cmp -s "$TMP/one.npy" "$D/i8_scalar.npy" && [ $r2 -eq 1 ] &&
    contains "$o2" "no tensor named 'nosuch'" && [ ! -e "$TMP/none.npy" ] && [ $r3 -eq 2 ] &&
    contains "$o3" "holds 4 tensors" && [ $r4 -eq 0 ] &&
    [ "$(od -An -tx1 -j128 -N4 "$TMP/le.npy" | tr -d ' ')" = "01000000" ]; then
    ok "--name picks one tensor; a missing one or an ambiguous -o is an error; big-endian comes out little-endian"
else
    fail "--name and single files" "r1=$r1 $o1" "r2=$r2 $o2" "r3=$r3 $o3" "r4=$r4 $o4"
fi

# A safetensors file whose tensor name would be a path outside DIR.
h='{"../escaped":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'
{ printf "\\$(printf %o ${#h})\\000\\000\\000\\000\\000\\000\\000"; printf '%s' "$h"; printf '\000\000\200\077'; } \
    >"$TMP/evil.safetensors"
mkdir "$TMP/jail"
out=$("$TESSERA" convert "$TMP/evil.safetensors" -o "$TMP/jail/" 2>&1); rc=$?
# a name with terminal escapes is shown escaped, never sent to the terminal
h='{"\u001b]0;x\u0007":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}'
{ printf "\\$(printf %o ${#h})\\000\\000\\000\\000\\000\\000\\000"; printf '%s' "$h"; printf '\000\000\200\077'; } \
    >"$TMP/esc.safetensors"
o2=$("$TESSERA" convert "$TMP/esc.safetensors" -o "$TMP/jail/" 2>&1); r2=$?
# an input file name that is not UTF-8 cannot become a tensor name
cp "$D/f32_2x3.npy" "$TMP/$(printf 'bad\377name').npy"
o3=$("$TESSERA" convert "$TMP/$(printf 'bad\377name').npy" -o "$TMP/u.safetensors" 2>&1); r3=$?
if [ $rc -eq 1 ] && contains "$out" "not a safe file name" && [ ! -e "$TMP/escaped.npy" ] &&
    [ -z "$(ls "$TMP/jail")" ] && [ $r2 -eq 1 ] && contains "$o2" "'\\x1b]0;x\\x07'" &&
    ! printf '%s' "$o2" | grep -q "$(printf '\033')" && [ $r3 -eq 1 ] && contains "$o3" "UTF-8" &&
    [ ! -e "$TMP/u.safetensors" ]; then
    ok "a tensor name with '/' is refused, not turned into a path; escapes are shown escaped; non-UTF-8 names refused"
else
    fail "a tensor name with '/' is refused" "rc=$rc" "$out" "r2=$r2 $o2" "r3=$r3 $o3" "$(ls "$TMP/jail")"
fi

# Hostile inputs: a truncated array, a FIFO nobody writes, a directory.
head -c 150 "$D/f32_2x3.npy" >"$TMP/short.npy"
mkfifo "$TMP/fifo.npy"
o1=$(timeout "$(hang_limit 20)" "$TESSERA" convert "$TMP/short.npy" -o "$TMP/s.safetensors" 2>&1); r1=$?
o2=$(timeout "$(hang_limit 20)" "$TESSERA" convert "$TMP/fifo.npy" -o "$TMP/f.safetensors" 2>&1); r2=$?
o3=$(timeout "$(hang_limit 20)" "$TESSERA" convert "$D/complex.npy" -o "$TMP/c.safetensors" 2>&1); r3=$?
if [ $r1 -eq 1 ] && contains "$o1" "short.npy" && contains "$o1" "truncated" && [ $r2 -eq 1 ] &&
    contains "$o2" "FIFO" && [ $r3 -eq 1 ] && contains "$o3" "complex numbers" &&
    [ ! -e "$TMP/s.safetensors" ] && [ ! -e "$TMP/f.safetensors" ]; then
    ok "a truncated array, a FIFO and a complex array are refused by name, nothing written"
else
    fail "hostile inputs" "r1=$r1 $o1" "r2=$r2 $o2" "r3=$r3 $o3"
fi

# Outputs: never through a symbolic link, never over a FIFO.
ln -s "$TMP/target" "$TMP/link.safetensors"
mkfifo "$TMP/out.npy"
o1=$("$TESSERA" convert "$D/f32_2x3.npy" -o "$TMP/link.safetensors" 2>&1); r1=$?
o2=$(timeout "$(hang_limit 20)" "$TESSERA" convert "$D/f32_2x3.npy" -o "$TMP/out.npy" 2>&1); r2=$?
if [ $r1 -eq 1 ] && contains "$o1" "symbolic link" && [ ! -e "$TMP/target" ] && [ $r2 -eq 1 ] &&
    contains "$o2" "FIFO"; then
    ok "an output that is a symbolic link or a FIFO is refused"
else
    fail "outputs that are links or FIFOs" "r1=$r1 $o1" "r2=$r2 $o2"
fi

o1=$("$TESSERA" convert "$D/f32_2x3.npy" 2>&1); r1=$?
echo "not an array" >"$TMP/notes.txt"
o2=$("$TESSERA" convert "$TMP/notes.txt" -o "$TMP/x.bin" 2>&1); r2=$?
o3=$("$TESSERA" convert "$D/f32_2x3.npy" "$D/f2_3.npy" --name w -o "$TMP/w.safetensors" 2>&1); r3=$?
mkdir "$TMP/a" "$TMP/b"
cp "$D/f32_2x3.npy" "$TMP/a/w.npy"
cp "$D/f2_3.npy" "$TMP/b/w.npy"
o4=$("$TESSERA" convert "$TMP/a/w.npy" "$TMP/b/w.npy" -o "$TMP/w.safetensors" 2>&1); r4=$?
o5=$("$TESSERA" convert --bogus 2>&1); r5=$?
if [ $r1 -eq 2 ] && [ $r2 -eq 2 ] && contains "$o2" "'$TMP/notes.txt' is neither a NumPy .npy array" &&
    [ ! -e "$TMP/x.bin" ] && [ $r3 -eq 2 ] &&
    [ $r4 -eq 2 ] && contains "$o4" "two inputs give the tensor name 'w'" && [ $r5 -eq 2 ] &&
    [ ! -e "$TMP/w.safetensors" ]; then
    ok "misuse (no -o, an input that is neither kind, --name with several inputs, two names alike) is exit 2"
else
    fail "misuse is exit 2" "r1=$r1 $o1" "r2=$r2 $o2" "r3=$r3 $o3" "r4=$r4 $o4" "r5=$r5 $o5"
fi
# By content, not by name: an array to a checkpoint named run.ckpt, and that checkpoint back to
# arrays in a directory.
mkdir -p "$TMP/back"
o1=$("$TESSERA" convert "$D/f32_2x3.npy" -o "$TMP/run.ckpt" 2>&1); r1=$?
o2=$("$TESSERA" convert "$TMP/run.ckpt" -o "$TMP/back/" 2>&1); r2=$?
o3=$("$TESSERA" convert "$TMP/run.ckpt" -o "$TMP/again.safetensors" 2>&1); r3=$?
if [ $r1 -eq 0 ] && [ $r2 -eq 0 ] && cmp -s "$D/f32_2x3.npy" "$TMP/back/f32_2x3.npy" &&
    [ $r3 -eq 2 ] && contains "$o3" "is a safetensors file already"; then
    ok "convert decides by content: .npy -> run.ckpt -> DIR/ gives the array back byte for byte"
else
    fail "convert by content" "r1=$r1 $o1" "r2=$r2 $o2" "r3=$r3 $o3"
fi
# An output that is one of the inputs is refused and the input kept; a cut safetensors file
# is named as one (not "neither kind").
cp "$D/f32_2x3.npy" "$TMP/keep.npy"
"$TESSERA" convert "$TMP/keep.npy" -o "$TMP/keep.safetensors" >/dev/null 2>&1
cp "$TMP/keep.safetensors" "$TMP/keep2.safetensors"
o1=$("$TESSERA" convert "$TMP/keep.npy" "$D/f2_3.npy" -o "$TMP/keep.npy" 2>&1); r1=$?
o2=$("$TESSERA" convert "$TMP/keep.safetensors" --name keep -o "$TMP/keep.safetensors" 2>&1); r2=$?
head -c 40 "$TMP/keep.safetensors" >"$TMP/cut.safetensors"
o3=$("$TESSERA" convert "$TMP/cut.safetensors" -o "$TMP/" 2>&1); r3=$?
if [ $r1 -eq 2 ] && contains "$o1" "is the input" && cmp -s "$D/f32_2x3.npy" "$TMP/keep.npy" &&
    [ $r2 -eq 2 ] && cmp -s "$TMP/keep.safetensors" "$TMP/keep2.safetensors" &&
    [ $r3 -eq 1 ] && contains "$o3" "larger than the file"; then
    ok "an output that is an input is refused, the input kept; a cut safetensors file is named as such"
else
    fail "convert onto an input, or a cut file" "r1=$r1 $o1" "r2=$r2 $o2" "r3=$r3 $o3"
fi
# --to bf16: a GPT checkpoint's weights in half the bytes, readable by eval and generate
printf 'the quick brown fox jumps over the lazy dog. %.0s' $(seq 60) >"$TMP/t.txt"
"$TESSERA" train --model gpt --text "$TMP/t.txt" --context 16 --layers 1 --heads 2 --embd 16 \
    --batch-size 2 --steps 6 --eval-every 6 --eval-batches 1 --save "$TMP/g.ckpt" >/dev/null 2>&1
out=$("$TESSERA" convert "$TMP/g.ckpt" --to bf16 -o "$TMP/g16.safetensors" 2>&1)
rc=$?
ins=$("$TESSERA" inspect "$TMP/g16.safetensors" 2>&1)
ev=$("$TESSERA" eval --resume "$TMP/g16.safetensors" --text "$TMP/t.txt" --eval-batches 1 2>&1)
rce=$?
gen=$("$TESSERA" generate --resume "$TMP/g16.safetensors" --tokens 5 2>&1)
rcg=$?
back=$("$TESSERA" convert "$TMP/g16.safetensors" --to fp32 -o "$TMP/g32.safetensors" 2>&1)
w16=$("$TESSERA" convert "$TMP/g32.safetensors" --name transformer.wpe.weight -o "$TMP/wpe16.npy" 2>&1)
"$TESSERA" convert "$TMP/g.ckpt" --name transformer.wpe.weight -o "$TMP/wpe.npy" >/dev/null 2>&1
# every float32 weight rounded to bfloat16 once: the low 16 bits zero, the high 16 the same
# or one unit more (od's 16-bit words of little-endian floats: low, then high)
od -An -v -tx2 -j128 "$TMP/wpe.npy" | tr -s ' ' '\n' | sed '/^$/d' >"$TMP/a.hex"
od -An -v -tx2 -j128 "$TMP/wpe16.npy" | tr -s ' ' '\n' | sed '/^$/d' >"$TMP/b.hex"
same=$(paste "$TMP/a.hex" "$TMP/b.hex" | awk '
    function hex(s,   i, v) { v = 0; for (i = 1; i <= length(s); i++)
        v = v * 16 + index("0123456789abcdef", substr(s, i, 1)) - 1; return v }
    NR % 2 == 1 { if ($2 != "0000") bad++ }
    NR % 2 == 0 { d = hex($2) - hex($1); if (d < 0 || d > 1) bad++ }
    END { print ((NR > 0 && !bad) ? "yes" : "no") }')
if [ $rc -eq 0 ] && contains "$out" "optimizer-state tensors left out" &&
    contains "$ins" "transformer.wte.weight  BF16" && ! contains "$ins" "exp_avg" &&
    [ $rce -eq 0 ] && contains "$ev" "validation loss" && [ $rcg -eq 0 ] &&
    contains "$back" "converted to float32" && [ "$same" = yes ]; then
    ok "convert --to bf16: weights rounded once, no optimizer state; eval and generate read it"
else
    fail "convert --to bf16" "rc=$rc" "$out" "$ins" "eval rc=$rce" "$ev" "generate rc=$rcg" "$gen" "$back" "$w16" "same=$same"
fi

out=$("$TESSERA" convert "$TMP/g.ckpt" --to fp8 -o "$TMP/x.safetensors" 2>&1)
rc=$?
out2=$("$TESSERA" convert "$D/f32_2x3.npy" --to bf16 -o "$TMP/y.safetensors" 2>&1)
rc2=$?
if [ $rc -eq 2 ] && contains "$out" "bf16, fp16 or fp32" && [ $rc2 -eq 2 ] &&
    contains "$out2" "one safetensors file" && [ ! -e "$TMP/x.safetensors" ]; then
    ok "convert --to: an unknown type or an array input is a usage error"
else
    fail "convert --to misuse" "rc=$rc" "$out" "rc=$rc2" "$out2"
fi
finish
