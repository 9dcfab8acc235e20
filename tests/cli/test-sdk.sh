#!/bin/sh
# tests/cli/test-sdk.sh: the plugin SDK as a third party uses it. `make install DESTDIR=...`
# into a temporary root; the installed template (examples/plugin-template) is copied out and
# built with nothing but its Makefile and pkg-config (PKG_CONFIG_SYSROOT_DIR maps the .pc
# paths into the root); the installed `tessera` then passes it through plugin-check, selects
# it from an INI file by path and by name, and trains 50 MLP steps on it (Fashion-MNIST if
# installed, else that check SKIPs like tests/cli/test-train.sh).
. "${TS_SRCDIR:-.}/tests/cli/lib.sh"
plan 6

ROOT="$TMP/root"
# A make of our own: not the jobserver of the `make check` running this test.
if ! env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL ${TS_MAKE:-make} -s -C "$TS_BUILDDIR" install \
    DESTDIR="$ROOT" >"$TMP/install.log" 2>&1; then
    fail "make install DESTDIR" "$(tail -20 "$TMP/install.log")"
    for t in build check by-path by-name train; do skip "$t" "the install failed"; done
    finish
fi
pc=$(find "$ROOT" -name tessera-plugin.pc | head -1)
tmpl=$(find "$ROOT" -type d -path '*/examples/plugin-template' | head -1)
bin=$(find "$ROOT" -type f -path '*/bin/tessera' | head -1)
lib=$(find "$ROOT" -name 'libtessera.so*' | head -1)
plugins=$(find "$ROOT" -type d -path '*/tessera/plugins' | head -1)
if [ -n "$pc" ] && [ -f "$tmpl/Makefile" ] && [ -f "$tmpl/template.c" ] && [ -x "$bin" ] &&
    [ -n "$lib" ] && find "$ROOT" -name writing-a-plugin.md | grep -q . &&
    find "$ROOT" -path '*/doc/tessera/README.md' | grep -q . &&
    [ "$(find "$ROOT" -path '*/doc/tessera/*.md' | wc -l)" -eq "$(ls "$TS_SRCDIR"/docs/*.md | wc -l | awk '{print $1 + 1}')" ] &&
    find "$ROOT" -path '*/man1/tessera.1' | grep -q . &&
    [ -d "$plugins" ] && ! ls "$plugins"/*.la >/dev/null 2>&1; then
    ok "make install DESTDIR puts the headers, tessera-plugin.pc, README and every guide, the man page, the template and the plugins (no .la) in place"
else
    fail "make install DESTDIR puts the headers, tessera-plugin.pc, the guide and the template in place" \
        "pc=$pc tmpl=$tmpl bin=$bin lib=$lib" "$(cd "$ROOT" && find . | head -50)"
fi

# The installed tessera, run from the root: its library and plugins are found there.
LD_LIBRARY_PATH="$(dirname "$lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
TESSERA_SYSTEM_PLUGIN_DIR="$plugins"
export LD_LIBRARY_PATH TESSERA_SYSTEM_PLUGIN_DIR
INSTALLED="$bin"

mkdir "$TMP/mydev"
cp "$tmpl"/* "$TMP/mydev/"
if out=$(env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL PKG_CONFIG_PATH="$(dirname "$pc")" \
    PKG_CONFIG_LIBDIR="$(dirname "$pc")" PKG_CONFIG_SYSROOT_DIR="$ROOT" CC="${TS_CC:-cc}" \
    ${TS_MAKE:-make} -C "$TMP/mydev" 2>&1) && [ -f "$TMP/mydev/template.so" ] &&
    ! contains "$out" "warning"; then
    ok "the template builds out of tree with its Makefile and pkg-config, without warnings"
else
    fail "the template builds out of tree with its Makefile and pkg-config, without warnings" "$out"
fi

# The template's own `make check`, as the guide has the author run it (it passes
# --config template.ini, so the plugin gets its section's settings: 'my first device').
out=$(env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL PKG_CONFIG_PATH="$(dirname "$pc")" \
    PKG_CONFIG_LIBDIR="$(dirname "$pc")" PKG_CONFIG_SYSROOT_DIR="$ROOT" CC="${TS_CC:-cc}" \
    ${TS_MAKE:-make} -s -C "$TMP/mydev" check TESSERA="$INSTALLED" 2>&1)
rc=$?
if [ $rc -eq 0 ] && contains "$out" "plugin-check template:" && contains "$out" " 0 failed" &&
    contains "$out" "PASS  kernel: copy float32" && contains "$out" "PASS  training" &&
    contains "$out" "'my first device'"; then
    ok "the template's make check (the installed plugin-check) passes: $(echo "$out" | tail -1)"
else
    fail "the installed tessera plugin-check passes the template" "rc=$rc" "$(echo "$out" | grep -v '^PASS')"
fi

# By path: the installed template.ini says device = ./template.so (relative to the file).
out=$(cd / && "$INSTALLED" --config "$TMP/mydev/template.ini" info 2>&1)
rc=$?
if [ $rc -eq 0 ] && echo "$out" | grep -q "^in use: *template ($TMP/mydev/./template.so)$" &&
    contains "$out" "(selected by path, not on the search path)" &&
    ! contains "$out" "names no plugin on the search path"; then
    ok "template.ini selects the template by path"
else
    fail "template.ini selects the template by path" "rc=$rc" "$out"
fi

# By name, found on plugin_path (relative to the INI file).
mkdir "$TMP/byname" "$TMP/byname/plugins"
cp "$TMP/mydev/template.so" "$TMP/byname/plugins/"
printf '[core]\ndevice = template\nplugin_path = plugins\nfallback =\n' >"$TMP/byname/t.ini"
out=$(cd / && "$INSTALLED" --config "$TMP/byname/t.ini" plugin-check --quick template 2>&1)
rc=$?
if [ $rc -eq 0 ] && contains "$out" "byname/plugins/template.so"; then
    ok "device = template with plugin_path selects the template by name"
else
    fail "device = template with plugin_path selects the template by name" "rc=$rc" "$out"
fi

DATA=/usr/share/datasets/fashion-mnist
if [ ! -f "$DATA/train-images-idx3-ubyte.gz" ]; then
    skip "train 50 mlp steps on the template" "Fashion-MNIST is not installed (Debian package dataset-fashion-mnist)"
else
    out=$(cd / && "$INSTALLED" --config "$TMP/mydev/template.ini" train --model mlp \
        --max-steps 50 --train-limit 3200 --json 2>&1)
    rc=$?
    loss=$(echo "$out" | grep '"epoch"' | tail -1 | "$JSON_CHECK" train_loss | sed 's/.*=//')
    if [ $rc -eq 0 ] && [ -n "$loss" ] && awk "BEGIN{exit !($loss < 2.0)}"; then
        ok "template.ini (device = ./template.so) trains 50 mlp steps: train loss $loss"
    else
        fail "template.ini (device = ./template.so) trains 50 mlp steps" "rc=$rc" "$out"
    fi
fi
finish
