#!/bin/sh
# tests/cli/test-nccl.sh: the NCCL communication plugin. Everywhere it is built: it loads and
# `tessera info` lists it; a rank without a GPU is refused with the reason, not a hang. With a
# GPU: one rank joins and its collectives run on the cuda device; with two GPUs or more,
# tests/dist/dist-check's collectives, gradient averaging and steps on one rank per GPU
# (NCCL takes one GPU a rank, so two ranks on one GPU are not a configuration it runs). The
# GPU checks SKIP without GPUs, as the cuda plugin's do. The host's device-buffer paths
# themselves run on every machine in test-dist.sh, through comm_devtest.
. "${TS_SRCDIR:-.}/tests/cli/lib.sh"
plan 4
NCCL_SO="$TS_BUILDDIR/plugins/comm_nccl/.libs/comm_nccl.so"
MPIRUN=$(command -v mpirun)
if [ ! -f "$NCCL_SO" ] || [ -z "$MPIRUN" ]; then
    for t in "comm_nccl loads" "a rank without a GPU is refused" "one rank on a GPU" \
        "dist-check on one rank per GPU"; do
        skip "$t" "comm_nccl is not built (it needs CUDA, MPI and NCCL at configure time)"
    done
    finish
fi
if [ "${TS_SANITIZERS:-no}" = yes ]; then
    ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
    export ASAN_OPTIONS
fi
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_ALLOW_RUN_AS_ROOT OMPI_ALLOW_RUN_AS_ROOT_CONFIRM
MPI="$MPIRUN --oversubscribe --mca btl self,vader --mca btl_vader_single_copy_mechanism none --mca pml ob1"
CHECK="$TS_BUILDDIR/tests/dist/dist-check"

out=$("$TESSERA" info 2>&1)
if echo "$out" | grep -q '^  nccl: NCCL [0-9]'; then
    ok "comm_nccl loads: $(echo "$out" | grep '^  nccl:')"
else
    fail "comm_nccl loads and tessera info lists it" "$out"
fi
gpus=$(echo "$out" | sed -n 's/^  cuda: \([0-9][0-9]*\) device.*/\1/p')
gpus=${gpus:-0}

printf '[core]\ndevice = cuda\n[dist]\nbackend = nccl\n' >"$TMP/nccl.ini"
if [ "$gpus" -eq 0 ]; then
    out=$(TESSERA_CONFIG="$TMP/nccl.ini" timeout "$(hang_limit 60)" $MPI -np 1 "$CHECK" collectives 2>&1)
    rc=$?
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && contains "$out" "this rank has no usable GPU"; then
        ok "a rank without a GPU is refused with the reason: $(echo "$out" | grep -m1 'no usable GPU' | cut -c1-200)"
    else
        fail "a rank without a GPU is refused with the reason" "rc=$rc" "$out"
    fi
    skip "one rank on a GPU" "no GPU here"
    skip "dist-check on one rank per GPU" "no GPU here"
    finish
fi
skip "a rank without a GPU is refused" "this machine has $gpus GPU(s)"
out=$(TESSERA_CONFIG="$TMP/nccl.ini" timeout "$(hang_limit 120)" $MPI -np 1 "$CHECK" collectives 2>&1)
rc=$?
if [ $rc -eq 0 ] && contains "$out" "'nccl' takes device buffers of 'cuda'" && ! contains "$out" "not ok"; then
    ok "one rank joins NCCL on the cuda device"
else
    fail "one rank joins NCCL on the cuda device" "rc=$rc" "$out"
fi
if [ "$gpus" -lt 2 ]; then
    skip "dist-check on one rank per GPU" "$gpus GPU: NCCL needs one GPU a rank for 2 ranks"
    finish
fi
n=$gpus
[ "$n" -gt 4 ] && n=4
bad=""
for mode in collectives ddp steps mismatch; do
    TESSERA_CONFIG="$TMP/nccl.ini" timeout "$(hang_limit 300)" $MPI -np $n "$CHECK" $mode >"$TMP/$mode.out" 2>"$TMP/$mode.err"
    rc=$?
    if [ $rc -ne 0 ] || grep -q "^not ok" "$TMP/$mode.out" || ! grep -q "^1\.\." "$TMP/$mode.out"; then
        bad="$bad $mode(rc=$rc)"
    fi
done
if [ -z "$bad" ]; then
    ok "dist-check collectives, ddp, steps and mismatch on $n ranks over NCCL, one GPU each"
else
    fail "dist-check over NCCL on $n ranks:$bad" "$(cat "$TMP"/*.out)" "$(tail -20 "$TMP"/*.err)"
fi
finish
