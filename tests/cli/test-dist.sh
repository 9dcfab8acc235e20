#!/bin/sh
# tests/cli/test-dist.sh: data parallelism over the MPI communication plugin, 2 ranks on this
# machine (`mpirun -np 2`, loopback). tests/dist/dist-check runs the collectives, gradient
# averaging (against the global batch's gradient in float64), 30 SGD and 30 AdamW steps
# against one process, and the refusal of a rank with another model; the same program alone
# is a world of one. Skips without Open MPI (mpirun and the comm_mpi plugin).
# make check: start 1 (the slowest first: tools/gen-lists.sh)
. "${TS_SRCDIR:-.}/tests/cli/lib.sh"
CHECK="$TS_BUILDDIR/tests/dist/dist-check"
MPIRUN=$(command -v mpirun)
if [ -z "$MPIRUN" ] || [ ! -f "$TS_BUILDDIR/plugins/comm_mpi/.libs/comm_mpi.so" ]; then
    echo "1..0 # SKIP no Open MPI (Debian packages openmpi-bin, libopenmpi-dev)"
    exit 77
fi
plan 50
# Open MPI's own allocations are not ours to report (LeakSanitizer at exit).
if [ "${TS_SANITIZERS:-no}" = yes ]; then
    ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
    export ASAN_OPTIONS
fi
# Open MPI refuses root without these; tests set them, the product never does.
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_ALLOW_RUN_AS_ROOT OMPI_ALLOW_RUN_AS_ROOT_CONFIRM
# Loopback only (no network probing), shared memory without ptrace-based single copy (not
# allowed in containers), and no more ranks than slots required.
MPI="$MPIRUN -np 2 --oversubscribe --mca btl self,vader --mca btl_vader_single_copy_mechanism none --mca pml ob1"

run2() { # MODE: every rank's output, rank 0's TAP lines and the exit status
    dir=
    [ "$1" = zero ] && dir=$TMP # where it writes its checkpoints
    timeout "$(hang_limit 120)" $MPI "$CHECK" "$1" $dir >"$TMP/$1.out" 2>"$TMP/$1.err"
}
for mode in collectives ddp steps mismatch; do
    if run2 $mode && ! grep -q "^not ok" "$TMP/$mode.out" && grep -q "^1\.\." "$TMP/$mode.out"; then
        n=$(grep -c "^ok" "$TMP/$mode.out")
        notes=$(grep "^# " "$TMP/$mode.out" | sed 's/^# //' | tr '\n' ';')
        ok "mpirun -np 2 dist-check $mode: $n checks on 2 ranks${notes:+ ($notes)}"
    else
        fail "mpirun -np 2 dist-check $mode" "$(cat "$TMP/$mode.out")" "$(tail -20 "$TMP/$mode.err")"
    fi
done
# The device-buffer paths (a backend such as NCCL that takes device memory: host collectives
# staged through the device, gradient buckets summed in device memory) run here through
# comm_devtest.so, the MPI plugin posing as a device-buffer backend on cpu_blas.
printf '[core]\nplugin_path = %s\ndevice = cpu_blas\n[dist]\nbackend = devtest\n' \
    "$TS_BUILDDIR/tests/dist/.libs" >"$TMP/devtest.ini"
for mode in collectives ddp steps mismatch zero; do
    if TESSERA_CONFIG="$TMP/devtest.ini" run2 $mode && ! grep -q "^not ok" "$TMP/$mode.out" &&
        grep -q "^1\.\." "$TMP/$mode.out"; then
        n=$(grep -c "^ok" "$TMP/$mode.out")
        ok "device-buffer backend: dist-check $mode: $n checks on 2 ranks"
    else
        fail "device-buffer backend: dist-check $mode" "$(cat "$TMP/$mode.out")" "$(tail -20 "$TMP/$mode.err")"
    fi
done
# The hierarchical all-reduce on 4 ranks posing as 2 machines of 2 ([dist] ranks_per_node):
# every sum (shards within each "machine", across, gathered) as the flat one, the gradients
# and the steps of ts_ddp too; auto below 8 ranks and off stay flat.
MPI4=$(printf '%s' "$MPI" | sed 's/-np 2/-np 4/')
for h in "on 2x2" "auto flat" "off flat"; do
    printf '[core]\ndevice = cpu_blas\n[plugin.cpu_blas]\nthreads = 1\n[dist]\nranks_per_node = 2\nhierarchical = %s\n' \
        "${h% *}" >"$TMP/hier.ini"
    modes="collectives"
    [ "${h% *}" = on ] && modes="collectives ddp steps"
    for mode in $modes; do
        if TESSERA_CONFIG="$TMP/hier.ini" DIST_CHECK_HIERARCHY="${h#* }" \
            DIST_CHECK_OVERSUBSCRIBED=1 timeout "$(hang_limit 180)" $MPI4 "$CHECK" $mode \
            >"$TMP/h.out" 2>"$TMP/h.err" && ! grep -q "^not ok" "$TMP/h.out" &&
            grep -q "^1\.\." "$TMP/h.out"; then
            ok "4 ranks, ranks_per_node 2, hierarchical ${h% *}: dist-check $mode ($(grep -c '^ok' "$TMP/h.out") checks, ${h#* })"
        else
            fail "4 ranks, hierarchical ${h% *}: dist-check $mode" "$(cat "$TMP/h.out")" \
                "$(tail -20 "$TMP/h.err")"
        fi
    done
