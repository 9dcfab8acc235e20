#!/bin/sh
# tests/cli/test-bench-pool.sh: `tessera bench pool` runs both mixes, its JSON parses and
# carries the documented figures, the training mix reaches a steady state without raw
# allocations, and misuse is a clear error. (Smoke test: the timings are not judged here.)
# make check: start 4 (the slowest first: tools/gen-lists.sh)
. "${TS_SRCDIR:-.}/tests/cli/lib.sh"
plan 4

# Under ASan each malloc of up to 64 MiB (the baseline's) costs milliseconds: fewer pairs
# there, still many past the warm-up (the steady state shows within a few hundred).
pairs=3000 rpairs=2000
[ "${TS_SANITIZERS:-no}" = yes ] && pairs=600 rpairs=400
out=$("$TESSERA" bench pool --pairs $pairs --json 2>&1)
if echo "$out" | "$JSON_CHECK" expandable_segments training.pool_ns_per_pair \
    training.raw_allocs_per_1000_pairs training.reserved_over_peak_in_use \
    training.ideal_reserved_over_peak_in_use random.malloc_ns_per_pair \
    random.reserved_over_peak_in_use >"$TMP/fields" 2>&1; then
    ok "bench pool --json parses and has both mixes' figures"
else
    fail "bench pool --json parses and has both mixes' figures" "$out"
fi

# After the first steps the training mix asks the raw allocator for nothing, and one
# expandable range keeps reserved within a few granules of the peak in use.
raw=$(sed -n '3s/.*=//p' "$TMP/fields")
ratio=$(sed -n '4s/.*=//p' "$TMP/fields")
if [ "$raw" = 0 ] && awk "BEGIN { exit !($ratio < 1.1) }"; then
    ok "training mix: 0 raw allocations per 1000 pairs, reserved/peak in use $ratio"
else
    fail "training mix: steady state and packing" "raw per 1000: $raw, ratio: $ratio" "$out"
fi

out=$("$TESSERA" bench pool --pairs $rpairs --mix random --no-expandable 2>&1)
if contains "$out" "random mix" && contains "$out" "ideal non-moving allocator" &&
    ! contains "$out" "training mix"; then
    ok "--mix random --no-expandable prints the random mix only"
else
    fail "--mix random --no-expandable prints the random mix only" "$out"
fi

out=$("$TESSERA" bench pool --mix nonsense 2>&1)
rc=$?
if [ $rc -eq 2 ] && contains "$out" "bad option '--mix'" && contains "$out" "usage:"; then
    ok "a bad --mix exits 2 with the usage"
else
    fail "a bad --mix exits 2 with the usage" "rc $rc" "$out"
fi
finish
