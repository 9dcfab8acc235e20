#!/bin/sh
# tests/cli/test-help.sh: every command and benchmark the usage text lists has help that
# `tessera help ...` prints (its own usage line, exit 0), the usage text is complete, and an
# unknown command or benchmark exits 2 with a message.
. "${TS_SRCDIR:-.}/tests/cli/lib.sh"
plan 8

usage=$("$TESSERA" help)
cmds=$(echo "$usage" | sed -n '/^commands:/,/^$/p' | awk 'NF && $1 != "commands:" {print $1}')
benches=$(echo "$usage" | sed -n '/^benchmarks:/,/^$/p' | awk '$1 == "bench" {print $2}')
if [ "$(echo $cmds)" = "info train eval generate inspect convert memplot plugin-check bench help" ] &&
    [ "$(echo $benches)" = "pool ops autograd compare train cuda gpt dist" ]; then
    ok "the usage lists every command and benchmark"
else
    fail "the usage lists every command and benchmark" "commands: $cmds" "benchmarks: $benches"
fi

bad=""
for c in $cmds; do
    out=$("$TESSERA" help "$c" 2>&1) || bad="$bad $c(rc)"
    echo "$out" | grep -q "^usage: tessera $c" || bad="$bad $c(no usage line)"
done
if [ -z "$bad" ]; then
    ok "tessera help COMMAND prints each command's own usage"
else
    fail "tessera help COMMAND prints each command's own usage" "$bad"
fi

bad=""
for b in $benches; do
    out=$("$TESSERA" help bench "$b" 2>&1) || bad="$bad $b(rc)"
    echo "$out" | grep -q "^usage: tessera bench $b" || bad="$bad $b(no usage line)"
    out2=$("$TESSERA" bench "$b" --help 2>&1) || bad="$bad $b(--help rc)"
    [ "$out" = "$out2" ] || bad="$bad $b(help differs from --help)"
done
if [ -z "$bad" ] && "$TESSERA" help bench | grep -q "^usage: tessera bench NAME"; then
    ok "tessera help bench [NAME] prints the benchmarks' usage and each one's own"
else
    fail "tessera help bench [NAME] prints each benchmark's usage" "$bad"
fi

out=$("$TESSERA" help nosuch 2>&1); rc1=$?
out2=$("$TESSERA" bench nosuch 2>&1); rc2=$?
out3=$("$TESSERA" nosuch 2>&1); rc3=$?
if [ $rc1 -eq 2 ] && [ $rc2 -eq 2 ] && [ $rc3 -eq 2 ] && contains "$out" "unknown command 'nosuch'" &&
    contains "$out2" "unknown benchmark 'nosuch'" && contains "$out3" "unknown command 'nosuch'"; then
    ok "an unknown command or benchmark exits 2 and names it"
else
    fail "an unknown command or benchmark exits 2 and names it" "$rc1 $rc2 $rc3" "$out" "$out2" "$out3"
fi
# The man page keeps up with the help: every command, benchmark and environment variable
# `tessera --help` lists is in man/tessera.1, and it renders without a warning (when groff
# is here).
help=$("$TESSERA" --help)
man="$TS_SRCDIR/man/tessera.1"
missing=""
for w in $(echo "$help" | sed -n 's/^  \([a-z][a-z-]*\) .*/\1/p') \
    $(echo "$help" | sed -n 's/^  bench \([a-z]*\) .*/\1/p') \
    $(echo "$help" | grep -o 'TESSERA_[A-Z_]*'); do
    grep -q -- "$(echo "$w" | sed 's/-/\\\\-/g')" "$man" || missing="$missing $w"
done
warn=""
if command -v groff >/dev/null 2>&1; then
    warn=$(groff -man -Tutf8 -ww -z "$man" 2>&1)
fi
if [ -z "$missing" ] && [ -z "$warn" ]; then
    ok "man/tessera.1 has every command, benchmark and environment variable of --help"
else
    fail "man/tessera.1 keeps up with --help" "missing:$missing" "$warn"