done
# Ranks that disagree on the hierarchy (one groups by ranks_per_node, the other by host names,
# which takes a collective the first would skip) fail together when the job starts, naming
# the setting, instead of waiting in different collectives.
disagree() { # WHAT SAYS INI0 INI1: rank 0 and rank 1 started with these [dist] sections
    printf '[core]\ndevice = cpu_blas\n[dist]\n%b' "$3" >"$TMP/h0.ini"
    printf '[core]\ndevice = cpu_blas\n[dist]\n%b' "$4" >"$TMP/h1.ini"
    out=$(TMPD="$TMP" CHECKP="$CHECK" timeout "$(hang_limit 60)" $MPI sh -c \
        'TESSERA_CONFIG="$TMPD/h$OMPI_COMM_WORLD_RANK.ini" exec "$CHECKP" collectives' 2>&1)
    rc=$?
    if [ $rc -ne 0 ] && [ $rc -ne 124 ] && contains "$out" "$2"; then
        ok "ranks that disagree on [dist] $1 fail together at the start (rc $rc, no hang)"
    else
        fail "ranks that disagree on [dist] $1" "rc=$rc" "$out"
    fi
}
disagree hierarchical "disagree on [dist] hierarchical" 'ranks_per_node = 1\nhierarchical = on\n' \
    'hierarchical = on\n'
# The sharded optimizer (ZeRO stage 1, ts_optim_shard) on 2 and 4 ranks: SGD with momentum and
# AdamW equal their unsharded runs, 1/N of the state per rank, checkpoints interchangeable.
for np in 2 4; do
    run=$MPI
    [ $np = 4 ] && run=$MPI4
    if DIST_CHECK_OVERSUBSCRIBED=1 timeout "$(hang_limit 180)" $run "$CHECK" zero "$TMP" \
        >"$TMP/z.out" 2>"$TMP/z.err" && ! grep -q "^not ok" "$TMP/z.out" &&
        grep -q "^1\.\." "$TMP/z.out"; then
        notes=$(grep "^# " "$TMP/z.out" | grep bytes | sed 's/^# //' | tr '\n' ';')
        ok "mpirun -np $np dist-check zero: $(grep -c '^ok' "$TMP/z.out") checks ($notes)"
    else
        fail "mpirun -np $np dist-check zero" "$(cat "$TMP/z.out")" "$(tail -20 "$TMP/z.err")"
    fi
done
# Ranks that disagree on [dist] shard_optimizer (one would reduce-scatter where the other
# all-reduces) fail together at the start.
disagree shard_optimizer "ranks_per_node or shard_optimizer" 'shard_optimizer = true\n' ''
# A communication ABI 1.1 backend (no reduce_scatter): the host composes it from all-reduce.
printf '[core]\nplugin_path = %s\ndevice = cpu_blas\n[dist]\nbackend = v11test\n' \
    "$TS_BUILDDIR/tests/dist/.libs" >"$TMP/v11test.ini"
if TESSERA_CONFIG="$TMP/v11test.ini" run2 collectives && ! grep -q "^not ok" "$TMP/collectives.out" &&
    grep -q "reduce-scatter" "$TMP/collectives.out"; then
    ok "an ABI 1.1 backend: dist-check collectives, reduce-scatter composed from all-reduce"
else
    fail "an ABI 1.1 backend: dist-check collectives" "$(cat "$TMP/collectives.out")" \
        "$(tail -20 "$TMP/collectives.err")"
fi
out=$(TESSERA_CONFIG="$TMP/devtest.ini" TS_DEVTEST_DEVICE=no_such_device timeout "$(hang_limit 120)" $MPI "$CHECK" collectives 2>&1)
rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] &&
    contains "$out" "comm plugin 'devtest' communicates from device 'no_such_device', which cannot be opened"; then
    ok "a device-buffer backend naming a device that cannot be opened is refused, naming it"
else
    fail "a device-buffer backend naming a device that cannot be opened is refused" "rc=$rc" "$out"
