#!/bin/sh
# tests/cli/test-dist.sh: data parallelism over the MPI communication plugin, 2 ranks on this
# machine (`mpirun -np 2`, loopback). tests/dist/dist-check runs the collectives, gradient
# averaging (against the global batch's gradient in float64), 30 SGD and 30 AdamW steps
# against one process, and the refusal of a rank with another model; the same program alone
# is a world of one. Skips without Open MPI (mpirun and the comm_mpi plugin).
. "${TS_SRCDIR:-.}/tests/cli/lib.sh"
CHECK="$TS_BUILDDIR/tests/dist/dist-check"
MPIRUN=$(command -v mpirun)
if [ -z "$MPIRUN" ] || [ ! -f "$TS_BUILDDIR/plugins/comm_mpi/.libs/comm_mpi.so" ]; then
    echo "1..0 # SKIP no Open MPI (Debian packages openmpi-bin, libopenmpi-dev)"
    exit 77
fi
plan 6
# Open MPI's own allocations are not ours to report (LeakSanitizer at exit).
if [ "${TS_SANITIZERS:-no}" = yes ]; then
    ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
    export ASAN_OPTIONS
fi
# Open MPI refuses root without these; tests set them, the product never does.
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_ALLOW_RUN_AS_ROOT OMPI_ALLOW_RUN_AS_ROOT_CONFIRM
# Loopback only (no network probing), shared memory without ptrace-based single copy (not
# allowed in containers), and no more ranks than slots required.
MPI="$MPIRUN -np 2 --oversubscribe --mca btl self,vader --mca btl_vader_single_copy_mechanism none --mca pml ob1"

run2() { # MODE: every rank's output, rank 0's TAP lines and the exit status
    timeout 120 $MPI "$CHECK" "$1" >"$TMP/$1.out" 2>"$TMP/$1.err"
}
for mode in collectives ddp steps mismatch; do
    if run2 $mode && ! grep -q "^not ok" "$TMP/$mode.out" && grep -q "^1\.\." "$TMP/$mode.out"; then
        n=$(grep -c "^ok" "$TMP/$mode.out")
        notes=$(grep "^# " "$TMP/$mode.out" | sed 's/^# //' | tr '\n' ';')
        ok "mpirun -np 2 dist-check $mode: $n checks on 2 ranks${notes:+ ($notes)}"
    else
        fail "mpirun -np 2 dist-check $mode" "$(cat "$TMP/$mode.out")" "$(tail -20 "$TMP/$mode.err")"
    fi
done
# the same program alone: a world of one, no MPI loaded
out=$("$CHECK" collectives 2>&1)
rc=$?
if [ $rc -eq 0 ] && contains "$out" "ok 1 - rank and size" && contains "$out" "1..8" &&
    ! contains "$out" "not ok"; then
    ok "alone: a world of one rank, every collective a no-op"
else
    fail "alone: a world of one rank" "$out"
fi
out=$("$CHECK" steps 2>&1)
rc=$?
if [ $rc -eq 0 ] && contains "$out" "1..2" && ! contains "$out" "not ok"; then
    ok "alone: data-parallel steps on one rank equal plain steps"
else
    fail "alone: data-parallel steps on one rank equal plain steps" "$out"
fi
finish