fi
# A misspelt command gets the nearest one; --name=value is --name value for every command.
o1=$("$TESSERA" trian 2>&1); r1=$?
o2=$("$TESSERA" xyzzy 2>&1); r2=$?
o3=$("$TESSERA" train --epochs=0 2>&1); r3=$?
o4=$("$TESSERA" help generat 2>&1); r4=$?
if [ $r1 -eq 2 ] && contains "$o1" "unknown command 'trian' (did you mean 'train'?)" &&
    [ $r2 -eq 2 ] && ! contains "$o2" "did you mean" && [ $r3 -eq 2 ] &&
    contains "$o3" "--epochs '0' is out of range" && [ $r4 -eq 2 ] &&
    contains "$o4" "did you mean 'generate'?"; then
    ok "a misspelt command gets 'did you mean'; --epochs=0 is read as --epochs 0"
else
    fail "did you mean, --name=value" "$r1 $o1" "$r2 $o2" "$r3 $o3" "$r4 $o4"
fi
# Options from a table: a misspelt option of the GPT trainer gets the nearest flag, a value
# out of the row's range or not in on|off is named, and --name=value reads as --name value.
o1=$("$TESSERA" train --model gpt --stpes 3 2>&1); r1=$?
o2=$("$TESSERA" train --model gpt --checkpoint-activations=maybe 2>&1); r2=$?
o3=$("$TESSERA" train --model gpt --accumulate=0 2>&1); r3=$?
o4=$("$TESSERA" train --model gpt --zzzzzz 2>&1); r4=$?
o5=$("$TESSERA" train --epoch 3 2>&1); r5=$?
o6=$("$TESSERA" train --decay some 2>&1); r6=$?
o7=$("$TESSERA" train --hiden 32 2>&1); r7=$?
if [ $r1 -eq 2 ] && contains "$o1" "unexpected argument '--stpes' for --model gpt (did you mean '--steps'?)" &&
    [ $r2 -eq 2 ] && contains "$o2" "--checkpoint-activations takes on or off" &&
    [ $r3 -eq 2 ] && contains "$o3" "--accumulate '0' is out of range: expected 1..4096" &&
    [ $r4 -eq 2 ] && ! contains "$o4" "did you mean" &&
    [ $r5 -eq 2 ] && contains "$o5" "unexpected argument '--epoch' (did you mean '--epochs'?)" &&
    [ $r6 -eq 2 ] && contains "$o6" "--decay takes all or matrices" &&
    [ $r7 -eq 2 ] && contains "$o7" "did you mean '--hidden'?"; then
    ok "train (gpt and image models): a misspelt option gets 'did you mean'; values checked by the option's row"
else
    fail "options from the table" "$r1 $o1" "$r2 $o2" "$r3 $o3" "$r4 $o4" "$r5 $o5" "$r6 $o6" "$r7 $o7"
fi
# train's help comes from its option tables: every flag of the synopsis has its line, the
# parser takes each one (given a value and then an unknown argument, the error names the
# unknown one or the value, never the flag), and no line is wider than 80 columns.
bad=""
for model in "" "--model gpt"; do
    h=$("$TESSERA" train $model --help) || bad="$bad [$model: rc]"
    flags=$(echo "$h" | sed -n '/^usage:/,/^$/p' | grep -o '\[--[a-z-]*' | tr -d '[')
    [ $(echo "$flags" | wc -w) -ge 30 ] || bad="$bad [$model: only $(echo $flags) in the synopsis]"
    for f in $flags; do
        echo "$h" | grep -q -- "^  $f " || bad="$bad [$model $f: no line]"
        o=$("$TESSERA" train $model $f 1 --zzzz 2>&1); r=$?
        [ $r -ne 0 ] && ! contains "$o" "unexpected argument '$f'" ||
            bad="$bad [$model $f: rc $r: $o]"
    done
    wide=$(echo "$h" | awk 'length($0) > 80')
    [ -z "$wide" ] || bad="$bad [$model: wider than 80: $wide]"
done
if [ -z "$bad" ]; then
    ok "train --help (image models and gpt) lists every option of the tables, each parsed"
else
    fail "train --help from the tables" "$bad"
fi
finish
