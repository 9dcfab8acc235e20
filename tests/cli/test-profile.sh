#!/bin/sh
# tests/cli/test-profile.sh: `tessera train --profile`. The kernel table on stderr (and a
# "profile" JSON record) says where a step's time goes; with --memtrace every kernel is a
# slice on its thread's track, inside "step N" slices, on the same clock as the pool
# counters: each kernel lies within the trace, a step's kernels fit in the step, and the
# slices name the op, dtype and shape. Without --profile the trace has no kernel slices.
. "${TS_SRCDIR:-.}/tests/cli/lib.sh"
plan 8
awk 'BEGIN { for (i = 0; i < 600; i++) printf "the cat sat on the mat %d ", i }' >"$TMP/t.txt"
G="--model gpt --text $TMP/t.txt --context 16 --layers 1 --heads 2 --embd 16 --batch-size 4 --eval-every 5 --eval-batches 1"

"$TESSERA" train $G --steps 6 --profile --memtrace "$TMP/p.json" >"$TMP/out" 2>"$TMP/err"
rc=$?
tr=$("$JSON_CHECK" displayTimeUnit <"$TMP/p.json" 2>&1)
# Per step N: its kernels' summed duration, its length, and its matmuls; every kernel inside
# the trace's time span (not before 0, not after the last counter + 1 s).
check_out=$(awk '
    function num(key,   m) {
        if (match($0, "\"" key "\":[-0-9.e+]+")) return substr($0, RSTART + length(key) + 3, RLENGTH - length(key) - 3) + 0
        return "x"
    }
    function str(key) {
        if (match($0, "\"" key "\":\"[^\"]*\"")) return substr($0, RSTART + length(key) + 4, RLENGTH - length(key) - 5)
        return ""
    }
    /"ph":"C"/ { t = num("ts"); if (t > last) last = t }
    /"name":"step [0-9]+","ph":"B"/ { step = str("name"); b[step] = num("ts"); tid = num("tid"); cur = step; next }
    /"name":"step [0-9]+","ph":"E"/ { e[str("name")] = num("ts"); cur = ""; next }
    /"cat":"kernel","ph":"X"/ {
        k++; ts = num("ts"); d = num("dur")
        if (ts == "x" || d == "x" || ts < 0 || d < 0) bad++
        if (ts + d > maxk) maxk = ts + d
        if (cur != "" && num("tid") == tid) { sum[cur] += d; if (str("name") == "matmul") mm[cur]++ }
        if (str("name") == "matmul" && index($0, "\"dtype\":\"float32\"") && index($0, "\"shape\":\"(")) named++
    }
    END {
        n = 0
        for (s in b) {
            n++
            if (!(s in e) || e[s] < b[s]) { printf "%s has no end\n", s; fail++ ; continue }
            if (mm[s] < 1) { printf "%s ran no matmul slice\n", s; fail++ }
            if (sum[s] > e[s] - b[s] + 1) { printf "%s: kernels %.1f us in a %.1f us step\n", s, sum[s], e[s] - b[s]; fail++ }
        }
        printf "steps=%d kernels=%d bad=%d named=%d fail=%d late=%d\n", n, k, bad, named, fail, (maxk > last + 1e6)
    }' "$TMP/p.json")
if [ $rc -eq 0 ] && contains "$tr" 'displayTimeUnit="ms"' &&
    contains "$check_out" "steps=6 " && contains "$check_out" " bad=0 " &&
    contains "$check_out" " fail=0 " && contains "$check_out" " late=0" &&
    ! contains "$check_out" "kernels=0 " && ! contains "$check_out" "named=0 " &&
    grep -q '"name":"kernels (thread 1)"' "$TMP/p.json"; then
    ok "--profile --memtrace: kernel slices inside step slices on the pools' clock ($check_out)"
else
    fail "--profile --memtrace: kernel slices inside step slices" "rc=$rc" "$check_out" "$tr" \
        "$(tail -3 "$TMP/err")"
fi

# tessera memplot draws the evaluation slices of such a trace, not its step slices.
"$TESSERA" memplot "$TMP/p.json" -o "$TMP/p.svg" >/dev/null 2>&1
rc=$?
bands=$(grep -c 'fill="#e8f0e0"' "$TMP/p.svg")
evals=$(grep -c '"name":"eval","ph":"B"' "$TMP/p.json")
if [ $rc -eq 0 ] && [ "$evals" -ge 1 ] && [ "$bands" -eq "$evals" ]; then
    ok "memplot of a --profile trace draws its $evals evaluation slices, not its step slices"
else
    fail "memplot of a --profile trace draws only evaluation slices" "rc=$rc bands=$bands evals=$evals"
fi

if grep -q 'kernels over 6 training steps (evaluation apart, below)' "$TMP/err" &&
    grep -q ' matmul float32  *plugin$' "$TMP/err" &&
    grep -q 'in kernels, of' "$TMP/err" && ! grep -q 'matmul' "$TMP/out"; then
    ok "--profile prints the kernel table on stderr"
else
    fail "--profile prints the kernel table on stderr" "$(cat "$TMP/err")"
fi

"$TESSERA" train $G --steps 3 --memtrace "$TMP/q.json" >/dev/null 2>&1
rc=$?
if [ $rc -eq 0 ] && ! grep -q '"ph":"X"' "$TMP/q.json" && ! grep -q '"name":"step 1","ph":"B"' "$TMP/q.json" &&
    grep -q '"ph":"C"' "$TMP/q.json"; then
    ok "without --profile the trace has no kernel or step slices"
else
    fail "without --profile the trace has no kernel or step slices" "rc=$rc" "$(grep -c '"ph":"X"' "$TMP/q.json")"
fi

"$TESSERA" train $G --steps 3 --profile --json >"$TMP/j.out" 2>"$TMP/j.err"
rc=$?
rec=$(grep '"event": *"profile"' "$TMP/j.out" | "$JSON_CHECK" steps kernels.[0].kernel kernels.[0].calls \
    kernels.[0].ms_per_step in_kernels_ms_per_step 2>&1)
if [ $rc -eq 0 ] && contains "$rec" "steps=3" && contains "$rec" "kernels.[0].calls=" &&
    ! grep -q 'kernels over' "$TMP/j.out"; then
    ok "--profile --json: a profile record ($(echo "$rec" | tr '\n' ' '))"
else
    fail "--profile --json: a profile record" "rc=$rc" "$rec" "$(tail -3 "$TMP/j.out")"
fi

DATA=/usr/share/datasets/fashion-mnist
if [ -f "$DATA/train-images-idx3-ubyte.gz" ]; then
    "$TESSERA" train --model mlp --train-limit 256 --batch-size 64 --max-steps 3 --device cpu_blas \
        --profile --memtrace "$TMP/m.json" >"$TMP/m.out" 2>"$TMP/m.err"
    rc=$?
    n=$(grep -c '"name":"step [0-9]*","ph":"B"' "$TMP/m.json")
    if [ $rc -eq 0 ] && [ "$n" -eq 3 ] && grep -q '"name":"matmul","cat":"kernel"' "$TMP/m.json" &&
        grep -q 'kernels over 3 training steps' "$TMP/m.err"; then
        ok "train --model mlp --profile: step and kernel slices, the table"
    else
        fail "train --model mlp --profile" "rc=$rc steps=$n" "$(tail -5 "$TMP/m.err")"
    fi
else
    skip "train --model mlp --profile" "Fashion-MNIST is not installed (Debian package dataset-fashion-mnist)"
fi
# Where each kernel ran: the decline fixture claims unary and binary float32 and declines every
# call, so those run on the reference kernels as "declined", matmul (unclaimed) as "reference",
# fills on the plugin; with log_level = info the first fallback of each kernel is said once;
# --profile all lists every kernel.
printf '[core]\ndevice = cpu_blas\nlog_level = info\n' >"$TMP/info.ini"
chmod 644 "$TMP/info.ini"
P="train --device decline --model gpt --text $TMP/p.txt --context 8 --layers 1 --heads 1 --embd 8
   --steps 3 --eval-every 3 --eval-batches 1"
printf 'abcdefghij %.0s' $(seq 300) >"$TMP/p.txt"
# shellcheck disable=SC2086
out=$(TESSERA_PLUGIN_PATH="$TS_BUILDDIR/tests/fixtures/.libs" "$TESSERA" --config "$TMP/info.ini" $(echo $P) --profile all 2>&1)
rc=$?
n=$(printf '%s\n' "$out" | sed -n '/kernels over/,/ms in kernels/p' | grep -c '%')
if [ $rc -eq 0 ] && printf '%s\n' "$out" | grep -q 'binary add float32 *100% reference (declined)$' &&
    printf '%s\n' "$out" | grep -q 'matmul float32 *100% reference$' &&
    printf '%s\n' "$out" | grep -q ' fill  *plugin$' &&
    [ "$(printf '%s\n' "$out" | grep -c "info: binary add float32 runs on the reference kernels, not plugin 'decline': the plugin declined the call")" -eq 1 ] &&
    [ "$n" -gt 15 ] && ! contains "$out" "more kernels" &&
    contains "$out" "evaluation: 1 pass, " && ! contains "$out" "evaluation not counted"; then
    ok "--profile says where each kernel ran (plugin, reference, declined); info logs each fallback once; --profile all lists all $n; evaluation apart"
else
    fail "--profile: where kernels ran" "rc=$rc n=$n" "$out"
fi
# A run that diverges still closes the slice of the step that diverged.
"$TESSERA" train --model mlp --train-limit 640 --optimizer sgd --lr 1e5 --profile \
    --memtrace "$TMP/div.json" >"$TMP/div.out" 2>&1
rc=$?
nb=$(grep -c '"name":"step [0-9]*","ph":"B"' "$TMP/div.json")
ne=$(grep -c '"name":"step [0-9]*","ph":"E"' "$TMP/div.json")
if [ $rc -eq 1 ] && contains "$(cat "$TMP/div.out")" "training diverged" && [ "$nb" -gt 0 ] &&
    [ "$nb" -eq "$ne" ]; then
    ok "a diverged run's trace closes every step slice ($nb)"
else
    fail "a diverged run's trace closes every step slice" "rc=$rc begun $nb ended $ne" "$(cat "$TMP/div.out")"
fi
finish
