#!/bin/sh
# tests/cli/test-helgrind.sh: the pool's multi-threaded stress tests (4 threads allocating,
# stamping, checking and freeing through one pool; with plain segments and with the
# expandable segment) under valgrind's helgrind: no data race, no lock-order violation.
# Each forked test process exits 9 if helgrind reports anything, which fails its TAP line.
. "${TS_SRCDIR:-.}/tests/cli/lib.sh"
plan 1
name="pool stress tests are helgrind-clean"
if [ "${TS_SANITIZERS:-no}" = yes ]; then
    skip "$name" "sanitizer build: ASan and valgrind do not mix"
    finish
fi
if ! command -v valgrind >/dev/null 2>&1; then
    skip "$name" "valgrind is not installed"
    finish
fi
TS_POOL_STRESS_OPS=2000 "$TS_BUILDDIR/libtool" --mode=execute valgrind --tool=helgrind -q \
    --error-exitcode=9 "$TS_BUILDDIR/tests/unit/test-pool" test_threads_stress \
    test_vm_threads_stress >"$TMP/out" 2>"$TMP/hg.log"
rc=$?
if [ $rc -eq 0 ] && [ "$(grep -c '^ok' "$TMP/out")" -eq 2 ]; then
    ok "$name"
else
    fail "$name" "exit $rc" "$(cat "$TMP/out")" "$(tail -30 "$TMP/hg.log")"
fi
finish
