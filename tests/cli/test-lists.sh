#!/bin/sh
# tests/cli/test-lists.sh: lists.am, the file lists Makefile.am includes, is what
# tools/gen-lists.sh makes of the tree now: a header, guide, test or fixture added without
# running it (so never built, installed or run) fails here, naming the difference.
. "${TS_SRCDIR:-.}/tests/cli/lib.sh"
plan 1
if out=$(sh "$TS_SRCDIR/tools/gen-lists.sh" -n "$TS_SRCDIR" | diff "$TS_SRCDIR/lists.am" - 2>&1); then
    ok "lists.am matches the tree's headers, guides, tests and fixtures"
else
    fail "lists.am is stale: run tools/gen-lists.sh, then autoreconf" "$out"
fi
finish
