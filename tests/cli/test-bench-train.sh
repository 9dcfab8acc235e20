#!/bin/sh
# tests/cli/test-bench-train.sh: the configurable models (--model, --hidden, --channels,
# --init) of `tessera train` and `tessera bench train`, every misuse with its one clear error,
# and `tessera bench train --json` as a quick smoke run on synthetic data: it parses, builds
# the network asked for, runs on every cpu_* backend with --device all, and a steady-state
# step makes no raw pool allocation and no host malloc from tessera's own code and creates no
# thread on any cpu_* plugin; --profile reports each kernel's calls per step. --model gpt:
# its floor's GEMM count, tokens/s and the same zero counts; bench gpt's short run likewise.
# make check: start 5 (the slowest first: tools/gen-lists.sh)
. "${TS_SRCDIR:-.}/tests/cli/lib.sh"
plan 18
# LeakSanitizer's exit-time tracer crashes once oneDNN's primitives have run their threads
# (see tests/plugins/test-onednn.c); --device all runs cpu_onednn.
if [ "${TS_SANITIZERS:-no}" = yes ]; then
    ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
    export ASAN_OPTIONS
fi
QUICK="--synthetic --steps 3 --warmup 2 --batch-size 16 --json"

# misuse: each exits 2 with one line naming the problem, for both commands
bad=""
for cmd in train "bench train"; do
    while IFS='|' read -r args want; do
        out=$("$TESSERA" $cmd $args 2>&1)
        rc=$?
        if [ $rc -ne 2 ] || ! contains "$out" "$want" || [ "$(echo "$out" | wc -l)" -ne 1 ]; then
            bad="$bad
$cmd $args: rc=$rc: $out"
        fi
    done <<EOF
--model resnet|unknown model 'resnet'
--model|--model needs a value
--model lenet5 --hidden 100|--hidden applies to --model mlp or cnn, not lenet5
--model mlp --channels 8|--channels applies to --model cnn, not mlp
--model mlp --hidden 0|each size must be 1..65536
--model mlp --hidden 256,|expected sizes like 256,128
--model mlp --hidden 256,abc|expected sizes like 256,128
--model mlp --hidden 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17|at most 16 layers
--model cnn --channels 4,4,4,4,4|at most 4 conv blocks
--model cnn --channels 5000|each size must be 1..4096
--init uniform|unknown --init 'uniform'
--init normal:|the standard deviation must be a number > 0
--init normal:-1|the standard deviation must be a number > 0
--init normal:0.1x|the standard deviation must be a number > 0
--optimizer rmsprop|unknown optimizer 'rmsprop'
EOF
done
if [ -z "$bad" ]; then
    ok "every bad model, init or optimizer option exits 2 with one clear line (train, bench train)"
else
    fail "every bad model, init or optimizer option exits 2 with one clear line" "$bad"
fi

bad=""
while IFS='|' read -r args want; do
    out=$("$TESSERA" bench train $args 2>&1)
    rc=$?
    if [ $rc -ne 2 ] || ! contains "$out" "$want"; then
        bad="$bad
$args: rc=$rc: $out"
    fi
done <<EOF
--steps 0|--steps '0' is out of range: expected 1..100000
--batch-size x|--batch-size 'x' is not a whole number (expected 1..60000)
--warmup -1|--warmup '-1' is out of range: expected 0..100000
--lr 0|--lr '0' is out of range: expected a finite number > 0
--steps|--steps needs a value
--frobnicate|unexpected argument '--frobnicate'
EOF
if [ -z "$bad" ] && "$TESSERA" bench train --help | grep -q "usage: tessera bench train"; then
    ok "bench train: bad numbers and unknown arguments exit 2; --help prints the usage"
else
    fail "bench train: bad numbers and unknown arguments exit 2" "$bad"
fi

# The networks asked for, counted by parameters (weights + biases):
#   mlp --hidden 500: 784*500+500 + 500*10+10 = 397510
#   mlp --hidden 256,128 (the default): 200960 + 32896 + 1290 = 235146
#   cnn --channels 8,16: (9*8+8) + (8*9*16+16) + (16*7*7*10+10) = 80 + 1168 + 7850 = 9098
#   cnn --channels 4 --hidden 32: 40 + (4*14*14*32+32) + (32*10+10) = 40 + 25120 + 330 = 25490
#   lenet5: 156 + 2416 + 48120 + 10164 + 850 = 61706
bad=""
while IFS='|' read -r args want; do
    out=$("$TESSERA" bench train $args $QUICK --device cpu_blas 2>&1)
    got=$(echo "$out" | "$JSON_CHECK" results.[0].parameters 2>/dev/null | sed 's/.*=//')
    [ "$got" = "$want" ] || bad="$bad
