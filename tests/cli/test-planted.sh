#!/bin/sh
# tests/cli/test-planted.sh: what another local user can plant for root's tessera. Configuration
# files pass the plugin trust rule before anything in them is honoured, on every route the
# CLI reads one from (--config, $TESSERA_CONFIG, the XDG file, ~/.config, the installed one);
# only the installed file may turn the plugin trust rule off; --config with an empty name is
# an error. Every output (checkpoints, convert -o, memplot -o, --memtrace, --memplot and its
# side trace, TESSERA_MEMTRACE) refuses a file another user planted at its name and leaves
# it as it was; one's own file there is replaced by a new one. The attacker is uid 65534 (files chowned to it, which needs root: those checks
# skip otherwise), working in a sticky shared directory as /tmp is.
. "${TS_SRCDIR:-.}/tests/cli/lib.sh"
plan 27
chmod 755 "$TMP"
SHARED="$TMP/shared"
mkdir -p "$SHARED" && chmod 1777 "$SHARED"
MARK="$TMP/planted-ran"
root=0
[ "$(id -u)" -eq 0 ] && root=1

# as_attacker PATH...: hand files and directories to uid 65534 (root only).
as_attacker() { chown 65534:65534 "$@"; }

cp "$FIXTURES/planted.so" "$SHARED/planted.so"
cat >"$SHARED/evil.ini" <<INI
[core]
device = $SHARED/planted.so
allow_insecure_plugin_path = true
[dist]
backend = $SHARED/planted.so
INI
chmod 644 "$SHARED/evil.ini"

# refused NAME ENV... -- ARGS...: tessera info must fail naming the configuration file as
# refused, and the planted plugin must never have run.
refused() {
    name=$1; shift
    rm -f "$MARK"
    out=$(env TS_PLANTED_MARKER="$MARK" "$@" 2>&1)
    rc=$?
    if [ "$rc" -ne 0 ] && contains "$out" "refusing the configuration file" && [ ! -e "$MARK" ]; then
        ok "$name"
    else
        fail "$name" "exit $rc, planted ran: $([ -e "$MARK" ] && echo yes || echo no)" "$out"
    fi
}

if [ "$root" -eq 0 ]; then
    for n in 1 2 3 4 5 6 7; do skip "planted configuration route $n" "needs root to act as another user"; done
else
    as_attacker "$SHARED/planted.so" "$SHARED/evil.ini"
    refused "--config naming another user's file" \
        TESSERA_SYSTEM_CONFIG= "$TESSERA" --config "$SHARED/evil.ini" info
    refused "\$TESSERA_CONFIG naming another user's file" \
        TESSERA_SYSTEM_CONFIG= TESSERA_CONFIG="$SHARED/evil.ini" "$TESSERA" info
    refused "\$TESSERA_CONFIG with \$TESSERA_DEVICE" \
        TESSERA_SYSTEM_CONFIG= TESSERA_CONFIG="$SHARED/evil.ini" \
        TESSERA_DEVICE="$SHARED/planted.so" "$TESSERA" info
    refused "\$TESSERA_SYSTEM_CONFIG naming another user's file" \
        TESSERA_SYSTEM_CONFIG="$SHARED/evil.ini" TESSERA_CONFIG= "$TESSERA" info
    # The XDG file and ~/.config, as `su` without `-` or `sudo -E` leave them on root's path.
    mkdir -p "$SHARED/xdg/tessera" "$SHARED/home/.config/tessera"
    cp "$SHARED/evil.ini" "$SHARED/xdg/tessera/tessera.ini"
    cp "$SHARED/evil.ini" "$SHARED/home/.config/tessera/tessera.ini"
    chmod 755 "$SHARED/xdg" "$SHARED/xdg/tessera" "$SHARED/home" "$SHARED/home/.config" \
        "$SHARED/home/.config/tessera"
    as_attacker "$SHARED/xdg" "$SHARED/xdg/tessera" "$SHARED/xdg/tessera/tessera.ini" \
        "$SHARED/home" "$SHARED/home/.config" "$SHARED/home/.config/tessera" \
        "$SHARED/home/.config/tessera/tessera.ini"
    refused "the XDG file of another user" \
        TESSERA_SYSTEM_CONFIG= TESSERA_CONFIG= XDG_CONFIG_HOME="$SHARED/xdg" "$TESSERA" info
    refused "~/.config of another user" \
        TESSERA_SYSTEM_CONFIG= TESSERA_CONFIG= XDG_CONFIG_HOME= HOME="$SHARED/home" "$TESSERA" info
    # Root's own file in a directory the attacker owns: they could swap it.
    mkdir "$SHARED/theirs" && chmod 755 "$SHARED/theirs"
    printf '[core]\ndevice = cpu_blas\n' >"$SHARED/theirs/mine.ini"
    chmod 644 "$SHARED/theirs/mine.ini"
    as_attacker "$SHARED/theirs"
    refused "a file in another user's directory" \
        TESSERA_SYSTEM_CONFIG= "$TESSERA" --config "$SHARED/theirs/mine.ini" info