fi
# only rank 1's device cannot be opened: the job ends at once, naming it, instead of rank 0
# waiting in its first collective
out=$(TESSERA_CONFIG="$TMP/devtest.ini" timeout "$(hang_limit 60)" $MPIRUN --oversubscribe --mca btl self,vader \
    --mca btl_vader_single_copy_mechanism none --mca pml ob1 -np 1 "$CHECK" collectives : \
    -np 1 env TS_DEVTEST_DEVICE=no_such_device "$CHECK" collectives 2>&1)
rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && contains "$out" "rank 1 of 2: aborting the job" &&
    contains "$out" "device 'no_such_device', which cannot be opened"; then
    ok "one rank's device cannot be opened: the job ends, naming rank 1 (no hang)"
else
    fail "one rank's device cannot be opened: the job ends" "rc=$rc" "$out"
fi
# the same program alone: a world of one, no MPI loaded
out=$("$CHECK" collectives 2>&1)
rc=$?
if [ $rc -eq 0 ] && contains "$out" "ok 1 - rank and size" && contains "$out" "1..11" &&
    ! contains "$out" "not ok"; then
    ok "alone: a world of one rank, every collective a no-op"
else
    fail "alone: a world of one rank" "$out"
fi
out=$("$CHECK" steps 2>&1)
rc=$?
if [ $rc -eq 0 ] && contains "$out" "1..2" && ! contains "$out" "not ok"; then
    ok "alone: data-parallel steps on one rank equal plain steps"
else
    fail "alone: data-parallel steps on one rank equal plain steps" "$out"
fi

# tessera train under mpirun: the global batch split over 2 ranks gives the losses of one
# process with the same batch. Each step's loss is a float32 computation whose sums (up to
# 784 terms in the first layer) are ordered differently in the two runs: n u = 784 x 6e-8
# = 5e-5 relative, so 1e-4 bounds every step's difference.
T="$TESSERA train --train-limit 1280 --epochs 3 --max-steps 50 --log-steps --json"
steps_of() { grep '"step"' "$1" | sed 's/.*"loss": \([^,]*\),.*/\1/'; }
# worst_of A B: the largest relative difference between $TMP/A.l and $TMP/B.l, 50 losses each
# ("n=COUNT" when either has another count)
worst_of() {
    paste "$TMP/$1.l" "$TMP/$2.l" | awk 'BEGIN{w=0; n=0}
        {d=($1-$2)/$1; if(d<0)d=-d; if(d>w)w=d; n++} END{if(n!=50)print "n=" n; else printf "%.2g", w}'
}
for model in mlp lenet5; do
    for opt in sgd adam; do
        $T --model $model --optimizer $opt >"$TMP/one.json" 2>"$TMP/one.err"
        timeout "$(hang_limit 300)" $MPI $T --model $model --optimizer $opt >"$TMP/two.json" 2>"$TMP/two.err"
        rc=$?
        steps_of "$TMP/one.json" >"$TMP/one.l"
        steps_of "$TMP/two.json" >"$TMP/two.l"
        worst=$(worst_of one two)
        if [ $rc -eq 0 ] && awk "BEGIN{exit !(\"$worst\" !~ /n=/ && $worst <= 1e-4)}" &&
            grep -q '"world_size": 2' "$TMP/two.json" &&
            [ "$(grep -c '"epoch"' "$TMP/two.json")" -eq "$(grep -c '"epoch"' "$TMP/one.json")" ]; then
            ok "mpirun -np 2 train --model $model --optimizer $opt: 50 losses equal one process's (worst relative difference $worst)"
        else
            fail "mpirun -np 2 train --model $model --optimizer $opt" "rc=$rc worst=$worst" \
                "$(paste "$TMP/one.l" "$TMP/two.l" | head -5)" "$(tail -5 "$TMP/two.err")"
        fi
    done
done
# the same training through the device-buffer backend (buckets summed in device memory)
TESSERA_CONFIG="$TMP/devtest.ini" timeout "$(hang_limit 300)" $MPI $T --model mlp --optimizer adam >"$TMP/dv.json" 2>"$TMP/dv.err"
rc=$?
$T --model mlp --optimizer adam --device cpu_blas >"$TMP/one.json" 2>"$TMP/one.err"
steps_of "$TMP/one.json" >"$TMP/one.l"
steps_of "$TMP/dv.json" >"$TMP/dv.l"
worst=$(worst_of one dv)
if [ $rc -eq 0 ] && awk "BEGIN{exit !(\"$worst\" !~ /n=/ && $worst <= 1e-4)}"; then
    ok "device-buffer backend: mpirun -np 2 train --model mlp --optimizer adam: 50 losses equal one process's (worst $worst)"