$args: want $want parameters, got '$got': $(echo "$out" | tail -2)"
done <<EOF
--model mlp --hidden 500|397510
--model mlp|235146
--model cnn --channels 8,16|9098
--model cnn --channels 4 --hidden 32 --init normal:0.01|25490
--model lenet5 --init xavier --optimizer sgd --lr 0.1|61706
EOF
if [ -z "$bad" ]; then
    ok "bench train builds the networks asked for (parameter counts of 5 models)"
else
    fail "bench train builds the networks asked for" "$bad"
fi

out=$("$TESSERA" bench train --model mlp --hidden 64 $QUICK --device cpu_blas 2>&1)
if echo "$out" | "$JSON_CHECK" model optimizer batch_size steps warmup data floor_gemms \
        floor_gflop loadavg results.[0].device results.[0].threads results.[0].ms_median \
        results.[0].ms_p10 results.[0].ms_p90 results.[0].images_per_s results.[0].floor_ms \
        results.[0].step_over_floor results.[0].raw_allocs_per_step \
        results.[0].pool_allocs_per_step results.[0].tessera_mallocs_per_step \
        results.[0].all_mallocs_per_step >"$TMP/fields" &&
        grep -q '^data="synthetic"$' "$TMP/fields" && grep -q '^model="mlp --hidden 64"$' "$TMP/fields" &&
        grep -q '^floor_gemms=5$' "$TMP/fields"; then
    ok "--json: one object with the run, the floor and each device's figures"
else
    fail "--json: one object with the run, the floor and each device's figures" "$out"
fi

# The device floor: the step's GEMMs through the device's own matmul, in each precision's
# matmul dtype (a positive time; which dtype it ran in).
out=$("$TESSERA" bench train --model mlp --hidden 64 $QUICK --device cpu_blas --precision fp32,bf16 2>&1)
f=$(echo "$out" | "$JSON_CHECK" results.[0].device_floor_dtype results.[1].device_floor_dtype \
    results.[0].device_floor_ms results.[1].device_floor_ms 2>&1)
if echo "$f" | grep -q '^results.\[0\].device_floor_dtype="float32"$' &&
        echo "$f" | grep -q '^results.\[1\].device_floor_dtype="bfloat16"$' &&
        [ "$(echo "$f" | grep '_ms=' | sed 's/.*=//' | awk '$1 > 0 {n++} END {print n}')" = 2 ]; then
    ok "--precision fp32,bf16: each row's device floor, in float32 and bfloat16: $(echo $f)"
else
    fail "--precision fp32,bf16: each row's device floor in its matmul dtype" "$out"
fi

# A device floor whose operands (every GEMM's at once) do not fit the pool where the step
# did (fused attention builds no T x T scores) leaves the row, with a warning and nulls.
# A 64 MiB pool: the fraction of this machine's memory as `tessera info` reports it.
total=$("$TESSERA" info 2>/dev/null | awk '/memory: .* total/ {
    v = $2; if ($3 == "TiB") v *= 1048576; else if ($3 == "GiB") v *= 1024;
    else if ($3 != "MiB") v = 0; print v; exit }')
frac=$(awk -v t="${total:-0}" 'BEGIN { if (t > 128) printf "%.7f", 64 / t }')
if [ -z "$frac" ]; then
    skip "a device floor that does not fit the pool leaves the row" "no memory total: $total"
