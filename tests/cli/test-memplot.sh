#!/bin/sh
# tests/cli/test-memplot.sh: memory you can look at. `tessera train --memtrace --memplot`
# writes a Chrome/Perfetto trace (valid JSON, pool counters, step marks and evaluation slices)
# and draws it as an SVG (a pool's in-use and reserved lines, the marks, the slices) that an
# SVG renderer (librsvg's rsvg-convert, when installed) renders; `tessera memplot` refuses a
# FIFO, a missing file and a JSON file that is not a memory trace, without hanging; a trace
# holding absurd numbers (1e308 bytes, infinite or negative counts, times centuries away) is
# drawn from its sane samples, says how many it skipped, and no label reads nan or inf.
. "${TS_SRCDIR:-.}/tests/cli/lib.sh"
plan 12
awk 'BEGIN { for (i = 0; i < 600; i++) printf "the cat sat on the mat %d ", i }' >"$TMP/t.txt"
"$TESSERA" train --model gpt --text "$TMP/t.txt" --context 16 --layers 1 --heads 2 --embd 16 \
    --batch-size 4 --steps 40 --eval-every 20 --eval-batches 2 --memtrace "$TMP/m.json" \
    --memplot "$TMP/m.svg" >"$TMP/out" 2>&1
rc=$?
svg=$(cat "$TMP/m.svg" 2>/dev/null)
tr=$("$JSON_CHECK" displayTimeUnit <"$TMP/m.json" 2>&1)
if [ $rc -eq 0 ] && contains "$tr" 'displayTimeUnit="ms"' && grep -q '"ph":"C"' "$TMP/m.json" &&
    grep -q '"name":"step 20","ph":"i"' "$TMP/m.json" && grep -q '"name":"eval","ph":"B"' "$TMP/m.json" &&
    [ "$(head -c 4 "$TMP/m.svg")" = "<svg" ] && [ "$(tail -1 "$TMP/m.svg")" = "</svg>" ] &&
    [ "$(grep -c '<polyline' "$TMP/m.svg")" -eq 2 ] && contains "$svg" ">pool " &&
    contains "$svg" ">step 20</text>" && contains "$svg" 'fill="#e8f0e0"'; then
    ok "train --memtrace --memplot: a valid trace with counters, step marks and eval slices, drawn as an SVG"
else
    fail "train --memtrace --memplot" "rc=$rc" "$(tail -3 "$TMP/out")" "$tr" "$(head -c 600 "$TMP/m.svg")"
fi
if command -v rsvg-convert >/dev/null 2>&1; then
    if rsvg-convert "$TMP/m.svg" -o "$TMP/m.png" 2>"$TMP/rsvg.err" && [ -s "$TMP/m.png" ]; then
        ok "the SVG renders (rsvg-convert: $(wc -c <"$TMP/m.png") bytes of PNG)"
    else
        fail "the SVG renders" "$(cat "$TMP/rsvg.err")"
    fi
else
    skip "the SVG renders" "no SVG renderer here (Debian package librsvg2-bin)"
fi
mkfifo "$TMP/fifo"
echo '{"traceEvents":[' >"$TMP/other.json"
echo '{"name":"x","ph":"X","ts":1}' >>"$TMP/other.json"
echo ']}' >>"$TMP/other.json"
o1=$(timeout "$(hang_limit 10)" "$TESSERA" memplot "$TMP/fifo" -o "$TMP/f.svg" 2>&1); r1=$?
o2=$(timeout "$(hang_limit 10)" "$TESSERA" memplot "$TMP/missing" 2>&1); r2=$?
o3=$(timeout "$(hang_limit 10)" "$TESSERA" memplot "$TMP/other.json" 2>&1); r3=$?
o4=$("$TESSERA" memplot 2>&1); r4=$?
# non-finite and negative numbers in a trace are not samples: the picture has no NaN in it
{ head -3 "$TMP/m.json"; echo '{"name":"pool cpu_blas","ph":"C","ts":-1e308,"pid":1,"tid":0,"args":{"in_use":1e309,"reserved":-5,"cached":0}},'
  echo '{"name":"pool cpu_blas","ph":"C","ts":1e999,"pid":1,"tid":0,"args":{"in_use":1,"reserved":2,"cached":0}},'
  tail -n +4 "$TMP/m.json"; } >"$TMP/odd.json"
