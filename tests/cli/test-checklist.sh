#!/bin/sh
# tests/cli/test-checklist.sh: docs/architecture.md's "Adding an op" checklist stays true: every
# file it names exists, and the functions it names as its examples are what it says they are
# (SiLU a row of the unary table, RMSNorm a public op, layer norm a row of the op table).
. "${TS_SRCDIR:-.}/tests/cli/lib.sh"
plan 2
DOC="$TS_SRCDIR/docs/architecture.md"
section=$(sed -n '/^## Adding an op/,/^## /p' "$DOC")
missing=""
n=0
for f in $(printf '%s\n' "$section" | grep -o '`[a-z][a-z_/.-]*\.[a-z]*`' | tr -d '`' | sort -u); do
    case "$f" in */*) ;; *) continue ;; esac
    n=$((n + 1))
    [ -e "$TS_SRCDIR/$f" ] || missing="$missing $f"
done
if [ "$n" -ge 15 ] && [ -z "$missing" ]; then
    ok "the checklist names $n files, and every one exists"
else
    fail "the checklist names files that do not exist (or too few: $n)" "missing:$missing"
fi
H="$TS_SRCDIR/include/tessera"
if grep -q 'X(SILU, [0-9]*, "silu", [0-9]*)' "$H/plugin.h" &&
    grep -q 'X(LAYER_NORM, [0-9]*, "layer_norm", [0-9]*)' "$H/plugin.h" &&
    grep -q '^ts_status ts_rms_norm(' "$H/ops.h" && grep -q 'ts_s_rms_norm(' "$H/scope.h" &&
    grep -q 'case TS_UNARY_SILU' "$TS_SRCDIR/tests/plugins/kt.c"; then
    ok "the checklist's examples are where it says: SiLU in the unary table and kt_unary_ref, layer norm in the op table, ts_rms_norm and ts_s_rms_norm"
else
    fail "the checklist's examples moved: update docs/architecture.md"
fi
finish
