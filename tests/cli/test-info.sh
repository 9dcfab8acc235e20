#!/bin/sh
# tests/cli/test-info.sh: `tessera info` as a user runs it: text and JSON, fallback,
# TESSERA_DEVICE, bad configs and misuse give a one-line error and a non-zero exit.
. "${TS_SRCDIR:-.}/tests/cli/lib.sh"
plan 23

out=$("$TESSERA" info 2>&1)
if [ $? -eq 0 ] && contains "$out" "cpu_blas: 1 device" && contains "$out" "tests/data/test.ini" \
    && contains "$out" "threads=2"; then
    ok "info lists cpu_blas with the test config's settings"
else
    fail "info lists cpu_blas with the test config's settings" "$out"
fi

"$TESSERA" info --json >"$TMP/info.json" 2>"$TMP/err"
if "$JSON_CHECK" version plugin_abi config.file default_device search_path.[0] \
    plugins.[0].name plugins.[0].loaded plugins.[0].devices.count <"$TMP/info.json" >"$TMP/fields"; then
    ok "info --json parses and has the documented fields"
else
    fail "info --json parses and has the documented fields" "$(cat "$TMP/info.json" | head -5)"
fi

if grep -q '^default_device="cpu_blas"$' "$TMP/fields"; then
    ok "info --json names the device in use"
else
    fail "info --json names the device in use" "$(cat "$TMP/fields")"
fi

# Which of its kernel sets OpenBLAS picked, as OpenBLAS says: the one OPENBLAS_CORETYPE asks
# for (Nehalem: SSE4.2, which every x86-64 machine these tests run on has).
nb=$(OPENBLAS_CORETYPE=Nehalem "$TESSERA" info 2>&1)
if contains "$nb" "cpu_blas: 1 device: host CPU, 2 threads, OpenBLAS 0." \
    && contains "$nb" "(Nehalem kernels)"; then
    ok "info names OpenBLAS's version and the kernel set it picked"
else
    fail "info names OpenBLAS's version and the kernel set it picked" "$nb"
fi

# cuda: built here? Then without a GPU it must say "0 devices (reason)".
if [ -f "$TS_BUILDDIR/plugins/cuda/.libs/cuda.so" ]; then
    if contains "$out" "cuda: 0 devices (" || contains "$out" "cuda: 1 device"; then
        ok "info reports the cuda plugin's devices or why it has none"
    else
        fail "info reports the cuda plugin's devices or why it has none" "$out"
    fi
else
    skip "info reports the cuda plugin's devices or why it has none" "cuda plugin not built"
fi

# Fallback with a warning when the configured device cannot start.
printf '[core]\ndevice = %s/nodevice.so\nfallback = cpu_blas\n' "$FIXTURES" >"$TMP/fb.ini"
out=$("$TESSERA" --config "$TMP/fb.ini" info 2>&1)
if [ $? -eq 0 ] && contains "$out" "falling back to 'cpu_blas'" && contains "$out" "in use:          cpu_blas"; then
    ok "info falls back with a warning"
else
    fail "info falls back with a warning" "$out"
fi

# A misspelt [plugin.NAME] section (empty, too) is one warning naming the closest plugin; the
# installed file's [plugin.cuda] says nothing where cuda is not built.
printf '[core]\ndevice = cpu_blas\n[plugin.cpu_blass]\n[plugin.cuda]\ndevice_index = 0\n' >"$TMP/sec.ini"
"$TESSERA" --config "$TMP/sec.ini" info >/dev/null 2>"$TMP/sec.err"; rc=$?
n=$(grep -c 'sec.ini:3: \[plugin.cpu_blass\].*did you mean \[plugin.cpu_blas\]' "$TMP/sec.err")
if [ $rc -eq 0 ] && [ "$n" -eq 1 ] && ! grep -q 'plugin.cuda' "$TMP/sec.err"; then
    ok "info warns once about a misspelt plugin section"
else
    fail "info warns once about a misspelt plugin section" "rc=$rc, $n warnings" "$(cat "$TMP/sec.err")"
fi

# TESSERA_DEVICE overrides [core] device.
out=$(TESSERA_DEVICE=cpu_onednn "$TESSERA" info --json 2>&1 | "$JSON_CHECK" default_device)
if [ -f "$TS_BUILDDIR/plugins/cpu_onednn/.libs/cpu_onednn.so" ]; then
    if [ "$out" = 'default_device="cpu_onednn"' ]; then ok "TESSERA_DEVICE is honoured"
    else fail "TESSERA_DEVICE is honoured" "$out"; fi
else
    skip "TESSERA_DEVICE is honoured" "cpu_onednn plugin not built"
fi

# TESSERA_PLUGIN_PATH adds a directory.
mkdir -p "$TMP/extra" && cp "$FIXTURES/withkeys.so" "$TMP/extra/"
out=$(TESSERA_PLUGIN_PATH="$TMP/extra" "$TESSERA" info 2>&1)
if contains "$out" "withkeys: 1 device" && contains "$out" "$TMP/extra"; then
    ok "TESSERA_PLUGIN_PATH is searched"
else
    fail "TESSERA_PLUGIN_PATH is searched" "$out"
