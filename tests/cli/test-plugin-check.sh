#!/bin/sh
# tests/cli/test-plugin-check.sh: `tessera plugin-check` passes every shipped plugin (cuda only
# where it is built and a GPU answers), fails a plugin with a wrong kernel or a foreign ABI
# with the reason on a FAIL line, fails a plugin exporting more than its entry point, and
# every shipped plugin exports nothing but its entry point; a plugin whose symbol table
# lies at a misaligned offset is read without undefined behaviour.
# The badkernel fixture fails exactly one check: its COPY ignores strides (its memory, under
# the host's pool like every plugin's, passes; it reports no memory total, so the
# memory_fraction check skips). The minimal fixture, the smallest complete ABI 2.0 plugin,
# passes every check including training, in under 100 lines of code.
# The sharedscratch fixture's COPY is right alone but stages every call through one static
# buffer: the concurrency check (several threads running kernels at once) must fail it, and
# every shipped plugin must pass that check.
. "${TS_SRCDIR:-.}/tests/cli/lib.sh"
plan 17

# check_plugin NAME: plugin-check passes it, or SKIP if it is not built.
check_plugin() {
    so="$TS_BUILDDIR/plugins/$1/.libs/$1.so"
    if [ ! -f "$so" ]; then
        skip "plugin-check $1" "the $1 plugin is not built"
        return
    fi
    # LeakSanitizer's exit-time tracer crashes once oneDNN's primitives have run their threads
    # (see tests/plugins/test-onednn.c): leak-check every plugin but that one.
    lsan=""
    [ "${TS_SANITIZERS:-no}" = yes ] && [ "$1" = cpu_onednn ] && lsan="detect_leaks=0"
    out=$(ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}$lsan" "$TESSERA" plugin-check "$1" 2>&1)
    rc=$?
    if [ $rc -eq 0 ] && contains "$out" "plugin-check $1:" && contains "$out" " 0 failed" &&
        contains "$out" "PASS  threads: concurrent run calls" && ! contains "$out" "FAIL"; then
        ok "plugin-check $1: $(echo "$out" | tail -1)"
    else
        fail "plugin-check $1" "rc=$rc" "$(echo "$out" | grep -v '^PASS' | head -20)"
    fi
}
check_plugin cpu_blas
check_plugin cpu_onednn
if [ -f "$TS_BUILDDIR/plugins/cuda/.libs/cuda.so" ] && command -v nvidia-smi >/dev/null 2>&1 &&
    nvidia-smi -L >/dev/null 2>&1; then
    check_plugin cuda
else
    skip "plugin-check cuda" "no cuda plugin built or no GPU"
fi

out=$("$TESSERA" plugin-check --quick "$FIXTURES/badkernel.so" 2>&1)
rc=$?
if [ $rc -eq 1 ] && contains "$out" "FAIL  kernel: copy float32" &&
    contains "$out" "PASS  pool: statistics follow allocations" &&
    contains "$out" "PASS  descriptor: name" && contains "$out" " 1 failed"; then
    ok "a wrong kernel fails, named on a FAIL line, and nothing else does"
else
    fail "a wrong kernel fails, named on a FAIL line, and nothing else does" "rc=$rc" "$out"
fi

# A kernel that is off by 5e-5 relative (exp, 840 float32 ulps) fails against the float64
# reference: the tolerance is derived from the computation, not a fixed 2e-4.
out=$("$TESSERA" plugin-check --quick "$FIXTURES/sloppyexp.so" 2>&1)
rc=$?
if [ $rc -eq 1 ] && contains "$out" "FAIL  kernel: unary float32: unary exp float32" &&
    contains "$out" "the float64 reference says" && contains "$out" " 1 failed"; then
    ok "a kernel 5e-5 off fails against the float64 reference with the derived tolerance"
else
    fail "a kernel 5e-5 off fails against the float64 reference" "rc=$rc" "$out"
fi

# The minimal plugin: every check passes (training included), memory_fraction is enforced by
# the host, and the file stays under 100 lines of code (comments and blank lines aside).
out=$("$TESSERA" plugin-check "$FIXTURES/minimal.so" 2>&1)
rc=$?
code=$(sed -e 's|/\*.*\*/||g' -e '/\/\*/,/\*\//d' "$TS_SRCDIR/tests/fixtures/minimal.c" | grep -c '[^[:space:]]')
if [ $rc -eq 0 ] && contains "$out" " 0 failed" &&
    contains "$out" "PASS  pool: memory_fraction caps reserved bytes" &&
    contains "$out" "PASS  training: an MLP learns" && [ "$code" -lt 100 ]; then
    ok "the minimal plugin ($code lines of code) passes every check and trains"
