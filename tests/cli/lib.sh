# tests/cli/lib.sh: a TAP helper for shell tests of the tessera CLI. Source it, call plan N,
# then ok/fail/skip; each check prints one TAP line. Uses the uninstalled binary.
: "${TS_BUILDDIR:=.}"
TESSERA="$TS_BUILDDIR/tools/tessera"
JSON_CHECK="$TS_BUILDDIR/tests/cli/json-check"
FIXTURES="$TS_BUILDDIR/tests/fixtures/.libs"
TAP_N=0
TAP_FAILED=0
TMP=$(mktemp -d "${TMPDIR:-/tmp}/tessera-cli-XXXXXX")
trap 'rm -rf "$TMP"' EXIT

plan() { echo "1..$1"; }
ok() { TAP_N=$((TAP_N + 1)); echo "ok $TAP_N - $1"; }
# fail NAME DETAIL...: every line of every detail as a TAP comment (a detail may hold another
# program's TAP output, which must not be read as this test's lines).
fail() {
    TAP_N=$((TAP_N + 1)); TAP_FAILED=1; echo "not ok $TAP_N - $1"; shift
    for l in "$@"; do printf '%s\n' "$l" | sed 's/^/# /'; done
}
skip() { TAP_N=$((TAP_N + 1)); echo "ok $TAP_N - $1 # SKIP $2"; }
# check NAME COMMAND...: ok if the command succeeds, else fail with its output.
check() {
    name=$1; shift
    if out=$("$@" 2>&1); then ok "$name"; else fail "$name" "$(echo "$out" | tail -5)"; fi
}
# contains HAYSTACK NEEDLE
contains() { case "$1" in *"$2"*) return 0;; *) return 1;; esac; }
finish() { exit $TAP_FAILED; }