else
    sed "s/^memory_fraction *=.*/memory_fraction = $frac/" "$TESSERA_CONFIG" >"$TMP/small.ini"
    out=$(TESSERA_CONFIG="$TMP/small.ini" "$TESSERA" bench train --model gpt --context 512 \
        --batch-size 4 --layers 1 --heads 4 --embd 64 --attention fused --steps 3 --warmup 1 \
        --device cpu_blas --json 2>"$TMP/err")
    rc=$?
    f=$(echo "$out" | "$JSON_CHECK" results.[0].ms_median results.[0].device_floor_ms 2>&1)
    if [ $rc -eq 0 ] && echo "$f" | grep -q '^results.\[0\].device_floor_ms=null$' &&
            grep -q "warning: bench train: no device floor on 'cpu_blas'" "$TMP/err"; then
        ok "a device floor that does not fit the pool leaves the row: $(echo $f)"
    else
        fail "a device floor that does not fit the pool leaves the row" \
            "memory_fraction $frac: rc=$rc $out $(cat "$TMP/err")"
    fi
fi

# Zero allocations per steady-state step: a count, not a timing. Sanitizer builds are left
# out: the pool there may bypass its cache, and malloc belongs to ASan (not counted).
if [ "${TS_SANITIZERS:-no}" = yes ]; then
    skip "steady-state steps allocate nothing" "sanitizer build"
    skip "steady-state conv steps allocate nothing" "sanitizer build"
else
    for m in "--model mlp --hidden 64" "--model cnn --channels 4,8"; do
        out=$("$TESSERA" bench train $m $QUICK --device cpu_blas 2>&1)
        f=$(echo "$out" | "$JSON_CHECK" results.[0].raw_allocs_per_step \
            results.[0].tessera_mallocs_per_step 2>&1)
        if [ "$(echo "$f" | sed 's/.*=//' | awk '$1 == 0 {n++} END {print n}')" = 2 ]; then
            ok "steady-state steps allocate nothing ($m): $(echo $f)"
        else
            fail "steady-state steps allocate nothing ($m)" "$out"
        fi
    done
fi

# No thread is created in a steady step, for every model on every cpu_* plugin: each kernel
# runs on the thread pools started by the first steps. A count, not a timing. (A parallel
# region nested inside another, even inside an inactive team of one, gets a fresh team of
# threads from libgomp every time: cpu_blas's convolutions did that for the default cnn,
# 96 threads per step at batch 16.) Not counted in sanitizer builds, which own pthread_create.
if [ "${TS_SANITIZERS:-no}" = yes ]; then
    skip "steady-state steps create no thread" "sanitizer build: not counted"
    skip "the thread counter sees the first step's thread pools" "sanitizer build: not counted"
else
    bad="" seen=""
    for m in "--model mlp" "--model lenet5" "--model cnn" "--model cnn --channels 8 --hidden 32"; do
        out=$("$TESSERA" bench train $m $QUICK --device all 2>&1)
        i=0
        while [ $i -lt 16 ]; do
            dev=$(echo "$out" | "$JSON_CHECK" "results.[$i].device" 2>/dev/null | sed 's/.*=//; s/"//g')
            [ -z "$dev" ] && break
            n=$(echo "$out" | "$JSON_CHECK" "results.[$i].threads_created_per_step" 2>/dev/null |
                sed 's/.*=//')
            seen="$seen $dev"
            case $n in # a number (not null, which awk would read as an unset variable, 0)
            '' | *[!0-9.]*) n_ok=no ;;
            *) n_ok=yes ;;
            esac
            if [ $n_ok = no ] || ! awk "BEGIN{exit !($n == 0)}"; then
                bad="$bad
$m on $dev: threads_created_per_step='$n'"
            fi
            i=$((i + 1))
        done
        [ $i -eq 0 ] && bad="$bad
$m: no result: $out"
    done
    if [ -z "$bad" ]; then
        ok "steady-state steps create no thread (mlp, lenet5, cnn 32,64, cnn 8 on:$(echo $seen | tr ' ' '\n' | sort -u | tr '\n' ' '))"
    else
        fail "steady-state steps create no thread" "$bad"
    fi
    # The counter is real: with no warm-up the first step starts the plugin's OpenMP team.
    out=$("$TESSERA" bench train --model mlp --hidden 64 --synthetic --steps 1 --warmup 0 \
        --batch-size 16 --json --device cpu_blas 2>&1)
    n=$(echo "$out" | "$JSON_CHECK" results.[0].threads_created_per_step 2>/dev/null | sed 's/.*=//')
    if echo "$n" | grep -Eq '^[0-9]+(\.[0-9]+)?$' && awk "BEGIN{exit !($n > 0)}"; then
        ok "the thread counter sees the first step's thread pools ($n per step)"
    else
        fail "the thread counter sees the first step's thread pools" "$out"
    fi