fi

# A bad config value: one line naming file, line, key and the expected form; exit 1.
printf '[core]\ndevice = cpu_blas\n[plugin.cpu_blas]\ncache_limit = lots\n' >"$TMP/bad.ini"
out=$("$TESSERA" --config "$TMP/bad.ini" info 2>&1); rc=$?
if [ $rc -eq 1 ] && contains "$out" "bad.ini:4:" && contains "$out" "cache_limit" \
    && [ "$(echo "$out" | wc -l)" -eq 1 ]; then
    ok "a bad config value is one clear error"
else
    fail "a bad config value is one clear error" "rc=$rc" "$out"
fi

out=$("$TESSERA" --config "$TMP/missing.ini" info 2>&1); rc=$?
if [ $rc -eq 1 ] && contains "$out" "missing.ini"; then ok "a missing --config file is an error"
else fail "a missing --config file is an error" "rc=$rc" "$out"; fi

# Special files as --config: refused by name at once (a FIFO nobody writes must not hang).
out=$(timeout "$(hang_limit 20)" "$TESSERA" --config "$TMP" info 2>&1); rc=$?
if [ $rc -eq 1 ] && contains "$out" "is a directory, not a regular file"; then
    ok "a directory as --config is an error, not the built-in defaults"
else
    fail "a directory as --config is an error, not the built-in defaults" "rc=$rc" "$out"
fi
mkfifo "$TMP/fifo.ini"
out=$(timeout "$(hang_limit 20)" "$TESSERA" --config "$TMP/fifo.ini" info 2>&1); rc=$?
if [ $rc -eq 1 ] && contains "$out" "fifo.ini" && contains "$out" "FIFO"; then
    ok "a FIFO as --config is refused without blocking"
else
    fail "a FIFO as --config is refused without blocking" "rc=$rc" "$out"
fi

out=$("$TESSERA" info --frobnicate 2>&1); rc=$?
if [ $rc -eq 2 ] && contains "$out" "--frobnicate"; then ok "misuse exits 2 with a one-line error"
else fail "misuse exits 2 with a one-line error" "rc=$rc" "$out"; fi

out=$("$TESSERA" nosuchcommand 2>&1); rc=$?
if [ $rc -eq 2 ] && contains "$out" "unknown command"; then ok "an unknown command exits 2"
else fail "an unknown command exits 2" "rc=$rc" "$out"; fi

if "$TESSERA" info --help | grep -q "usage: tessera info" && "$TESSERA" --help | grep -q "usage: tessera"; then
    ok "--help works for tessera and tessera info"
else
    fail "--help works for tessera and tessera info"
fi
# A plugin selected by path (outside the search path) is listed with the others, and a
# relative path that names nothing fails with the absolute path it tried.
out=$(cd "$FIXTURES" && "$TESSERA" info --device ./minimal.so 2>&1)
if contains "$out" "in use:          minimal ($FIXTURES/minimal.so)" &&
    contains "$out" "minimal: 1 device: minimal host device (selected by path, not on the search path)"; then
    ok "info --device ./x.so lists the plugin selected by path"
else
    fail "info --device ./x.so lists the plugin selected by path" "$out"
fi
out=$(cd "$TMP" && "$TESSERA" train --device ./nope.so --max-steps 1 2>&1)
rc=$?
if [ $rc -ne 0 ] && contains "$out" "plugin './nope.so': no such file: $(cd "$TMP" && pwd -P)/nope.so" &&
    contains "$out" "resolved against the working directory"; then
    ok "a relative plugin path that names nothing fails with the absolute path tried"
else
    fail "a relative plugin path that names nothing fails with the absolute path tried" "rc=$rc" "$out"
fi
# Communication plugins: listed with their description, or with why they cannot be used (a
# device plugin named comm_*.so is not one); [dist] backend naming a missing or wrong plugin
# stops training with the reason.
mkdir -p "$TMP/comm" && chmod 755 "$TMP" "$TMP/comm"
cp "$FIXTURES/minimal.so" "$TMP/comm/comm_fake.so"
out=$(TESSERA_PLUGIN_PATH="$TMP/comm" "$TESSERA" info 2>&1)
if contains "$out" "fake: unusable: " && contains "$out" "is not a communication plugin: it does not export 'tessera_comm_entry'" &&
    { [ ! -f "$TS_BUILDDIR/plugins/comm_mpi/.libs/comm_mpi.so" ] || contains "$out" "  mpi: "; }; then
    ok "info lists communication plugins, and why one is unusable"
else
    fail "info lists communication plugins, and why one is unusable" "$out"
fi
printf '[dist]\nbackend = fake\n' >"$TMP/comm/fake.ini"
printf '[dist]\nbackend = nosuch\n' >"$TMP/comm/nosuch.ini"
out1=$(TESSERA_PLUGIN_PATH="$TMP/comm" "$TESSERA" train --config "$TMP/comm/fake.ini" --model mlp --max-steps 1 --train-limit 64 2>&1)
rc1=$?
out2=$("$TESSERA" train --config "$TMP/comm/nosuch.ini" --model mlp --max-steps 1 --train-limit 64 2>&1)
rc2=$?
if [ $rc1 -eq 1 ] && contains "$out1" "cannot join the distributed job" &&
    contains "$out1" "does not export 'tessera_comm_entry'" && [ $rc2 -eq 1 ] &&
    contains "$out2" "communication backend 'nosuch': plugin 'comm_nosuch' not found: no comm_nosuch.so in"; then
    ok "[dist] backend naming a wrong or missing plugin stops training with the reason"