fi

# One's own file may choose a plugin, but not turn the trust rule off for it.
printf '[core]\ndevice = %s\nallow_insecure_plugin_path = true\n' "$SHARED/planted.so" >"$TMP/own.ini"
chmod 644 "$TMP/own.ini"
rm -f "$MARK"
out=$(TS_PLANTED_MARKER="$MARK" TESSERA_SYSTEM_CONFIG= "$TESSERA" --config "$TMP/own.ini" info 2>&1)
rc=$?
if [ "$rc" -ne 0 ] && contains "$out" "$TMP/own.ini:3" &&
    contains "$out" "honoured only in the installed configuration" && [ ! -e "$MARK" ]; then
    ok "allow_insecure_plugin_path in the user's file is refused"
else
    fail "allow_insecure_plugin_path in the user's file is refused" "exit $rc" "$out"
fi

# Nor a root-owned file $TESSERA_SYSTEM_CONFIG names, as an environment kept from another user
# could (sudo -E), with $TESSERA_DEVICE naming that user's plugin.
rm -f "$MARK"
out=$(TS_PLANTED_MARKER="$MARK" TESSERA_SYSTEM_CONFIG="$TS_SRCDIR/tests/fuzz/corpus/config/ok-plugin.ini" \
    TESSERA_CONFIG= TESSERA_DEVICE="$SHARED/planted.so" "$TESSERA" info 2>&1)
rc=$?
if [ "$rc" -ne 0 ] && contains "$out" "not one named by" && [ ! -e "$MARK" ]; then
    ok "allow_insecure_plugin_path in a file \$TESSERA_SYSTEM_CONFIG names is refused"
else
    fail "allow_insecure_plugin_path in a file \$TESSERA_SYSTEM_CONFIG names is refused" "exit $rc" "$out"
fi

# With the rule on, the planted plugin is refused by the rule itself.
printf '[core]\nallow_insecure_plugin_path = false\n' >"$TMP/installed.ini"
chmod 644 "$TMP/installed.ini"
printf '[core]\ndevice = %s\nfallback =\n' "$SHARED/planted.so" >"$TMP/own2.ini"
chmod 644 "$TMP/own2.ini"
rm -f "$MARK"
out=$(TS_PLANTED_MARKER="$MARK" TESSERA_SYSTEM_CONFIG="$TMP/installed.ini" \
    "$TESSERA" --config "$TMP/own2.ini" info 2>&1)
if [ "$root" -eq 0 ]; then
    skip "a planted plugin named by one's own file is refused" "needs root to act as another user"
elif contains "$out" "refusing to load" && [ ! -e "$MARK" ]; then
    ok "a planted plugin named by one's own file is refused"
else
    fail "a planted plugin named by one's own file is refused" "$out"
fi

for arg in "--config=" "--config ''"; do
    out=$(eval "\"\$TESSERA\" $arg info" 2>&1)
    rc=$?
    if [ "$rc" -eq 2 ] && contains "$out" "--config needs a FILE"; then
        ok "tessera $arg is a usage error"
    else
        fail "tessera $arg is a usage error" "exit $rc" "$out"
    fi
done

# ---- outputs planted by another user in a shared sticky directory ----------------------
printf 'the quick brown fox jumps over the lazy dog. %.0s' $(seq 40) >"$TMP/t.txt"
GPT="--model gpt --text $TMP/t.txt --context 8 --layers 1 --heads 1 --embd 8 --batch-size 2
  --steps 2 --eval-every 2 --eval-batches 1"