else
    fail "device-buffer backend: mpirun -np 2 train --model mlp" "rc=$rc worst=$worst" "$(tail -5 "$TMP/dv.err")"
fi
# the GPT: a global batch of 5 windows split 3 + 2 over the ranks (each rank's mean loss weighted
# by its share), AdamW with clipping, 50 steps; the sums run over at most 256 logits or 64
# features per output, the same n u bound as above holds with room. Validation losses are
# shared out by batch and summed, so they match too.
awk 'BEGIN { split("the quick brown fox jumps over a lazy dog and a curious cat", w, " ");
    s = 7; while (n < 20000) { s = (s * 1103515245 + 12345) % 2147483648; x = w[1 + int(s / 65536) % 12] " ";
    printf "%s", x; n += length(x) } }' >"$TMP/g.txt"
G="$TESSERA train --model gpt --text $TMP/g.txt --context 16 --layers 1 --heads 2 --embd 16 \
--batch-size 5 --steps 50 --warmup-steps 5 --lr 3e-3 --eval-every 25 --eval-batches 3 --log-steps --json"
$G >"$TMP/g1.json" 2>"$TMP/g1.err"
timeout "$(hang_limit 300)" $MPI $G >"$TMP/g2.json" 2>"$TMP/g2.err"
rc=$?
gpt_losses() { # FILE...: the GPT's per-step losses of these --json outputs, in order
    cat "$@" | grep '"step": [0-9]*, "loss"' | sed 's/.*"loss": \([^,]*\),.*/\1/'
}
gpt_losses "$TMP/g1.json" >"$TMP/g1.l"
gpt_losses "$TMP/g2.json" >"$TMP/g2.l"
vals() { sed -n 's/.*"val_loss": \([^,]*\),.*/\1/p' "$1" | tr '\n' ' '; }
worst=$(worst_of g1 g2)
vworst=$(echo "$(vals "$TMP/g1.json")" "$(vals "$TMP/g2.json")" | awk '{ if (NF != 4) { print "nf=" NF; exit }
    w = 0; for (i = 1; i <= 2; i++) { d = ($i - $(i + 2)) / $i; if (d < 0) d = -d; if (d > w) w = d } printf "%.2g", w }')
if [ $rc -eq 0 ] && awk "BEGIN{exit !(\"$worst$vworst\" !~ /n/ && $worst <= 1e-4 && $vworst <= 1e-4)}" &&
    [ "$(grep -c '"world_size": 2' "$TMP/g2.json")" -eq 2 ] && [ "$(grep -c '"val_loss"' "$TMP/g2.json")" -eq 2 ]; then
    ok "mpirun -np 2 train --model gpt (batch 5 as 3 + 2): 50 losses and 2 validation losses equal one process's (worst $worst, validation $vworst)"
else
    fail "mpirun -np 2 train --model gpt" "rc=$rc worst=$worst validation=$vworst" \
        "$(paste "$TMP/g1.l" "$TMP/g2.l" | head -5)" "$(tail -5 "$TMP/g2.err")" "$(tail -3 "$TMP/g2.json")"
fi
# Gradient accumulation under data parallelism: each rank's share in micro-batches (the GPT's
# 3 + 2 rows as 2 + 1 and 1 + 1), the buckets summed once, after the last micro-batch; with
# checkpointed blocks. The same losses as one process without either, to the bound above.
timeout "$(hang_limit 300)" $MPI $G --accumulate 2 --checkpoint-activations on >"$TMP/g3.json" 2>"$TMP/g3.err"
rc=$?
gpt_losses "$TMP/g3.json" >"$TMP/g3.l"
worst=$(worst_of g1 g3)
if [ $rc -eq 0 ] && awk "BEGIN{exit !(\"$worst\" !~ /n/ && $worst <= 1e-4)}"; then
    ok "mpirun -np 2 train --model gpt --accumulate 2 --checkpoint-activations on: 50 losses equal one process's (worst $worst)"
else
    fail "mpirun -np 2 train --model gpt --accumulate 2" "rc=$rc worst=$worst" \
        "$(paste "$TMP/g1.l" "$TMP/g3.l" | head -5)" "$(tail -5 "$TMP/g3.err")"
fi
$T --model mlp --optimizer sgd >"$TMP/one.json" 2>"$TMP/one.err"
timeout "$(hang_limit 300)" $MPI $T --model mlp --optimizer sgd --accumulate 3 >"$TMP/acc.json" 2>"$TMP/acc.err"
rc=$?
steps_of "$TMP/one.json" >"$TMP/one.l"
steps_of "$TMP/acc.json" >"$TMP/acc.l"
worst=$(worst_of one acc)
if [ $rc -eq 0 ] && awk "BEGIN{exit !(\"$worst\" !~ /n=/ && $worst <= 1e-4)}"; then
    ok "mpirun -np 2 train --model mlp --accumulate 3: 50 losses equal one process's without (worst $worst)"