else
    fail "[dist] backend naming a wrong or missing plugin stops training with the reason" \
        "rc=$rc1: $out1" "rc=$rc2: $out2"
fi

# Where each value came from: the file and line, the environment, the flag, or the default.
printf '[core]\ndevice = cpu_blas\n[plugin.cpu_blas]\nthreads = 1\ncache_limit = 64M\n' >"$TMP/o.ini"
out=$("$TESSERA" --config "$TMP/o.ini" info 2>&1)
out2=$(TESSERA_DEVICE=cpu_blas "$TESSERA" --config "$TMP/o.ini" info --json 2>&1 |
    "$JSON_CHECK" config.device_origin plugins.[0].settings.threads.origin 2>&1)
if contains "$out" "device:          cpu_blas (from $TMP/o.ini:2;" &&
    contains "$out" "cache_limit=64M($TMP/o.ini:5)" && contains "$out" "threads=1($TMP/o.ini:4)" &&
    contains "$out" "memory_fraction=0.5(default)" &&
    contains "$out2" 'config.device_origin="TESSERA_DEVICE"'; then
    ok "info says where each value came from: file:line, TESSERA_DEVICE or default"
else
    fail "info says where each value came from" "$out" "$out2"
fi

# Layers: the installed file (TESSERA_SYSTEM_CONFIG stands in for it) under the user's, key by
# key; each value names its file, and a relative path resolves against the file that set it.
mkdir -p "$TMP/sysd/plug" "$TMP/userd"
printf '[core]\nplugin_path = plug\nlog_level = warn\n[plugin.cpu_blas]\ncache_limit = 32M\nthreads = 2\n[plugin.cpu_blass]\n' \
    >"$TMP/sysd/tessera.ini"
printf '[plugin.cpu_blas]\nthreads = 1\n[core]\ndevice = rel/nodevice.so\n' >"$TMP/userd/u.ini"
out=$(TESSERA_SYSTEM_CONFIG="$TMP/sysd/tessera.ini" "$TESSERA" --config "$TMP/userd/u.ini" info 2>&1)
rc=$?
out2=$(TESSERA_SYSTEM_CONFIG="$TMP/sysd/tessera.ini" "$TESSERA" --config "$TMP/userd/u.ini" info --json 2>/dev/null |
    "$JSON_CHECK" config.files.[0] config.files.[1] 2>&1)
if [ $rc -eq 0 ] && contains "$out" "config:          $TMP/userd/u.ini over $TMP/sysd/tessera.ini" &&
    contains "$out" "threads=1($TMP/userd/u.ini:2)" &&
    contains "$out" "cache_limit=32M($TMP/sysd/tessera.ini:5)" &&
    contains "$out" "  $TMP/sysd/plug" &&
    contains "$out" "$TMP/userd/rel/nodevice.so" &&
    contains "$out" "$TMP/sysd/tessera.ini:7: [plugin.cpu_blass]" &&
    contains "$out2" "config.files.[0]=\"$TMP/sysd/tessera.ini\"" &&
    contains "$out2" "config.files.[1]=\"$TMP/userd/u.ini\""; then
    ok "the user's file goes on top of the installed one key by key, each value naming its file"
else
    fail "the user's file goes on top of the installed one key by key" "rc=$rc" "$out" "$out2"
fi
# The 16-bit floats: per plugin, the ops it runs in each (all but the optimizer steps) and
# how (native or emulated, in the plugin's words);
# the host CPU's half-precision instruction sets.
js=$("$TESSERA" info --json 2>&1)
h=$(printf '%s\n' "$js" | "$JSON_CHECK" plugins.[0].half_precision.bfloat16.[1] \
    plugins.[0].half_precision.float16.[0] plugins.[0].half_precision_without.bfloat16 2>&1)
txt=$("$TESSERA" info 2>&1)
flags_ok=1
if [ -r /proc/cpuinfo ]; then
    want=no
    grep -q '^flags.* avx512_bf16' /proc/cpuinfo && want=yes
    contains "$txt" "avx512_bf16 $want" || flags_ok=0
fi
if contains "$h" 'bfloat16.[1]="cast"' && contains "$h" 'float16.[0]="copy"' &&
    contains "$h" 'half_precision_without.bfloat16=["sgd_step","adam_step"]' &&
    contains "$txt" "half precision: bfloat16: every op it runs in float32 but sgd_step, adam_step; float16:" &&
    contains "$txt" "how: bfloat16 and float16 emulated: computed" &&
    [ $flags_ok -eq 1 ]; then
    ok "info lists the ops each plugin runs in bfloat16 and float16, and the CPU's half-precision flags"
else
    fail "info: half precision" "$h" "$txt"
fi
finish