fi

# The counter is real: without warm-up the first step creates the optimizer state and
# gradients, which tessera's own code allocates.
if [ "${TS_SANITIZERS:-no}" = yes ]; then
    skip "the malloc counter sees tessera's first-step allocations" "sanitizer build: not counted"
else
    out=$("$TESSERA" bench train --model mlp --hidden 64 --synthetic --steps 1 --warmup 0 \
        --batch-size 16 --json --device cpu_blas 2>&1)
    n=$(echo "$out" | "$JSON_CHECK" results.[0].tessera_mallocs_per_step 2>/dev/null | sed 's/.*=//')
    if [ -n "$n" ] && awk "BEGIN{exit !($n > 0)}"; then
        ok "the malloc counter sees tessera's first-step allocations ($n)"
    else
        fail "the malloc counter sees tessera's first-step allocations" "$out"
    fi
fi

# Checkpoints record the architecture: resuming with other widths is one clear error.
if [ ! -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ]; then
    skip "--resume refuses another architecture" "Fashion-MNIST is not installed (dataset-fashion-mnist)"
else
    "$TESSERA" train --model mlp --hidden 32 --train-limit 256 --max-steps 2 \
        --save "$TMP/h32.ckpt" --json >/dev/null 2>"$TMP/e1"
    out=$("$TESSERA" train --model mlp --hidden 64 --train-limit 256 --max-steps 4 \
        --resume "$TMP/h32.ckpt" 2>&1)
    rc=$?
    if [ $rc -eq 1 ] && contains "$out" "holds a 'mlp --hidden 32' model, not 'mlp --hidden 64'"; then
        ok "--resume refuses another architecture"
    else
        fail "--resume refuses another architecture" "rc=$rc" "$out" "$(cat "$TMP/e1")"
    fi
fi

out=$("$TESSERA" bench train --model mlp --hidden 32 $QUICK --device all 2>&1)
devs=$(echo "$out" | "$JSON_CHECK" results.[0].device results.[1].device 2>/dev/null)
if [ -f "$TS_BUILDDIR/plugins/cpu_onednn/.libs/cpu_onednn.so" ]; then
    want='results.[0].device="cpu_blas"
results.[1].device="cpu_onednn"'
else
    want='results.[0].device="cpu_blas"'
    devs=$(echo "$out" | "$JSON_CHECK" results.[0].device 2>/dev/null)
fi
if [ "$devs" = "$want" ]; then
    ok "--device all runs every cpu_* backend in one invocation"
else
    fail "--device all runs every cpu_* backend in one invocation" "$out"
fi
# --profile: one forward conv per step for a one-conv CNN, counted per timed step; the text
# form ends with the time outside kernels.
out=$("$TESSERA" bench train --model cnn --channels 4 --synthetic --steps 4 --warmup 1 \
    --batch-size 8 --profile --json --device cpu_blas 2>&1)
calls=""
i=0
while [ $i -lt 30 ]; do
    k=$(echo "$out" | "$JSON_CHECK" "results.[0].profile.[$i].kernel" 2>/dev/null)
    [ -z "$k" ] && break
    if [ "$k" = 'results.[0].profile.['$i'].kernel="conv2d float32"' ]; then
        calls=$(echo "$out" | "$JSON_CHECK" "results.[0].profile.[$i].calls_per_step" 2>/dev/null |
            sed 's/.*=//')
    fi
    i=$((i + 1))
done
text=$("$TESSERA" bench train --model cnn --channels 4 --synthetic --steps 2 --warmup 1 \
    --batch-size 8 --profile --device cpu_blas 2>&1)
if [ -n "$calls" ] && awk "BEGIN{exit !($calls == 1)}" && contains "$text" "in kernels, of a mean step" &&
    contains "$text" "conv2d_backward_weight float32"; then
    ok "--profile counts the kernels of the timed steps ($i kernels, conv2d $calls/step)"
else
    fail "--profile counts the kernels of the timed steps" "calls=$calls" "$out" "$text"
fi

# --model gpt: the GPT's step against its GEMM floor, tokens/s, nothing allocated per steady
# step; options of the other models are refused with it, and the GPT's without it.
out=$("$TESSERA" bench train --model gpt --context 16 --layers 1 --heads 2 --embd 16 \
    --batch-size 4 --steps 3 --warmup 2 --json --device cpu_blas 2>&1)