else
    fail "mpirun -np 2 train --model mlp --accumulate 3" "rc=$rc worst=$worst" \
        "$(paste "$TMP/one.l" "$TMP/acc.l" | head -5)" "$(tail -5 "$TMP/acc.err")"
fi
# a --save path rank 0 cannot write ends the whole job at once (the other ranks would wait
# for rank 0 in a collective); a rank with another --eval-every (another sequence of
# collectives) is refused before any step
out=$(timeout "$(hang_limit 60)" $MPI $G --save "$TMP" 2>&1)
rc=$?
out2=$(timeout "$(hang_limit 60)" $MPIRUN --oversubscribe --mca btl self,vader --mca btl_vader_single_copy_mechanism none \
    --mca pml ob1 -np 1 $G : -np 1 $G --eval-every 10 2>&1)
rc2=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] && contains "$out" "rank 0: --save: $TMP: cannot save the checkpoint" &&
    [ $rc2 -ne 0 ] && [ $rc2 -ne 124 ] && contains "$out2" "rank 1 was started with other optimizer, schedule, evaluation"; then
    ok "gpt: a --save rank 0 cannot write ends the job; another --eval-every on rank 1 is refused"
else
    fail "gpt: bad --save ends the job, another --eval-every refused" "rc=$rc rc2=$rc2" "$out" "$out2"
fi
# a rank started otherwise is refused, on every rank, naming it
out=$(timeout "$(hang_limit 120)" $MPIRUN --oversubscribe --mca btl self,vader --mca btl_vader_single_copy_mechanism none \
    --mca pml ob1 -np 1 $T --model mlp : -np 1 $T --model mlp --seed 7 2>&1)
rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] &&
    [ "$(echo "$out" | grep -c 'rank 1 was started with another --seed than rank 0')" -eq 2 ]; then
    ok "a rank started with another --seed is refused on both ranks"
else
    fail "a rank started with another --seed is refused on both ranks" "rc=$rc" "$out"
