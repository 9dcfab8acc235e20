#!/bin/sh
# tests/cli/test-exports.sh: libtessera exports its public API and nothing else: every
# defined dynamic symbol is a ts_ name declared in an installed header (no ts__ internal, no
# symbol of a library it links), as test-plugin-check.sh checks the plugins' exports; and it
# carries neither the build directory nor the source directory (it finds the build tree's
# plugins from where it runs, not from a compiled-in path). The tessera executable links no
# backend library and interposes no allocator: those live in the benchmark module that only
# `tessera bench` preloads.
. "${TS_SRCDIR:-.}/tests/cli/lib.sh"
plan 4

lib="$TS_BUILDDIR/core/.libs/libtessera.so"
if ! command -v nm >/dev/null 2>&1 || [ ! -f "$lib" ]; then
    skip "libtessera exports only declared ts_ names" "nm or the shared library is missing"
    skip "libtessera exports no internal symbol" "nm or the shared library is missing"
    skip "libtessera carries no build or source directory" "nm or the shared library is missing"
    skip "the tessera executable links no BLAS and exports no malloc" "nm is missing"
    finish
    exit 0
fi
syms=$(nm -D --defined-only "$lib" | awk '{print $NF}' |
    grep -v -e '^_init$' -e '^_fini$' -e '^_edata$' -e '^_end$' -e '^__bss_start$')
bad=""
n=0
for s in $syms; do
    n=$((n + 1))
    case "$s" in
    ts__*) bad="$bad $s(internal)" ;;
    ts_*) grep -qw "$s" "$TS_SRCDIR"/include/tessera/*.h || bad="$bad $s(undeclared)" ;;
    *) bad="$bad $s(foreign)" ;;
    esac
done
if [ "$n" -gt 100 ] && [ -z "$bad" ]; then
    ok "libtessera exports only declared ts_ names ($n symbols)"
else
    fail "libtessera exports only declared ts_ names" "$n symbols" "$bad"
fi
if echo "$syms" | grep -q -e '^ts__pool_api$' -e '^ts__philox4x32_10$'; then
    fail "libtessera exports no internal symbol" "$(echo "$syms" | grep '^ts__')"
else
    ok "libtessera exports no internal symbol (the pool component, the Philox block)"
fi
build=$(cd "$TS_BUILDDIR" && pwd -P)
src=$(cd "$TS_SRCDIR" && pwd -P)
if ! command -v strings >/dev/null 2>&1; then
    skip "libtessera carries no build or source directory" "strings is not installed"
elif [ "${TS_SANITIZERS:-no}" = yes ]; then
    skip "libtessera carries no build or source directory" \
        "sanitizer build: ASan and UBSan record source paths for their reports"
elif strings -a "$lib" | grep -v "^${TS_PREFIX:-/nonexistent}" | grep -q -e "$build" -e "$src/"; then
    # (the install directories, compiled in, may lie under the build tree: distcheck's do)
    fail "libtessera carries no build or source directory" \
        "$(strings -a "$lib" | grep -v "^${TS_PREFIX:-/nonexistent}" | grep -e "$build" -e "$src/" | head -5)"
else
    ok "libtessera carries no build or source directory ($build, $src)"
fi
exe="$TS_BUILDDIR/tools/.libs/tessera"
[ -f "$exe" ] || exe="$TS_BUILDDIR/tools/.libs/lt-tessera"
needed=$(readelf -d "$exe" 2>/dev/null | grep NEEDED)
exported=$(nm -D --defined-only "$exe" 2>/dev/null | awk '{print $NF}' |
    grep -x -e malloc -e calloc -e realloc -e posix_memalign -e aligned_alloc -e pthread_create)
if [ -n "$needed" ] && ! echo "$needed" | grep -qi -e blas -e dnnl -e cuda && [ -z "$exported" ] &&
    [ -f "$TS_BUILDDIR/tools/.libs/tessera-bench.so" ]; then
    ok "the tessera executable links no BLAS and exports no malloc (the benchmark module does)"
else
    fail "the tessera executable links no BLAS and exports no malloc" "$needed" "$exported"
fi
finish