else
    fail "the minimal plugin passes every check and trains" "rc=$rc code=$code" \
        "$(echo "$out" | grep -v '^PASS')"
fi

# A plugin that never looks at memory_fraction is held to it by the host: the check passes
# because the pool refuses, not because the plugin cooperates.
cfg="$TMP/greedy.ini"
printf '[plugin.greedy]\nmemory_fraction = 0.25\n' >"$cfg"
out=$("$TESSERA" --config "$cfg" plugin-check --quick "$FIXTURES/greedy.so" 2>&1)
if contains "$out" "PASS  pool: memory_fraction caps reserved bytes: limit 16.00 MiB"; then
    ok "a plugin ignoring memory_fraction cannot reserve past it"
else
    fail "a plugin ignoring memory_fraction cannot reserve past it" "$out"
fi

out=$(ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}allocator_may_return_null=1" \
    "$TESSERA" plugin-check --quick "$FIXTURES/sharedscratch.so" 2>&1)
rc=$?
if [ $rc -eq 1 ] && contains "$out" "PASS  kernel: copy float32" &&
    contains "$out" "FAIL  threads: concurrent run calls: thread" &&
    contains "$out" "reference says" && contains "$out" "writing-a-plugin.md"; then
    ok "a plugin sharing scratch state between calls fails the concurrency check, not the kernel check"
else
    fail "a plugin sharing scratch state between calls fails the concurrency check" "rc=$rc" "$out"
fi

out=$("$TESSERA" plugin-check --quick "$FIXTURES/extraexport.so" 2>&1)
rc=$?
if [ $rc -eq 1 ] && contains "$out" "FAIL  exports: only the entry point: 1 more symbol(s): extraexport_helper" &&
    contains "$out" " 1 failed"; then
    ok "a plugin exporting more than its entry point fails, the symbol named"
else
    fail "a plugin exporting more than its entry point fails, the symbol named" "rc=$rc" "$out"
fi
# The same plugin with its section headers and dynamic symbols moved to odd offsets (the loader
# does not read them, so it still loads): the reader copies each struct out of the file instead
# of casting a misaligned pointer (undefined behaviour, stopped by UBSan in the sanitizer build),
# and finds the same extra symbol.
"$TS_BUILDDIR/tests/cli/elf-misalign" "$FIXTURES/extraexport.so" "$TMP/misaligned.so" 2>"$TMP/mis.err"
out=$("$TESSERA" plugin-check --quick "$TMP/misaligned.so" 2>&1)
rc=$?
if [ $rc -eq 1 ] && contains "$out" "FAIL  exports: only the entry point: 1 more symbol(s): extraexport_helper" &&
    contains "$out" " 1 failed" && ! contains "$out" "runtime error"; then
    ok "misaligned section headers and symbols are read without undefined behaviour"
else
    fail "misaligned section headers and symbols are read without undefined behaviour" "rc=$rc" \
        "$(cat "$TMP/mis.err")" "$(echo "$out" | grep -v '^PASS' | head -20)"
fi

# --coverage: what the built-in models need, recorded on a device that runs everything, against
# the plugin's claims. cpu_blas claims everything; declinedev (float32 unary and binary, no host
# memory) misses the rest, evaluation's int64, uint8 and float64 kernels among them.
if [ -f "$TS_BUILDDIR/plugins/cpu_blas/.libs/cpu_blas.so" ]; then
    out=$("$TESSERA" plugin-check --coverage cpu_blas 2>&1)
    rc=$?
    if [ $rc -eq 0 ] && contains "$out" "0 missing, 0 optional not claimed" && ! contains "$out" "MISSING"; then
        ok "plugin-check --coverage cpu_blas: $(echo "$out" | tail -1)"
    else
        fail "plugin-check --coverage cpu_blas" "rc=$rc" "$out"
    fi
    out=$("$TESSERA" plugin-check --coverage "$FIXTURES/declinedev.so" 2>&1)
    rc=$?
    if [ $rc -eq 1 ] && contains "$out" "MISSING   reduce argmax -> int64" &&
        contains "$out" "MISSING   binary eq -> uint8" && contains "$out" "MISSING   cast -> float64" &&
        contains "$out" "MISSING   conv2d -> float32" && contains "$out" "MISSING   matmul -> float32" &&
        contains "$out" "optional  adam_step -> float32" &&
        ! contains "$out" "binary add -> float32" && ! contains "$out" "unary relu -> float32"; then
        ok "plugin-check --coverage lists every unclaimed op the models need at once, and only those"
    else
        fail "plugin-check --coverage lists every unclaimed op the models need" "rc=$rc" "$out"
    fi