NPY="$TS_SRCDIR/tests/data/npy/f32_2x3.npy"
OUT="$SHARED/out"
mkdir "$OUT" && chmod 1777 "$OUT"
# plant NAME: a file of uid 65534, mode 0666 (so its owner could read and change what root
# would write into it).
plant() { echo planted >"$OUT/$1" && chmod 666 "$OUT/$1" && as_attacker "$OUT/$1"; }
# untouched NAME: still the attacker's file, as planted.
untouched() {
    [ "$(stat -c %u "$OUT/$1")" = 65534 ] && [ "$(cat "$OUT/$1")" = planted ]
}
# outcome NAME RC OUT FILE...: the command failed saying whose file it is; each FILE untouched.
outcome() {
    name=$1 rc=$2 text=$3; shift 3
    good=1
    for f in "$@"; do untouched "$f" || good=0; done
    if [ "$rc" -ne 0 ] && contains "$text" "belongs to uid 65534" && [ $good -eq 1 ]; then
        ok "$name"
    else
        fail "$name" "exit $rc" "$text" "$(ls -l "$OUT")"
    fi
}
if [ "$root" -eq 0 ]; then
    for n in 1 2 3 4 5 6; do skip "planted output $n" "needs root to act as another user"; done
else
    plant model.st
    # shellcheck disable=SC2086
    o=$("$TESSERA" train $GPT --save "$OUT/model.st" 2>&1)
    outcome "a planted checkpoint name is refused before training" $? "$o" model.st
    plant conv.safetensors
    o=$("$TESSERA" convert "$NPY" -o "$OUT/conv.safetensors" 2>&1)
    outcome "convert -o refuses a planted output" $? "$o" conv.safetensors
    "$TESSERA" convert "$NPY" -o "$TMP/one.safetensors" >/dev/null 2>&1
    plant w.npy
    o=$("$TESSERA" convert "$TMP/one.safetensors" --name f32_2x3 -o "$OUT/w.npy" 2>&1)
    outcome "convert -o refuses a planted .npy" $? "$o" w.npy
    plant trace.json
    # shellcheck disable=SC2086
    o=$("$TESSERA" train $GPT --memtrace "$OUT/trace.json" 2>&1)
    outcome "--memtrace refuses a planted trace" $? "$o" trace.json
    plant pic.svg.trace.json
    # shellcheck disable=SC2086
    o=$("$TESSERA" train $GPT --memplot "$OUT/pic.svg" 2>&1)
    outcome "--memplot refuses a planted side trace" $? "$o" pic.svg.trace.json
    # shellcheck disable=SC2086
    "$TESSERA" train $GPT --memtrace "$TMP/mine.json" >/dev/null 2>&1
    plant pic.svg
    o=$("$TESSERA" memplot "$TMP/mine.json" -o "$OUT/pic.svg" 2>&1)
    outcome "memplot -o refuses a planted picture" $? "$o" pic.svg
fi
# A directory part of an output path that another user controls: a symbolic link of theirs
# (in their directory, or in a sticky shared one) pointing at a root-only directory, or their
# directory itself (they could swap what is written there, or what is read back). Refused;
# nothing appears in the directory the link points at. One's own link is followed.
if [ "$root" -eq 0 ]; then
    for n in 1 2 3; do skip "planted directory link $n" "needs root to act as another user"; done
else
    mkdir -p "$TMP/private" "$OUT/theirs" && chmod 700 "$TMP/private" && chmod 755 "$OUT/theirs"
    ln -s "$TMP/private" "$OUT/theirs/out"
    ln -s "$TMP/private" "$OUT/run"
    as_attacker "$OUT/theirs" "$OUT/theirs/out"
    chown -h 65534:65534 "$OUT/theirs/out" "$OUT/run"
    o1=$("$TESSERA" convert "$NPY" -o "$OUT/theirs/out/model.npy" 2>&1); r1=$?
    o2=$("$TESSERA" convert "$NPY" -o "$OUT/run/model.npy" 2>&1); r2=$?
    # shellcheck disable=SC2086
    o3=$(TESSERA_MEMTRACE="$OUT/run/trace.json" "$TESSERA" train $GPT --memplot "$OUT/run/p.svg" 2>&1); r3=$?
    if [ $r1 -ne 0 ] && contains "$o1" "symbolic link owned by uid 65534" && [ $r2 -ne 0 ] &&
        contains "$o2" "symbolic link owned by uid 65534" && [ $r3 -ne 0 ] &&
        contains "$o3" "symbolic link owned by uid 65534" && [ -z "$(ls -A "$TMP/private")" ]; then
        ok "a link of another user's in an output's directory part is refused"
    else
        fail "a link of another user's in an output's directory part is refused" "$o1" "$o2" "$o3" \
            "$(ls -la "$TMP/private")"
    fi
    o=$("$TESSERA" convert "$NPY" -o "$OUT/theirs/model.npy" 2>&1); rc=$?
    if [ $rc -ne 0 ] && contains "$o" "its directory '$OUT/theirs' is owned by uid 65534" &&
        [ ! -e "$OUT/theirs/model.npy" ]; then
        ok "an output in another user's directory is refused"
    else
        fail "an output in another user's directory is refused" "rc=$rc" "$o"
    fi
    mkdir -p "$TMP/real" && ln -s "$TMP/real" "$TMP/mylink"
    o=$("$TESSERA" convert "$NPY" -o "$TMP/mylink/mine.npy" 2>&1); rc=$?
    if [ $rc -eq 0 ] && [ -f "$TMP/real/mine.npy" ]; then
        ok "one's own link in an output's directory part is followed"
    else
        fail "one's own link in an output's directory part is followed" "rc=$rc" "$o"
    fi