fi
# a rank given other images (--data naming a copy with one test label changed) is refused on
# both ranks before any step
FM=/usr/share/datasets/fashion-mnist
mkdir -p "$TMP/fm2"
cp "$FM"/*.gz "$TMP/fm2/" 2>/dev/null
gunzip -c "$FM/t10k-labels-idx1-ubyte.gz" >"$TMP/labels"
last=$(tail -c 1 "$TMP/labels" | od -An -tu1 | tr -d ' ')
{ head -c $(($(wc -c <"$TMP/labels") - 1)) "$TMP/labels"; printf "\\$(printf %o $(((last + 1) % 10)))"; } |
    gzip -c >"$TMP/fm2/t10k-labels-idx1-ubyte.gz"
out=$(timeout "$(hang_limit 120)" $MPIRUN --oversubscribe --mca btl self,vader --mca btl_vader_single_copy_mechanism none \
    --mca pml ob1 -np 1 $T --model mlp : -np 1 $T --model mlp --data "$TMP/fm2" 2>&1)
rc=$?
if [ $rc -ne 0 ] && [ $rc -ne 124 ] &&
    [ "$(echo "$out" | grep -c 'rank 1 was started with other images or labels')" -eq 2 ]; then
    ok "a rank given other images or labels (--data) is refused on both ranks"
else
    fail "a rank given other images or labels (--data) is refused on both ranks" "rc=$rc" "$out"
fi
# a rank killed mid-epoch ends the job within 30 s, naming the rank
timeout "$(hang_limit 100)" $MPI $TESSERA train --model mlp --epochs 20 --json >"$TMP/k.out" 2>"$TMP/k.err" &
mp=$!
killed=""
i=0
tries=$((10 * $(hang_limit 30))) # 30 s for the first epoch, more on a busy machine
while [ -z "$killed" ] && [ $i -lt $tries ]; do
    sleep 0.1
    i=$((i + 1))
    grep -q '"epoch": 1' "$TMP/k.out" 2>/dev/null || continue
    for p in $(pgrep -f "tessera train --model mlp --epochs 20 --json"); do
        if tr '\0' '\n' </proc/$p/environ 2>/dev/null | grep -q '^OMPI_COMM_WORLD_RANK=1$'; then
            kill -9 "$p" && killed=$p
        fi
    done
done
t0=$(date +%s)
wait $mp
rc=$?
secs=$(($(date +%s) - t0))
if [ -n "$killed" ] && [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $secs -le 30 ] &&
    grep -q "rank 1 .*signal 9" "$TMP/k.err"; then
    ok "killing rank 1 mid-epoch ends the job in ${secs} s: $(grep 'rank 1' "$TMP/k.err" | head -1)"
else
    fail "killing rank 1 mid-epoch ends the job within 30 s" "killed=$killed rc=$rc after $secs s" \
        "$(tail -8 "$TMP/k.err")"
fi
# a checkpoint written by 2 ranks (rank 0 alone writes it) resumes on 1: 25 + 25 = 50 straight
R="$TESSERA train --model mlp --train-limit 1280 --epochs 3 --log-steps --json"
timeout "$(hang_limit 120)" $MPI $R --max-steps 25 --save "$TMP/dp.ckpt" >"$TMP/a.json" 2>"$TMP/a.err"
rc1=$?
$R --max-steps 50 --resume "$TMP/dp.ckpt" >"$TMP/b.json" 2>"$TMP/b.err"
rc2=$?
$R --max-steps 50 >"$TMP/c.json" 2>&1
cat "$TMP/a.json" "$TMP/b.json" >"$TMP/ab.json"
steps_of "$TMP/ab.json" >"$TMP/ab.l"
steps_of "$TMP/c.json" >"$TMP/c.l"
worst=$(worst_of ab c)
if [ $rc1 -eq 0 ] && [ $rc2 -eq 0 ] && awk "BEGIN{exit !(\"$worst\" !~ /n=/ && $worst <= 1e-4)}"; then
    ok "2 ranks save at step 25, 1 process resumes to 50: the losses of 50 straight (worst $worst)"
else
    fail "2 ranks save, 1 process resumes" "rc=$rc1/$rc2 worst=$worst" "$(tail -3 "$TMP/a.err")" \
        "$(tail -3 "$TMP/b.err")"
fi
# across world sizes: a checkpoint of 4 ranks resumes on 2 and on 1, one of 1 process on 4,
# each to the losses of a straight run on the world it resumes on (the global batch is the
# same; the data order and the random streams are functions of the global step and row)
timeout "$(hang_limit 180)" $MPI4 $R --max-steps 25 --save "$TMP/w4.ckpt" >"$TMP/w4.json" 2>"$TMP/w4.err"
rc4=$?
$R --max-steps 25 --save "$TMP/w1.ckpt" >"$TMP/w1.json" 2>"$TMP/w1.err"
rc1=$?
for case in "4 2" "4 1" "1 4"; do
    from=${case% *} to=${case#* }
    case $to in
    1) run_on="" ;;
    2) run_on="$MPI" ;;
    4) run_on="$MPI4" ;;
    esac
    cp "$TMP/w$from.ckpt" "$TMP/c$from$to.ckpt" # a resumed run saves back into its checkpoint
    timeout "$(hang_limit 180)" $run_on $R --max-steps 50 --resume "$TMP/c$from$to.ckpt" \
        >"$TMP/r$from$to.json" 2>"$TMP/r$from$to.err"
    rcr=$?
    timeout "$(hang_limit 180)" $run_on $R --max-steps 50 >"$TMP/s$to.json" 2>&1
    rcs=$?
    cat "$TMP/w$from.json" "$TMP/r$from$to.json" >"$TMP/x.json"
    steps_of "$TMP/x.json" >"$TMP/x.l"
    steps_of "$TMP/s$to.json" >"$TMP/s.l"
    worst=$(worst_of x s)
    if [ $rc4 -eq 0 ] && [ $rc1 -eq 0 ] && [ $rcr -eq 0 ] && [ $rcs -eq 0 ] &&
        awk "BEGIN{exit !(\"$worst\" !~ /n=/ && $worst <= 1e-4)}"; then
        ok "a checkpoint of $from rank(s) resumes on $to: the losses of 50 straight steps on $to (worst $worst)"
    else
        fail "a checkpoint of $from rank(s) resumes on $to" "rc=$rc4/$rc1/$rcr/$rcs worst=$worst" \
            "$(tail -3 "$TMP/r$from$to.err")"
    fi
done
# tessera train with [dist] shard_optimizer = true: Adam on 2 and 4 ranks and SGD with momentum
# on 2 give the unsharded runs' losses; a sharded 4-rank checkpoint resumes unsharded in one
# process, a 1-process checkpoint sharded on 2 ranks, each to the straight run's losses.
{ cat "$TESSERA_CONFIG"; printf '\n[dist]\nshard_optimizer = true\n'; } >"$TMP/shard.ini"
zrun() { # NP OUT ARGS...: a sharded run of $R on NP ranks
    np=$1 out=$2
    shift 2
    run=$MPI
    [ "$np" = 4 ] && run=$MPI4
    TESSERA_CONFIG="$TMP/shard.ini" timeout "$(hang_limit 180)" $run $R "$@" >"$TMP/$out.json" \
        2>"$TMP/$out.err"
}
zcmp() { # WHAT RC A B: the losses of runs A and B agree
    steps_of "$TMP/$3.json" >"$TMP/$3.l"
    steps_of "$TMP/$4.json" >"$TMP/$4.l"
    worst=$(worst_of "$3" "$4")
    if [ "$2" -eq 0 ] && awk "BEGIN{exit !(\"$worst\" !~ /n=/ && $worst <= 1e-4)}"; then
        ok "$1 (worst $worst)"
    else
        fail "$1" "rc=$2 worst=$worst" "$(tail -3 "$TMP/$3.err")" "$(paste "$TMP/$3.l" "$TMP/$4.l" | head -3)"
    fi
}
zrun 2 z2 --max-steps 50
zcmp "train on 2 ranks, Adam sharded: the unsharded run's 50 losses" $? z2 s2
zrun 4 z4 --max-steps 50
zcmp "train on 4 ranks, Adam sharded: the unsharded run's 50 losses" $? z4 s4
timeout "$(hang_limit 180)" $MPI $R --max-steps 50 --optimizer sgd --momentum 0.9 >"$TMP/m2.json" 2>&1
zrun 2 zm2 --max-steps 50 --optimizer sgd --momentum 0.9
zcmp "train on 2 ranks, SGD with momentum sharded: the unsharded run's 50 losses" $? zm2 m2
zrun 4 zc4 --max-steps 25 --save "$TMP/zc4.ckpt"
rc=$?
$R --max-steps 50 --resume "$TMP/zc4.ckpt" >"$TMP/zr41.json" 2>"$TMP/zr41.err" || rc=1
cat "$TMP/zc4.json" "$TMP/zr41.json" >"$TMP/zx.json"
zcmp "a sharded 4-rank checkpoint resumes unsharded in one process: 50 straight steps' losses" $rc zx s1
cp "$TMP/w1.ckpt" "$TMP/zc1.ckpt"
zrun 2 zr12 --max-steps 50 --resume "$TMP/zc1.ckpt"
rc=$?
cat "$TMP/w1.json" "$TMP/zr12.json" >"$TMP/zy.json"
zcmp "a 1-process checkpoint resumes sharded on 2 ranks: 50 straight steps' losses" $rc zy s2
TESSERA_CONFIG="$TMP/shard.ini" timeout "$(hang_limit 300)" $MPI $G >"$TMP/gz.json" 2>"$TMP/gz.err"
rc=$?
gpt_losses "$TMP/gz.json" >"$TMP/gz.l"
worst=$(worst_of g2 gz)
vworst=$(echo "$(vals "$TMP/g2.json")" "$(vals "$TMP/gz.json")" | awk '{ if (NF != 4) { print "nf=" NF; exit }
    w = 0; for (i = 1; i <= 2; i++) { d = ($i - $(i + 2)) / $i; if (d < 0) d = -d; if (d > w) w = d } printf "%.2g", w }')
if [ $rc -eq 0 ] && awk "BEGIN{exit !(\"$worst$vworst\" !~ /n/ && $worst <= 1e-4 && $vworst <= 1e-4)}"; then
    ok "train --model gpt on 2 ranks, AdamW sharded (decay groups, clipping): the unsharded run's 50 losses and 2 validation losses (worst $worst, validation $vworst)"
else
    fail "train --model gpt sharded on 2 ranks" "rc=$rc worst=$worst validation=$vworst" \
        "$(paste "$TMP/g2.l" "$TMP/gz.l" | head -5)" "$(tail -5 "$TMP/gz.err")"
fi
# A user can see that sharding took effect: the --json start record says so (and says not on
# the unsharded runs), as does the data-parallel line of each trainer's header.
starts() { for f in "$@"; do grep -o '"optimizer_sharded":[a-z]*' "$TMP/$f.json" | head -1; done | tr '\n' ' '; }
said=$(starts z2 z4 gz s2 g2)
TESSERA_CONFIG="$TMP/shard.ini" timeout "$(hang_limit 180)" $MPI $TESSERA train --model mlp \
    --train-limit 640 --epochs 1 >"$TMP/zh.out" 2>&1
TESSERA_CONFIG="$TMP/shard.ini" timeout "$(hang_limit 180)" $MPI ${G%--json} --max-steps 2 \
    >>"$TMP/zh.out" 2>&1
header=$(tr '\n' ' ' <"$TMP/zh.out" | grep -o "state sharded over them, 1/2 on each" | wc -l)
if [ "$said" = '"optimizer_sharded":true "optimizer_sharded":true "optimizer_sharded":true "optimizer_sharded":false "optimizer_sharded":false ' ] &&
    [ "$header" -eq 2 ]; then
    ok "sharding is reported: the start records (true sharded, false not) and both trainers' headers"
else
    fail "sharding reported" "start records: $said; headers saying it: $header" "$(head -8 "$TMP/zh.out")"
fi

# float16 with loss scaling and 2 micro-batches, sharded: the scaler's skip verdict taken from
# every rank's share, the accumulated gradients reduce-scattered once: the unsharded losses
timeout "$(hang_limit 300)" $MPI $G --precision fp16 --accumulate 2 >"$TMP/gf.json" 2>"$TMP/gf.err"
rc=$?
TESSERA_CONFIG="$TMP/shard.ini" timeout "$(hang_limit 300)" $MPI $G --precision fp16 --accumulate 2 \
    >"$TMP/gfz.json" 2>"$TMP/gfz.err" || rc=1
gpt_losses "$TMP/gf.json" >"$TMP/gf.l"
gpt_losses "$TMP/gfz.json" >"$TMP/gfz.l"
worst=$(worst_of gf gfz)
if [ $rc -eq 0 ] && awk "BEGIN{exit !(\"$worst\" !~ /n/ && $worst <= 1e-4)}"; then
    ok "train --model gpt --precision fp16 --accumulate 2 on 2 ranks, sharded: the unsharded run's 50 losses (worst $worst)"
else
    fail "gpt fp16 --accumulate 2 sharded on 2 ranks" "rc=$rc worst=$worst" \
        "$(paste "$TMP/gf.l" "$TMP/gfz.l" | head -5)" "$(tail -5 "$TMP/gfz.err")"
fi
# the GPT across world sizes, sharded: 2 ranks with the optimizer sharded save at step 25 (the
# state gathered on rank 0), one process resumes: the losses of 50 straight steps in one
TESSERA_CONFIG="$TMP/shard.ini" timeout "$(hang_limit 300)" $MPI $G --max-steps 25 \
    --save "$TMP/gz.ckpt" >"$TMP/gza.json" 2>"$TMP/gza.err"
rc=$?
$G --resume "$TMP/gz.ckpt" >"$TMP/gzb.json" 2>"$TMP/gzb.err" || rc=1
gpt_losses "$TMP/gza.json" "$TMP/gzb.json" >"$TMP/gzab.l"
worst=$(worst_of g1 gzab)
if [ $rc -eq 0 ] && awk "BEGIN{exit !(\"$worst\" !~ /n/ && $worst <= 1e-4)}"; then
    ok "gpt: a sharded 2-rank checkpoint at step 25 resumes in one process: 50 straight steps' losses (worst $worst)"
else
    fail "gpt: a sharded 2-rank checkpoint resumes in one process" "rc=$rc worst=$worst" \
        "$(tail -3 "$TMP/gza.err")" "$(tail -3 "$TMP/gzb.err")" "$(paste "$TMP/g1.l" "$TMP/gzab.l" | sed -n '24,28p')"
fi
# under a device-buffer backend (NCCL's kind; here comm_devtest on cpu_blas) the buckets are
# reduce-scattered and the parameters all-gathered in the device's memory: the same losses
{ cat "$TMP/devtest.ini"; printf 'shard_optimizer = true\n'; } >"$TMP/devz.ini"
TESSERA_CONFIG="$TMP/devz.ini" timeout "$(hang_limit 180)" $MPI $R --max-steps 50 \
    >"$TMP/zd2.json" 2>"$TMP/zd2.err"
zcmp "device-buffer backend: train on 2 ranks, Adam sharded: the unsharded run's 50 losses" $? zd2 s2
# bench dist, short: tessera's all-reduce and the raw MPI_Allreduce both measured, the bucketed
# averaging and training run, nothing allocated per steady step
out=$(timeout "$(hang_limit 120)" $MPI "$TESSERA" bench dist --iters 3 --max-mib 1 --steps 20 --json 2>&1)
vals=$(echo "$out" | "$JSON_CHECK" world_size backend train.raw_allocs_per_step 2>/dev/null)
raw=$(echo "$out" | "$JSON_CHECK" allreduce.[0].raw_ms ddp.raw_ms 2>/dev/null)
if contains "$vals" "world_size=2" && contains "$vals" 'backend="mpi"' &&
    contains "$vals" "train.raw_allocs_per_step=0" && [ -n "$raw" ] &&
    ! contains "$raw" "raw_ms=0
"; then
    ok "mpirun -np 2 bench dist: all-reduce next to raw MPI_Allreduce, no allocation per step"
else
    fail "mpirun -np 2 bench dist" "$vals" "$raw" "$out"
fi
finish