vals=$(echo "$out" | "$JSON_CHECK" model results.[0].raw_allocs_per_step \
    results.[0].tessera_mallocs_per_step floor_gemms 2>/dev/null)
tps=$(echo "$out" | "$JSON_CHECK" results.[0].tokens_per_s 2>/dev/null | sed 's/.*=//')
# floor: per block 4 linear layers x 3 GEMMs + 6 per (batch, head) = 12 + 6 * 8, the head 3
if contains "$vals" 'model="gpt (context 16, 1 layers, 2 heads, embd 16)"' &&
    contains "$vals" 'results.[0].raw_allocs_per_step=0' &&
    { contains "$vals" 'results.[0].tessera_mallocs_per_step=0' ||
        contains "$vals" 'tessera_mallocs_per_step=null'; } &&
    contains "$vals" 'floor_gemms=63' && [ -n "$tps" ] && awk "BEGIN{exit !($tps > 0)}"; then
    ok "bench train --model gpt: floor of 63 GEMMs, $tps tokens/s, no allocation per step"
else
    fail "bench train --model gpt" "$vals" "$out"
fi
bad=""
while IFS='|' read -r args want; do
    out=$("$TESSERA" bench train $args 2>&1)
    rc=$?
    if [ $rc -ne 2 ] || ! contains "$out" "$want"; then
        bad="$bad
$args: rc=$rc: $out"
    fi
done <<EOF
--model gpt --hidden 32|--hidden does not apply to --model gpt
--model gpt --synthetic|--synthetic does not apply to --model gpt
--model gpt --optimizer sgd|--optimizer does not apply to --model gpt
--model mlp --layers 2|--layers applies to --model gpt only
--model gpt --embd 10 --heads 4|--embd 10 is not a multiple of --heads 4
--model gpt --layers 17|--layers
EOF
if [ -z "$bad" ]; then
    ok "bench train --model gpt refuses the other models' options and bad sizes"
else
    fail "bench train --model gpt refuses the other models' options and bad sizes" "$bad"
fi
# bench gpt, a short run: nothing allocated per steady step (the 10,000-step figures are in
# docs/performance.md; a benchmark, not a test).
out=$("$TESSERA" bench gpt --steps 300 --context 16 --layers 1 --heads 2 --embd 16 \
    --batch-size 2 --json --device cpu_blas 2>&1)
vals=$(echo "$out" | "$JSON_CHECK" steps raw_allocs_per_step tessera_mallocs_per_step 2>/dev/null)
if contains "$vals" 'steps=300' && contains "$vals" 'raw_allocs_per_step=0' &&
    { contains "$vals" 'tessera_mallocs_per_step=0' || [ "${TS_SANITIZERS:-no}" = yes ]; }; then
    ok "bench gpt: 300 steps, no raw pool allocation or tessera malloc per steady step"
else
    fail "bench gpt: 300 steps, no raw pool allocation or tessera malloc per steady step" "$vals" "$out"
fi
# --contend: the steps timed again beside busy processes, the ratio reported; the processes
# are gone afterwards.
printf '[core]\ndevice = cpu_blas\n[plugin.cpu_blas]\nthreads = 2\n' >"$TMP/adapt.ini" # adapting
out=$(TESSERA_CONFIG="$TMP/adapt.ini" "$TESSERA" bench train --model mlp $QUICK --device cpu_blas --contend 1 2>&1)
rc=$?
r=$(printf '%s\n' "$out" | "$JSON_CHECK" results.[0].contend results.[0].ms_median_contended \
    results.[0].contended_slowdown 2>&1)
bad=$("$TESSERA" bench train --contend 0 2>&1); rb=$?
if [ $rc -eq 0 ] && contains "$r" "results.[0].contend=1" &&
    contains "$r" "results.[0].contended_slowdown=" && [ $rb -eq 2 ] &&
    contains "$bad" "--contend" && ! pgrep -f "bench train --model mlp.*--contend" >/dev/null; then
    ok "bench train --contend 1 times the steps beside a busy process and reports the ratio"
else
    fail "bench train --contend" "rc=$rc $r" "$rb $bad"
fi
finish