o5=$(timeout "$(hang_limit 10)" "$TESSERA" memplot "$TMP/odd.json" -o "$TMP/odd.svg" 2>&1); r5=$?
# the trace as its own picture (or through a hard link): refused, the trace intact
cp "$TMP/m.json" "$TMP/self.json"
o6=$(timeout "$(hang_limit 10)" "$TESSERA" memplot "$TMP/self.json" -o "$TMP/self.json" 2>&1); r6=$?
if [ $r1 -eq 1 ] && contains "$o1" "not a regular file" && [ $r2 -eq 1 ] && contains "$o2" "$TMP/missing" &&
    [ $r3 -eq 1 ] && contains "$o3" "holds no pool counter events" && [ $r4 -eq 2 ] &&
    [ ! -e "$TMP/f.svg" ] && [ ! -e "$TMP/other.svg" ] && [ $r5 -eq 0 ] &&
    ! grep -qi 'nan\|inf' "$TMP/odd.svg" && [ $r6 -eq 1 ] && contains "$o6" "the trace being drawn" &&
    cmp -s "$TMP/m.json" "$TMP/self.json"; then
    ok "memplot refuses a FIFO, a missing file and a trace without pool counters, skips non-finite samples; no TRACE is a usage error"
else
    fail "memplot refusals" "$r1 $r2 $r3 $r4 $r5" "$o1" "$o2" "$o3" "$o4" "$o5"
fi
# Output paths a local adversary could plant: a symbolic link (to a file root must not
# clobber) and a FIFO are refused for the trace and for the picture; nothing is written.
echo precious >"$TMP/victim"
ln -s "$TMP/victim" "$TMP/link.json"
ln -s "$TMP/victim" "$TMP/link.svg"
mkfifo "$TMP/fifo.svg"
o1=$(timeout "$(hang_limit 30)" "$TESSERA" train --model gpt --text "$TMP/t.txt" --context 8 --layers 1 --heads 1 --embd 8 \
    --batch-size 2 --steps 2 --eval-every 2 --eval-batches 1 --memtrace "$TMP/link.json" 2>&1); r1=$?
o2=$(timeout "$(hang_limit 10)" "$TESSERA" memplot "$TMP/m.json" -o "$TMP/link.svg" 2>&1); r2=$?
o3=$(timeout "$(hang_limit 10)" "$TESSERA" memplot "$TMP/m.json" -o "$TMP/fifo.svg" 2>&1); r3=$?
if [ $r1 -eq 1 ] && contains "$o1" "symbolic link" && [ $r2 -eq 1 ] && contains "$o2" "symbolic link" &&
    [ $r3 -eq 1 ] && contains "$o3" "FIFO" && [ "$(cat "$TMP/victim")" = precious ]; then
    ok "a symbolic link or FIFO as the trace or picture is refused; the link's target is untouched"
else
    fail "planted output paths are refused" "$r1 $r2 $r3" "$o1" "$o2" "$o3" "$(cat "$TMP/victim")"
