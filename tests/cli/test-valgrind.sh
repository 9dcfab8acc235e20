#!/bin/sh
# tests/cli/test-valgrind.sh: `tessera info` loads and unloads every plugin found; under
# valgrind memcheck that must leave no error and no definitely/indirectly lost byte.
. "${TS_SRCDIR:-.}/tests/cli/lib.sh"
plan 1
if [ "${TS_SANITIZERS:-no}" = yes ]; then
    skip "tessera info is valgrind-clean" "sanitizer build: ASan and valgrind do not mix"
    finish
fi
if ! command -v valgrind >/dev/null 2>&1; then
    skip "tessera info is valgrind-clean" "valgrind is not installed"
    finish
fi
"$TS_BUILDDIR/libtool" --mode=execute valgrind -q --leak-check=full \
    --errors-for-leak-kinds=definite,indirect --error-exitcode=9 \
    --suppressions="${TS_SRCDIR:-.}/tests/valgrind.supp" \
    "$TESSERA" info >/dev/null 2>"$TMP/vg.log"
rc=$?
if [ $rc -eq 0 ]; then
    ok "tessera info is valgrind-clean"
else
    fail "tessera info is valgrind-clean" "exit $rc" "$(tail -30 "$TMP/vg.log")"
fi
finish
