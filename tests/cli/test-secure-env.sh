#!/bin/sh
# tests/cli/test-secure-env.sh: TESSERA_PLUGIN_PATH is ignored in a setuid/setgid program
# (core/status.c: ts__getenv is secure_getenv). A probe linked against the build tree loads a
# fixture by name through TESSERA_PLUGIN_PATH: as a plain program it must find it; as a setgid
# copy (group nogroup, run by root, so the kernel sets AT_SECURE) it must not. Needs root and a
# filesystem that honours the setgid bit; otherwise the setgid case skips. A lint check keeps
# every environment read in core/ going through ts__getenv.
. "${TS_SRCDIR:-.}/tests/cli/lib.sh"
plan 3
PROBE="$TS_BUILDDIR/tests/cli/secure-probe"
mkdir -p "$TMP/plugins"
cp "$FIXTURES/withkeys.so" "$TMP/plugins/withkeys.so"
chmod 755 "$TMP" "$TMP/plugins"

out=$(TESSERA_PLUGIN_PATH="$TMP/plugins" "$PROBE" withkeys 2>&1)
if contains "$out" "loaded $TMP/plugins/withkeys.so" && contains "$out" "secure=0"; then
    ok "a plain program loads a plugin found through TESSERA_PLUGIN_PATH"
else
    fail "a plain program loads a plugin found through TESSERA_PLUGIN_PATH" "$out"
fi

if [ "$(id -u)" -ne 0 ]; then
    skip "TESSERA_PLUGIN_PATH is ignored under setgid" "needs root to make a setgid copy"
else
    cp "$PROBE" "$TMP/probe-sgid"
    chgrp nogroup "$TMP/probe-sgid" 2>/dev/null && chmod 2755 "$TMP/probe-sgid"
    out=$(TESSERA_PLUGIN_PATH="$TMP/plugins" "$TMP/probe-sgid" withkeys 2>&1)
    if contains "$out" "secure=0"; then
        skip "TESSERA_PLUGIN_PATH is ignored under setgid" \
            "the kernel did not run the setgid copy in secure mode (nosuid mount?)"
    elif contains "$out" "refused:" && contains "$out" "not found" && contains "$out" "secure=1"; then
        ok "TESSERA_PLUGIN_PATH is ignored under setgid"
    else
        fail "TESSERA_PLUGIN_PATH is ignored under setgid" "$out"
    fi
fi

# Every environment read in libtessera goes through ts__getenv (secure_getenv).
direct=$(grep -n 'getenv *(' "$TS_SRCDIR"/core/*.c | grep -v 'ts__getenv\|secure_getenv(name)\|return getenv(name)')
if [ -z "$direct" ]; then
    ok "core/ reads the environment only through ts__getenv"
else
    fail "core/ reads the environment only through ts__getenv" "$direct"
fi
finish