fi

# TESSERA_MEMTRACE: a warning, the planted file untouched, the run goes on.
if [ "$root" -eq 0 ]; then
    skip "TESSERA_MEMTRACE refuses a planted trace" "needs root to act as another user"
else
    plant env.json
    # shellcheck disable=SC2086
    o=$(TESSERA_MEMTRACE="$OUT/env.json" "$TESSERA" train $GPT 2>&1)
    rc=$?
    if [ $rc -eq 0 ] && contains "$o" "TESSERA_MEMTRACE" && contains "$o" "belongs to uid 65534" &&
        untouched env.json; then
        ok "TESSERA_MEMTRACE refuses a planted trace"
    else
        fail "TESSERA_MEMTRACE refuses a planted trace" "exit $rc" "$o"
    fi
fi
# A name from the environment only ever makes a new file: TESSERA_MEMTRACE naming an existing
# file of root's own (a kept environment could name /etc/shadow) is refused, the file intact.
echo "root's own" >"$TMP/precious.conf" && chmod 600 "$TMP/precious.conf"
# shellcheck disable=SC2086
o=$(TESSERA_MEMTRACE="$TMP/precious.conf" "$TESSERA" train $GPT 2>&1)
rc=$?
if [ $rc -eq 0 ] && contains "$o" "TESSERA_MEMTRACE" && contains "$o" "only ever makes a new file" &&
    [ "$(cat "$TMP/precious.conf")" = "root's own" ]; then
    ok "TESSERA_MEMTRACE never replaces an existing file, even one's own"
else
    fail "TESSERA_MEMTRACE never replaces an existing file" "rc=$rc" "$o"
fi
# shellcheck disable=SC2086
TESSERA_MEMTRACE="$TMP/fresh-trace.json" "$TESSERA" train $GPT >/dev/null 2>&1
if grep -q traceEvents "$TMP/fresh-trace.json" 2>/dev/null; then
    ok "TESSERA_MEMTRACE naming a new file writes the trace there"
else
    fail "TESSERA_MEMTRACE naming a new file writes the trace there" "$(ls -l "$TMP")"
fi

# One's own file at the name is replaced by a new file, the caller's, with its own mode.
echo old >"$OUT/own.safetensors" && chmod 600 "$OUT/own.safetensors"
ino=$(stat -c %i "$OUT/own.safetensors")
o=$(umask 022 && "$TESSERA" convert "$NPY" -o "$OUT/own.safetensors" 2>&1)
if [ $? -eq 0 ] && [ "$(stat -c '%u %a' "$OUT/own.safetensors")" = "$(id -u) 600" ] &&
    [ "$(stat -c %i "$OUT/own.safetensors")" != "$ino" ] && [ "$(cat "$OUT/own.safetensors")" != old ]; then
    ok "one's own output is replaced by a new file keeping its mode"
else
    fail "one's own output is replaced by a new file keeping its mode" "$o" "$(ls -li "$OUT")"
fi
# A hard link at the name to a file of one's own that everyone may write (some 0666 log): the
# output replaces the link, never wider than a new file; the log is untouched.
echo log >"$TMP/daemon.log" && chmod 666 "$TMP/daemon.log"
ln "$TMP/daemon.log" "$OUT/linked.safetensors"
o=$(umask 022 && "$TESSERA" convert "$NPY" -o "$OUT/linked.safetensors" 2>&1)
if [ $? -eq 0 ] && [ "$(stat -c %a "$OUT/linked.safetensors")" = 644 ] &&
    [ "$(cat "$TMP/daemon.log")" = log ] && [ "$(stat -c %a "$TMP/daemon.log")" = 666 ]; then
    ok "an output over a hard link to a 0666 file is a new 0644 file; the linked file is untouched"
else
    fail "an output over a hard link to a 0666 file" "$o" "$(ls -l "$OUT" "$TMP/daemon.log")"
fi
if ls "$OUT" | grep -q '\.tmp\.'; then
    fail "no temporary file is left" "$(ls "$OUT")"
else
    ok "no temporary file is left"
fi
finish