fi
# The trace or picture naming the checkpoint (--save or --resume, or a hard link to it): refused
# before anything is written, so the checkpoint survives.
G="--model gpt --text $TMP/t.txt --context 8 --layers 1 --heads 1 --embd 8 --batch-size 2 --eval-every 2 --eval-batches 1"
"$TESSERA" train $G --steps 2 --save "$TMP/ck.safetensors" >/dev/null 2>&1
cp "$TMP/ck.safetensors" "$TMP/ck.orig"
ln "$TMP/ck.safetensors" "$TMP/hard.json"
o1=$("$TESSERA" train $G --steps 4 --resume "$TMP/ck.safetensors" --memtrace "$TMP/ck.safetensors" 2>&1); r1=$?
o2=$("$TESSERA" train $G --steps 4 --resume "$TMP/ck.safetensors" --save "$TMP/ck.safetensors" --memplot "$TMP/ck.safetensors" 2>&1); r2=$?
o3=$("$TESSERA" train $G --steps 4 --save "$TMP/new.safetensors" --memtrace "$TMP/new.safetensors" 2>&1); r3=$?
o4=$("$TESSERA" train $G --steps 4 --resume "$TMP/ck.safetensors" --memtrace "$TMP/hard.json" 2>&1); r4=$?
# The same files by other names, before they exist: another spelling of --save, the trace
# --memplot names after itself, --save-initial.
mkdir "$TMP/sub"
cp "$TMP/ck.safetensors" "$TMP/p.svg.trace.json"
o5=$("$TESSERA" train $G --steps 4 --save "$TMP/sub/c.safetensors" --memplot "$TMP/sub/./c.safetensors" 2>&1); r5=$?
o6=$("$TESSERA" train $G --steps 4 --resume "$TMP/p.svg.trace.json" --memplot "$TMP/p.svg" 2>&1); r6=$?
o7=$("$TESSERA" train $G --steps 2 --save-initial "$TMP/sub/i.safetensors" --memplot "$TMP/sub/../sub/i.safetensors" 2>&1); r7=$?
if [ $r1 -eq 2 ] && contains "$o1" "the trace" && contains "$o1" "is the file of --" && [ $r2 -eq 2 ] &&
    contains "$o2" "--memplot" && [ $r3 -eq 2 ] && contains "$o3" "--save" && [ $r4 -eq 2 ] &&
    cmp -s "$TMP/ck.safetensors" "$TMP/ck.orig" && [ ! -e "$TMP/new.safetensors" ] &&
    [ $r5 -eq 2 ] && [ ! -e "$TMP/sub/c.safetensors" ] && [ $r6 -eq 2 ] &&
    cmp -s "$TMP/p.svg.trace.json" "$TMP/ck.orig" && [ $r7 -eq 2 ] && contains "$o7" "--save-initial" &&
    [ ! -e "$TMP/sub/i.safetensors" ]; then
    ok "a trace or picture naming the checkpoint (or a hard link to it) is refused; the checkpoint survives"
else
    fail "trace or picture naming the checkpoint" "r1=$r1 $o1" "r2=$r2 $o2" "r3=$r3 $o3" "r4=$r4 $o4" \
        "r5=$r5 $o5" "r6=$r6 $o6" "r7=$r7 $o7" "$(cmp "$TMP/ck.safetensors" "$TMP/ck.orig" 2>&1)"
fi
# More pools than the picture has rows for: the first 8 drawn, and it says so.
{ echo '{"traceEvents":['
  for i in 1 2 3 4 5 6 7 8 9; do
      echo "{\"name\":\"pool p$i\",\"ph\":\"C\",\"ts\":$i,\"pid\":1,\"tid\":0,\"args\":{\"in_use\":$i,\"reserved\":$i,\"cached\":0}},"
  done
  echo '{"name":"pool p9","ph":"C","ts":10,"pid":1,"tid":0,"args":{"in_use":1,"reserved":1,"cached":0}}'
  echo ']}'; } >"$TMP/nine.json"
o=$("$TESSERA" memplot "$TMP/nine.json" -o "$TMP/nine.svg" 2>&1); rc=$?
if [ $rc -eq 0 ] && contains "$o" "8 pools" && contains "$o" "more than 8 pools" &&
    contains "$o" "2 events of the others are not"; then
    ok "a trace of 9 pools: 8 drawn, and memplot says the rest are not"
else
    fail "a trace of 9 pools" "rc=$rc" "$o"