else
    skip "plugin-check --coverage cpu_blas" "cpu_blas is not built"
    skip "plugin-check --coverage lists every unclaimed op" "cpu_blas is not built"
fi

out=$("$TESSERA" plugin-check "$FIXTURES/badabi.so" 2>&1)
rc=$?
if [ $rc -eq 1 ] && contains "$out" "FAIL  load:" && contains "$out" "rebuild the plugin"; then
    ok "a plugin of another ABI major fails to load, with the loader's message"
else
    fail "a plugin of another ABI major fails to load, with the loader's message" "rc=$rc" "$out"
fi

out=$("$TESSERA" plugin-check 2>&1)
rc=$?
if [ $rc -eq 2 ] && contains "$out" "expected a plugin NAME" &&
    "$TESSERA" help plugin-check | grep -q "usage: tessera plugin-check" &&
    "$TESSERA" help | grep -q "plugin-check"; then
    ok "misuse exits 2; help plugin-check prints the usage"
else
    fail "misuse exits 2; help plugin-check prints the usage" "rc=$rc" "$out"
fi

# Exported symbols: the entry point and nothing else (the linker's own aside). Nothing from the
# libraries a plugin links may leak out; cpu_onednn's test diagnostics live in its test build.
if ! command -v nm >/dev/null 2>&1; then
    skip "plugins export only their entry point" "nm is not installed"
else
    bad=""
    n=0
    for so in "$TS_BUILDDIR"/plugins/*/.libs/*.so; do
        [ -f "$so" ] || continue
        name=$(basename "$so" .so)
        n=$((n + 1))
        # communication plugins (comm_*) export tessera_comm_entry instead
        entry=tessera_plugin_entry
        case $name in comm_*) entry=tessera_comm_entry ;; esac
        extra=$(nm -D --defined-only "$so" | awk '{print $NF}' |
            grep -v -e "^$entry\$" -e '^_init$' -e '^_fini$' \
                -e '^_edata$' -e '^_end$' -e '^__bss_start$')
        [ -n "$extra" ] && bad="$bad $name: $(echo $extra | head -c 300)"
        nm -D --defined-only "$so" | grep -q " T $entry\$" || bad="$bad $name: no entry point"
    done
    if [ $n -gt 0 ] && [ -z "$bad" ]; then
        ok "the $n built plugins export only their entry point"
    else
        fail "plugins export only their entry point" "checked $n" "$bad"
    fi
fi
# A host-memory plugin may decline a call it claims (the guide's "Declining one call"): the
# host runs it on the reference kernels, so plugin-check says so instead of failing; a plugin
# without host memory that declines fails, since nothing could run the call.
out=$("$TESSERA" plugin-check "$FIXTURES/decline.so" 2>&1); rc=$?
out2=$("$TESSERA" plugin-check "$FIXTURES/declinedev.so" 2>&1); rc2=$?
if [ $rc -eq 0 ] && contains "$out" "declines all 350 cases: the host runs them on its reference kernels" &&
    ! contains "$out" "FAIL" && [ $rc2 -eq 1 ] &&
    contains "$out2" "it has no host memory the reference kernels could run on"; then
    ok "plugin-check: a host-memory plugin's declines are reported, not failed; a device plugin's fail"
else
    fail "plugin-check and declining" "rc=$rc $out" "rc2=$rc2 $out2"
fi
# A plugin refused by the trust rule is said once, not as a warning and again as the failure.
mkdir -p "$TMP/ww" && chmod 755 "$TMP/ww"
cp "$FIXTURES/minimal.so" "$TMP/ww/minimal.so" && chmod 666 "$TMP/ww/minimal.so"
out=$("$TESSERA" plugin-check "$TMP/ww/minimal.so" 2>&1); rc=$?
if [ $rc -eq 1 ] && [ "$(printf '%s\n' "$out" | grep -c 'refusing to load')" -eq 1 ]; then
    ok "a plugin the trust rule refuses is named once"
else
    fail "the trust refusal is printed once" "rc=$rc" "$out"
fi
finish
