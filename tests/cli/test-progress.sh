#!/bin/sh
# tests/cli/test-progress.sh: the progress display fits the terminal. In a pseudo-terminal
# (script(1)) of 80 and of 120 columns, a training run draws one line redrawn in place: no
# redraw is wider than the terminal, none leaves a line behind, and the run ends with its
# summary; the same for the GPT. Elsewhere (stderr a file) a line every --log-every steps.
. "${TS_SRCDIR:-.}/tests/cli/lib.sh"
plan 6
command -v script >/dev/null || { echo "1..0 # SKIP script(1) (bsdutils) is not installed"; exit 77; }
DATA=/usr/share/datasets/fashion-mnist
cd "$TMP" || exit 1
printf 'the quick brown fox jumps over the lazy dog. %.0s' $(seq 200) >t.txt

# check_tty COLS FILE: every redraw of the bar (the text between carriage returns that holds
# the bar's first field) at most COLS - 1 columns wide, and every other line too (the banner,
# the evaluations and the summary are broken to fit).
check_tty() {
    cols=$1 file=$2
    tr -d '\033' <"$file" | sed 's/\[K//g' | tr '\r' '\n' |
        awk -v cols="$cols" '/^(epoch [0-9]+\/[0-9]+ batch|step [0-9]+\/[0-9]+:)/ {
            n++; if (length($0) > cols - 1) { print "too wide (" length($0) "): " $0; bad = 1 } }
            END { if (n < 2) { print "only " n " redraws"; bad = 1 } exit bad }'
    # and every other line (banner, evaluations, summary) fits too: nothing wraps
    tr -d '\033' <"$file" | sed 's/\[K//g' | tr '\r' '\n' | grep -v '^Script ' |
        awk -v cols="$cols" 'length($0) > cols - 1 { print "wraps (" length($0) "): " $0 }'
}

# in_tty NAME COLS ARGS: tessera ARGS in a COLS-column pseudo-terminal, its output in NAME; ok
# when it exits 0, every line fits and the summary of 400 steps comes last (broken into
# indented lines on a terminal narrower than it).
in_tty() {
    name=$1 cols=$2
    shift 2
    timeout "$(hang_limit 120)" script -q -e -c "stty cols $cols rows 24; \"$TESSERA\" $*" \
        "$name.$cols" >/dev/null 2>&1
    rc=$?
    why=$(check_tty "$cols" "$name.$cols")
    # the summary last: its line, then only its own continuations (indented) if it was broken
    last=$(tr -d '\r' <"$name.$cols" | grep -v '^Script ' | grep . |
        awk '/^done: / { d = $0; after = 0; next } d != "" && !/^  / { after = 1 }
             END { if (!after) print d }')
    if [ $rc -eq 0 ] && [ -z "$why" ] && contains "$last" "done: 400 steps"; then
        ok "$name in $cols columns: one line redrawn in place, nothing wider, then the summary"
    else
        fail "$name progress in $cols columns" "rc=$rc" "$why" "$last"
    fi
}

G="train --model gpt --text t.txt --context 16 --layers 2 --heads 2 --embd 32 --steps 400
   --eval-every 400 --eval-batches 1"
for cols in 20 80 120; do
    # shellcheck disable=SC2086
    in_tty gpt "$cols" $(echo $G)
done

# Redirected: stdout is line-buffered (the banner is in the log before the first step ends)
# and stderr gets plain progress lines.
"$TESSERA" $(echo $G) --steps 100000 --eval-every 100000 --log-every 5 >log.out 2>log.err &
pid=$!
end=$(($(date +%s) + $(hang_limit 60)))
while ! grep -q '^step 5/100000: loss' log.err 2>/dev/null && kill -0 $pid 2>/dev/null &&
    [ "$(date +%s)" -lt "$end" ]; do
    sleep 0.05
done
banner=$(cat log.out)
kill -INT $pid 2>/dev/null
wait $pid
if contains "$banner" "tessera train: gpt --context 16" && grep -q '^step 5/100000: loss [0-9.]*, [0-9]* tokens/s, .* elapsed, ETA ' log.err; then
    ok "redirected: the banner is in the log at once, progress lines every --log-every steps on stderr"
else
    fail "redirected output" "$banner" "$(head -5 log.err)"
fi

# Without --log-every, a redirected run's first progress line comes 5 seconds in.
"$TESSERA" $(echo $G) --steps 10000000 --eval-every 10000000 >log2.out 2>log2.err &
pid=$!
start=$(date +%s)
end=$((start + $(hang_limit 30)))
while ! grep -q '^step [0-9]*/10000000: loss' log2.err 2>/dev/null && kill -0 $pid 2>/dev/null &&
    [ "$(date +%s)" -lt "$end" ]; do
    sleep 0.2
done
took=$(($(date +%s) - start))
kill -INT $pid 2>/dev/null
wait $pid
if grep -q '^step [0-9]*/10000000: loss' log2.err && [ "$took" -le "$(hang_limit 20)" ]; then
    ok "redirected without --log-every: a progress line on stderr after ${took} s"
else
    fail "a redirected run's first progress line" "after $took s" "$(head -3 log2.err)"
fi

if [ ! -d "$DATA" ]; then
    skip "mlp progress in 80 columns" "Fashion-MNIST is not installed (Debian package dataset-fashion-mnist)"
    finish
fi
in_tty mlp 80 train --model mlp --hidden 32 --train-limit 6400 --batch-size 16
finish