fi
# Absurd numbers in a hand-edited or damaged trace: finite but huge byte counts (1e308 would
# make the axis inf and its zero tick inf * 0 = nan), infinite and negative ones, a time 1e300
# us away. Each such sample is skipped and counted; the sane ones are drawn with finite axes.
{ echo '{"traceEvents":['
  echo '{"name":"pool cpu","ph":"C","ts":1000,"pid":1,"tid":0,"args":{"in_use":1024,"reserved":2048,"cached":0}},'
  echo '{"name":"pool cpu","ph":"C","ts":2000,"pid":1,"tid":0,"args":{"in_use":1e308,"reserved":1e308,"cached":0}},'
  echo '{"name":"pool cpu","ph":"C","ts":3000,"pid":1,"tid":0,"args":{"in_use":1e999,"reserved":1,"cached":0}},'
  echo '{"name":"pool cpu","ph":"C","ts":4000,"pid":1,"tid":0,"args":{"in_use":-1e999,"reserved":-3,"cached":0}},'
  echo '{"name":"pool cpu","ph":"C","ts":1e300,"pid":1,"tid":0,"args":{"in_use":1,"reserved":2,"cached":0}},'
  echo '{"name":"epoch 1","ph":"i","s":"g","ts":1e300,"pid":1,"tid":1},'
  echo '{"name":"pool cpu","ph":"C","ts":5000,"pid":1,"tid":0,"args":{"in_use":4096,"reserved":8192,"cached":0}}'
  echo ']}'; } >"$TMP/absurd.json"
o=$(timeout 10 "$TESSERA" memplot "$TMP/absurd.json" -o "$TMP/absurd.svg" 2>"$TMP/absurd.err"); rc=$?
e=$(cat "$TMP/absurd.err")
if [ $rc -eq 0 ] && [ "$(tail -1 "$TMP/absurd.svg")" = "</svg>" ] &&
    ! grep -qi 'nan\|inf' "$TMP/absurd.svg" && contains "$e" "skipped 5 events" &&
    contains "$e" "non-finite or out-of-range" && grep -q 'peak in use 4.0 KiB, peak reserved 8.0 KiB, 2 memory counter events' "$TMP/absurd.svg"; then
    ok "a trace with 1e308, infinite, negative and far-future values: those skipped and counted, no nan or inf label"
else
    fail "absurd values in a trace" "rc=$rc" "$o" "$e" "$(grep -i 'nan\|inf\|peak' "$TMP/absurd.svg" | head -5)"
fi
# A file that is one endless line (a 1 GiB hole of zeros) is refused after its first 64 KiB,
# not read whole into memory (it once grew past 2 GB).
truncate -s 1G "$TMP/zeros.json"
o=$(timeout "$(hang_limit 30)" "$TESSERA" memplot "$TMP/zeros.json" -o "$TMP/z.svg" 2>&1); rc=$?
if [ $rc -eq 1 ] && contains "$o" "line 1 of '$TMP/zeros.json' is longer than 65536 bytes" &&
    [ ! -e "$TMP/z.svg" ]; then
    ok "memplot refuses a line longer than 64 KiB without reading it whole"
else
    fail "memplot refuses a line longer than 64 KiB" "rc=$rc" "$o"
fi
# Round ticks and the peak labelled where it happens: a pool that peaks at 300 KiB at 2 s of 4.
{ echo '{"displayTimeUnit":"ms","traceEvents":['
  echo '{"name":"pool cpu","ph":"C","ts":0,"pid":1,"tid":0,"args":{"in_use":0,"reserved":0,"cached":0}},'
  echo '{"name":"pool cpu","ph":"C","ts":2000000,"pid":1,"tid":0,"args":{"in_use":307200,"reserved":409600,"cached":0}},'
  echo '{"name":"pool cpu","ph":"C","ts":4000000,"pid":1,"tid":0,"args":{"in_use":1024,"reserved":409600,"cached":0}}'
  echo ']}'; } >"$TMP/round.json"
"$TESSERA" memplot "$TMP/round.json" -o "$TMP/round.svg" >/dev/null 2>&1; rc=$?
ticks=$(grep -o 'text-anchor="end">[^<]*<' "$TMP/round.svg" | sed 's/.*">//; s/<//' | tr '\n' '|')
secs=$(grep -o 'text-anchor="middle">[^<]*<' "$TMP/round.svg" | sed 's/.*">//; s/<//' | tr '\n' '|')
if [ $rc -eq 0 ] && [ "$ticks" = "0 B|100 KiB|200 KiB|300 KiB|400 KiB|" ] &&
    [ "$secs" = "0 s|1 s|2 s|3 s|4 s|" ] && grep -q '>peak 300.0 KiB at 2 s<' "$TMP/round.svg"; then
    ok "memplot: round ticks on both axes, the peak labelled at its time"
