#!/bin/sh
# tests/cli/cuda-memcheck.sh: the cuda conformance test (tests/plugins/test-cuda) under
# compute-sanitizer's memcheck tool (out-of-bounds and misaligned device accesses, leaks of
# device memory, CUDA API errors). `make check-cuda-memcheck` runs it from the build tree.
# Exits 77 (SKIP) when the plugin is not built, no GPU is present, or compute-sanitizer
# cannot be found ($COMPUTE_SANITIZER, PATH, $CUDA_HOME/bin, $CUDA_HOME/compute-sanitizer).
: "${TS_BUILDDIR:=.}"
if [ ! -f "$TS_BUILDDIR/plugins/cuda/.libs/cuda.so" ]; then
    echo "SKIP: the cuda plugin is not built"; exit 77
fi
info=$("$TS_BUILDDIR/tools/tessera" info 2>&1)
case "$info" in
*"cuda: 0 devices"*|*"cuda: not loaded"*)
    echo "SKIP: no GPU: $(echo "$info" | grep '^  cuda:')"; exit 77 ;;
esac
cs=${COMPUTE_SANITIZER:-}
if [ -z "$cs" ]; then
    for c in "$(command -v compute-sanitizer 2>/dev/null)" "${CUDA_HOME:-/usr/local/cuda}/bin/compute-sanitizer" \
        "${CUDA_HOME:-/usr/local/cuda}/compute-sanitizer/compute-sanitizer"; do
        if [ -n "$c" ] && [ -x "$c" ]; then cs=$c; break; fi
    done
fi
if [ -z "$cs" ]; then
    echo "SKIP: compute-sanitizer not found (install NVIDIA's cuda-sanitizer package or set COMPUTE_SANITIZER)"
    exit 77
fi
# The test forks one child per case: follow them all. The libtool wrapper runs the real
# binary with the uninstalled libtessera.
exec "$TS_BUILDDIR/libtool" --mode=execute "$cs" --tool memcheck --leak-check full \
    --target-processes all --error-exitcode 1 "$TS_BUILDDIR/tests/plugins/test-cuda" "$@"
