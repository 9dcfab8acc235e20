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
# hang_limit SECONDS: a limit that guards against a hang, not one that tests speed, scaled as
# tests/tap.c scales its limits: SECONDS times $TS_TEST_TIMEOUT_SCALE (default 1), times twice
# the load average per CPU (at most 10) when the machine is busy (load at or above the CPU
# count). For timeout(1): timeout "$(hang_limit 20)" "$TESSERA" ...
hang_limit() {
    awk -v s="$1" -v k="${TS_TEST_TIMEOUT_SCALE:-1}" -v n="$(getconf _NPROCESSORS_ONLN 2>/dev/null)" \
        'BEGIN {
            if (!(k + 0 > 0)) k = 1
            if (!(n + 0 > 0)) n = 1
            l = 0
            if ((getline line < "/proc/loadavg") > 0) { split(line, f, " "); l = f[1] / n }
            x = l >= 1 ? 2 * l : 1
            if (x > 10) x = 10
            printf "%d\n", s * k * x + 0.999
        }'
}
# contains HAYSTACK NEEDLE
contains() { case "$1" in *"$2"*) return 0;; *) return 1;; esac; }
finish() { exit $TAP_FAILED; }