else
    fail "memplot ticks and peak" "rc=$rc" "ticks: $ticks" "seconds: $secs"
fi
# Memory by role: a trace's "roles POOL" counters are drawn as stacked bands with a legend.
{ echo '{"displayTimeUnit":"ms","traceEvents":['
  echo '{"name":"pool cpu","ph":"C","ts":0,"pid":1,"tid":0,"args":{"in_use":0,"reserved":0,"cached":0}},'
  echo '{"name":"roles cpu","ph":"C","ts":10,"pid":1,"tid":0,"args":{"parameter":1000,"gradient":0,"optimizer":2000,"activation":0,"data":5000,"other":0}},'
  echo '{"name":"pool cpu","ph":"C","ts":1000000,"pid":1,"tid":0,"args":{"in_use":9000,"reserved":9000,"cached":0}}'
  echo ']}'; } >"$TMP/roles.json"
"$TESSERA" memplot "$TMP/roles.json" -o "$TMP/roles.svg" >/dev/null 2>&1; rc=$?
if [ $rc -eq 0 ] && [ "$(grep -c '<polygon' "$TMP/roles.svg")" -eq 6 ] &&
    grep -q '>optimizer</text>' "$TMP/roles.svg" && grep -q '>activation</text>' "$TMP/roles.svg"; then
    ok "memplot draws memory by role (parameter, gradient, optimizer, data, activation, other) as bands"
else
    fail "memplot roles" "rc=$rc" "$(grep -c '<polygon' "$TMP/roles.svg")"
fi
# --steps A:B: a GPT run's trace marks its steps; drawn from step 5 to 6 only (the time axis
# starts past 0); steps the trace does not mark are named.
printf 'the quick brown fox jumps over the lazy dog. %.0s' $(seq 100) >"$TMP/t.txt"
"$TESSERA" train --model gpt --text "$TMP/t.txt" --context 16 --layers 1 --heads 2 --embd 16 \
    --steps 10 --eval-every 10 --eval-batches 1 --memtrace "$TMP/g.json" >/dev/null 2>&1
"$TESSERA" memplot "$TMP/g.json" --steps 5:6 -o "$TMP/g.svg" >/dev/null 2>&1; rc=$?
first=$(grep -o 'text-anchor="middle">[^<]*<' "$TMP/g.svg" | head -1 | sed 's/.*">//; s/<//')
o2=$("$TESSERA" memplot "$TMP/g.json" --steps 50:60 -o "$TMP/g2.svg" 2>&1); rc2=$?
o3=$("$TESSERA" memplot "$TMP/g.json" --steps 6:5 2>&1); rc3=$?
if [ $rc -eq 0 ] && [ -n "$first" ] && [ "$first" != "0 s" ] && [ $rc2 -eq 1 ] &&
    contains "$o2" "marks steps 1 to 10" && [ ! -e "$TMP/g2.svg" ] && [ $rc3 -eq 2 ]; then
    ok "memplot --steps 5:6 zooms on two steps (time axis from $first); unmarked steps and 6:5 refused"
else
    fail "memplot --steps" "rc=$rc first=$first" "rc2=$rc2 $o2" "rc3=$rc3 $o3"
fi
# A pool name longer than the picture keeps is still one pool.
long=$(printf 'p%.0s' $(seq 100))
{ echo '{"displayTimeUnit":"ms","traceEvents":['
  for k in 1 2 3 4 5 6 7 8 9 10; do
    echo "{\"name\":\"pool $long\",\"ph\":\"C\",\"ts\":${k}000,\"pid\":1,\"tid\":0,\"args\":{\"in_use\":$k,\"reserved\":20,\"cached\":0}},"
  done
  echo '{"name":"x","ph":"i","s":"g","ts":1,"pid":1,"tid":1}'
  echo ']}'; } >"$TMP/long.json"
o=$("$TESSERA" memplot "$TMP/long.json" -o "$TMP/long.svg" 2>&1); rc=$?
if [ $rc -eq 0 ] && contains "$o" "1 pools" && ! contains "$o" "more than"; then
    ok "memplot: a 100-character pool name is one pool"
else
    fail "memplot long pool name" "rc=$rc" "$o"
fi
finish
