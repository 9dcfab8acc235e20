#!/bin/sh
# tools/gpu-verify.sh: the one prepared run that verifies the cuda and comm_nccl plugins on a
# GPU machine that can install nothing (a lent machine holds its driver, the CUDA 13 runtime,
# cuBLAS, NCCL and compute-sanitizer, and nothing of ours).
#
# usage: tools/gpu-verify.sh pack [--build DIR] [--arch LIST] [--jobs N] [--cuda-libs]
#        tools/gpu-verify.sh dry-run [--build DIR]
#        verify.sh run [--dry-run] [--budget S]   (inside an unpacked pack)
#
#   pack      builds with the cuda plugin into _gpu/build (or takes the finished build in DIR,
#             which must have been configured with CUDA) and packs _gpu/tessera-gpu.tar.xz: the
#             CLI, the plugins, the test programs, the shared libraries they load (minus
#             glibc's and CUDA's own), Open MPI's components for comm_nccl's bootstrap, a
#             cut-down Fashion-MNIST, a text for the GPT, and this script as verify.sh.
#   dry-run   packs, unpacks into a temporary directory and runs every check here with the
#             cpu_blas plugin standing in for cuda and comm_mpi for comm_nccl: every step but
#             the GPU itself (CI runs it).
#   run       every check, one log each, and summary.txt, in $OUT (default: the current
#             directory); logs.tar.gz holds the logs. Exit status: the number of failed steps.
#             --budget S: stop starting steps after S seconds (default 420); a step not
#             reached counts as failed. --only A,B: only the steps and verdicts named.
#   --arch LIST   SM list for nvcc (default 90: H100 / H200)
#   --cuda-libs   also pack libcudart / libcublas / libcublasLt (large: only for a machine
#                 without CUDA 13)
#
# On a lent machine (one call, about 6 minutes):
#   tar -xJf _gpu/tessera-gpu.tar.xz -C /tmp && /tmp/tessera-gpu/verify.sh run
set -eu

usage() { sed -n '2,28p' "$0" | sed 's/^# \{0,1\}//'; }

# ---------------------------------------------------------------------------------------
# run: the checks, inside an unpacked pack
# ---------------------------------------------------------------------------------------
run_checks() {
    dry=no budget=420 only=
    while [ $# -gt 0 ]; do
        case $1 in
        --dry-run) dry=yes; shift ;;
        --only) only=",$2,"; shift 2 ;;
        --budget) budget=$2; shift 2 ;;
        *) echo "verify.sh run: unknown option $1" >&2; exit 2 ;;
        esac
    done
    case $budget in
    '' | *[!0-9]*) echo "verify.sh run: --budget takes whole seconds, not '$budget'" >&2; exit 2 ;;
    esac
    deadline=$(($(date +%s) + budget))
    here=$(cd "$(dirname "$0")" && pwd)
    out=${OUT:-$PWD}
    mkdir -p "$out/logs"
    logs=$out/logs
    summary=$out/summary.txt
    : >"$summary"
    # The environment run.sh sets, for every step.
    cudalibs=
    for d in "${CUDA_HOME:-/usr/local/cuda}/lib64" /usr/local/cuda/targets/x86_64-linux/lib \
        /opt/*/.venv/lib/python3*/site-packages/nvidia/*/lib \
        /usr/local/lib/python3*/dist-packages/nvidia/*/lib; do
        [ -d "$d" ] && cudalibs="$cudalibs:$d"
    done
    LD_LIBRARY_PATH="$here/lib$cudalibs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    TESSERA_PLUGIN_PATH=$here/plugins
    TESSERA_SYSTEM_PLUGIN_DIR=$here/plugins
    TESSERA_CONFIG=$here/tessera.ini
    TESSERA_SYSTEM_CONFIG=
    XDG_CONFIG_HOME=/nonexistent
    OPAL_PREFIX=$here/mpi
    OMPI_MCA_ess_singleton_isolated=1
    OMPI_ALLOW_RUN_AS_ROOT=1
    OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    export LD_LIBRARY_PATH TESSERA_PLUGIN_PATH TESSERA_SYSTEM_PLUGIN_DIR TESSERA_CONFIG
    export TESSERA_SYSTEM_CONFIG XDG_CONFIG_HOME OPAL_PREFIX OMPI_MCA_ess_singleton_isolated
    export OMPI_ALLOW_RUN_AS_ROOT OMPI_ALLOW_RUN_AS_ROOT_CONFIRM
    t=$here/bin/.libs/tessera
    TS_BUILDDIR=$here # test-train-reference's float64 reference: tests/fixtures/.libs/hostonly.so
    export TS_BUILDDIR
    if [ $dry = yes ]; then
        gpu=cpu_blas comm=mpi cs=
        TS_GPU_TEST_DEVICE=cpu_blas
        export TS_GPU_TEST_DEVICE
    else
        gpu=cuda comm=nccl
        cs=$(command -v compute-sanitizer || true)
        for c in /usr/local/cuda/bin/compute-sanitizer /opt/nvidia/*/compute-sanitizer \
            /usr/local/cuda*/compute-sanitizer/compute-sanitizer; do
            [ -z "$cs" ] && [ -x "$c" ] && cs=$c
        done
    fi
    # The packed test configuration, with cpu_blas on every core of this machine.
    sed "s/^threads = .*/threads = $(nproc)/" "$here/tessera.ini" >"$here/tessera.ini.new"
    mv "$here/tessera.ini.new" "$here/tessera.ini"
    chmod 0644 "$here/tessera.ini"
    sed "s/@COMM@/$comm/; s/@GPU@/$gpu/" "$here/dist.ini.in" >"$here/dist.ini"
    chmod 0644 "$here/dist.ini"
    failed=0 passed=0 skipped=0
    say() { echo "$*" | tee -a "$summary"; }
    # step NAME SECONDS COMMAND...: one check, its output in logs/NAME.log. A SKIP (77) is a
    # failure on a GPU machine: there, nothing may skip.
    step() {
        name=$1 limit=$2
        shift 2
        case $only in "" | *",$name,"*) ;; *) return 0 ;; esac
        start=$(date +%s)
        left=$((deadline - start))
        if [ $left -lt 10 ]; then
            failed=$((failed + 1))
            say "FAILED  $name: not reached within --budget $budget s"
            return 0
        fi
        [ "$limit" -gt $left ] && limit=$left
        set +e
        timeout -k 10 "$limit" "$@" >"$logs/$name.log" 2>&1
        rc=$?
        set -e
        took=$(($(date +%s) - start))
        if [ $rc -eq 0 ]; then
            passed=$((passed + 1))
            say "ok      $name (${took} s)"
        elif [ $rc -eq 77 ] && [ $dry = yes ]; then
            skipped=$((skipped + 1))
            say "skip    $name (${took} s)"
        else
            failed=$((failed + 1))
            say "FAILED  $name (rc $rc, ${took} s): $(tail -3 "$logs/$name.log" | tr '\n' ' ' | cut -c1-300)"
        fi
        return 0
    }
    # check NAME CONDITION-TEXT: a verdict computed from logs, counted like a step.
    verdict() {
        case $only in "" | *",$1,"*) ;; *) return 0 ;; esac
        if [ "$2" = ok ]; then
            passed=$((passed + 1))
            say "ok      $1: $3"
        else
            failed=$((failed + 1))
            say "FAILED  $1: $3"
        fi
    }

    say "tessera GPU verification, $(date -u '+%Y-%m-%d %H:%M UTC'), dry run: $dry"
    if [ $dry = no ]; then
        say "$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)"
        say "compute-sanitizer: ${cs:-not found}"
    fi
    data="--data $here/data"
    step info 60 "$t" info
    step conformance 300 "$here/tests/test-cuda"
    step train-reference 300 "$here/tests/test-train-reference"
    step plugin-check 300 "$t" plugin-check "$gpu"
    step plugin-coverage 60 "$t" plugin-check --coverage "$gpu"

    # Training on the GPU against cpu_blas from the same initial weights: per-step losses.
    agree() { # agree NAME A.log B.log BOUND
        grep '^step [0-9]* loss' "$2" | awk '{print $2, $4}' >"$logs/$1.a"
        grep '^step [0-9]* loss' "$3" | awk '{print $2, $4}' >"$logs/$1.b"
        r=$(paste -d' ' "$logs/$1.a" "$logs/$1.b" | awk -v bound="$4" '
            $1 != $3 {bad = 1}
            {d = $2 - $4; if (d < 0) d = -d; d /= ($2 < 0 ? -$2 : $2); if (n == 0 || d > m) {m = d; at = $1}; n++}
            END {printf "%s %d steps, worst relative loss difference %.3g at step %s, last %s vs %s",
                 (!bad && n > 0 && m <= bound) ? "ok" : "no", n, m, at, $2, $4}')
        verdict "$1" "${r%% *}" "${r#* }"
    }
    img="train --model lenet5 --max-steps 200 --train-limit 12800 --seed 3 --log-steps $data"
    step train-lenet5-cpu 300 "$t" $img --device cpu_blas
    step train-lenet5-gpu 300 "$t" $img --device "$gpu"
    agree agree-lenet5 "$logs/train-lenet5-cpu.log" "$logs/train-lenet5-gpu.log" 0.02
    # The dry run checks the script, not the GPU: its GPT runs and benchmarks are short (on a
    # CPU stand-in the full lengths take minutes and say nothing new).
    gsteps=200 bsteps=50
    [ $dry = yes ] && gsteps=30 bsteps=10
    gpt="train --model gpt --text $here/data/text.txt --steps $gsteps --eval-every $((gsteps / 2)) --seed 5 --log-steps"
    step train-gpt-cpu 300 "$t" $gpt --device cpu_blas --save-initial "$logs/gpt-init-cpu.safetensors"
    step train-gpt-gpu 300 "$t" $gpt --device "$gpu" --save-initial "$logs/gpt-init-gpu.safetensors"
    if cmp -s "$logs/gpt-init-cpu.safetensors" "$logs/gpt-init-gpu.safetensors"; then
        verdict gpt-same-init ok "the initial weights are byte-identical"
    else
        verdict gpt-same-init no "the initial weights differ"
    fi
    rm -f "$logs"/gpt-init-*.safetensors
    agree agree-gpt "$logs/train-gpt-cpu.log" "$logs/train-gpt-gpu.log" 0.02
    # The expandable segment (expandable_segments = true): the same run, the same losses.
    printf '[core]\ndevice = %s\nfallback = cpu_blas\nlog_level = warn\n\n[plugin.%s]\nexpandable_segments = true\n' \
        "$gpu" "$gpu" >"$here/expandable.ini"
    chmod 0644 "$here/expandable.ini"
    TESSERA_CONFIG=$here/expandable.ini step train-gpt-expandable 300 "$t" $gpt --device "$gpu"
    # Not bit for bit: a GPU run's float sums need not repeat exactly (seen: 9.4e-8).
    agree agree-expandable "$logs/train-gpt-gpu.log" "$logs/train-gpt-expandable.log" 1e-5

    # Mixed precision on the GPU (cublasGemmEx in bfloat16 / float16, float32 accumulation;
    # fp16 with loss scaling): the same run's losses track float32's.
    for p in bf16 fp16; do
        step "train-gpt-gpu-$p" 300 "$t" $gpt --device "$gpu" --precision $p
        agree "agree-gpt-$p" "$logs/train-gpt-gpu.log" "$logs/train-gpt-gpu-$p.log" 0.03
    done

    # Speed, each next to its baseline in the same run.
    if [ $dry = no ]; then
        step bench-cuda 300 "$t" bench cuda --cpu-steps 3
    fi
    for m in mlp lenet5 cnn; do
        step "bench-train-$m" 240 "$t" bench train --model $m --device "$gpu" --steps $bsteps $data
    done
    step bench-train-gpt 240 "$t" bench train --model gpt --device "$gpu" --steps $bsteps
    # The attention fused and composed: the default GPT, the op alone (bench ops) and the GPT
    # at longer contexts (batch 4 and 2: the same tokens per step as 128 x 16). Figures for
    # the GPU only: on a CPU stand-in they take minutes and say nothing of the GPU.
    if [ $dry = no ]; then
        step bench-train-gpt-composed 240 "$t" bench train --model gpt --device "$gpu" \
            --steps 50 --attention composed
        step bench-ops 240 "$t" bench ops --device "$gpu" --reps 3
        for tc in 512:4 1024:2; do
            for am in fused composed; do
                step "bench-train-gpt-${tc%:*}-$am" 240 "$t" bench train --model gpt \
                    --device "$gpu" --steps 30 --context "${tc%:*}" --batch-size "${tc#*:}" \
                    --attention $am
            done
        done
    fi
    step bench-train-gpt-precision 240 "$t" bench train --model gpt --device "$gpu" --steps $bsteps \
        --precision fp32,bf16,fp16
    TESSERA_CONFIG=$here/expandable.ini step bench-train-gpt-expandable 240 "$t" bench train \
        --model gpt --device "$gpu" --steps $bsteps
    # The same steps recorded once and replayed (CUDA graphs), next to the plain ones above.
    if [ $dry = no ]; then
        step bench-train-lenet5-graph 240 "$t" bench train --model lenet5 --device "$gpu" \
            --steps 50 --graph $data
        step bench-train-gpt-graph 240 "$t" bench train --model gpt --device "$gpu" --steps 50 \
            --graph
        # Where the GPT step's GPU time goes, kernel by kernel (each waited for).
        step profile-gpt 240 "$t" bench train --model gpt --device "$gpu" --steps 10 --profile
    fi
    # A steady step takes nothing from the driver: raw pool allocations per step are 0.
    for m in mlp lenet5 cnn gpt gpt-expandable; do
        [ -f "$logs/bench-train-$m.log" ] || continue
        # raw/step: the column after step/floor (the one value ending in "x")
        raw=$(awk -v d="$gpu" '$1 == d {for (i = 2; i < NF; i++) if ($i ~ /^[0-9.]+x$/) {
            print $(i + 1); exit}}' "$logs/bench-train-$m.log")
        if [ -n "$raw" ] && awk -v r="$raw" 'BEGIN {exit !(r + 0 == 0)}'; then
            verdict "steady-allocs-$m" ok "0 raw allocations per steady step"
        else
            verdict "steady-allocs-$m" no "raw allocations per steady step: '${raw:-not found}'"
        fi
    done
    TESSERA_CONFIG=$here/dist.ini step bench-dist 240 "$t" bench dist --iters 10 --max-mib 64 \
        --steps 20 --device "$gpu"

    # Last, as the slowest: compute-sanitizer's memcheck and racecheck on short training runs
    # of a convolution net and a GPT (every kernel a training step uses), then memcheck on
    # the conformance test.
    short_img="train --model lenet5 --max-steps 4 --train-limit 512 --batch-size 64 $data --device $gpu"
    short_gpt="train --model gpt --text $here/data/text.txt --layers 1 --embd 32 --heads 2 --context 32 --batch-size 4 --steps 4 --eval-every 4 --eval-batches 1 --device $gpu"
    if [ $dry = yes ]; then
        step sanitize-train 120 "$t" $short_img
        step sanitize-gpt 120 "$t" $short_gpt
    elif [ -n "$cs" ]; then
        csm="$cs --tool memcheck --leak-check full --error-exitcode 1"
        csr="$cs --tool racecheck --error-exitcode 1"
        step memcheck-train 120 $csm "$t" $short_img
        step racecheck-train 120 $csr "$t" $short_img
        step memcheck-gpt 120 $csm "$t" $short_gpt
        step memcheck-gpt-bf16 120 $csm "$t" $short_gpt --precision bf16
        step racecheck-gpt 120 $csr "$t" $short_gpt
        step memcheck-conformance 180 $csm "$here/tests/test-cuda"
        step memcheck-plugin-check 240 $csm "$t" plugin-check "$gpu"
    else
        verdict compute-sanitizer no "not found on this machine"
    fi

    say "$passed passed, $failed failed, $skipped skipped"
    # Figures worth reading first, from the logs.
    for f in bench-cuda bench-train-mlp bench-train-lenet5 bench-train-cnn bench-train-gpt \
        bench-train-gpt-precision \
        bench-train-gpt-expandable bench-train-lenet5-graph bench-train-gpt-graph profile-gpt bench-dist; do
        [ -f "$logs/$f.log" ] || continue
        echo "---- $f" >>"$summary"
        grep -v '^$' "$logs/$f.log" | tail -30 >>"$summary"
    done
    (cd "$out" && tar -czf logs.tar.gz logs && rm -rf logs)
    exit "$failed"
}

# ---------------------------------------------------------------------------------------
# pack: build (or take a build) and pack what the GPU machine needs
# ---------------------------------------------------------------------------------------
pack() {
    arch=90 cuda_libs=no jobs=2 build=
    while [ $# -gt 0 ]; do
        case $1 in
        --arch) arch=$2; shift 2 ;;
        --cuda-libs) cuda_libs=yes; shift ;;
        --jobs) jobs=$2; shift 2 ;;
        --build) build=$(cd "$2" && pwd); shift 2 ;;
        *) echo "gpu-verify: unknown option $1 (see --help)" >&2; exit 2 ;;
        esac
    done
    top=$(cd "$(dirname "$0")/.." && pwd)
    outd=$top/_gpu
    pk=$outd/tessera-gpu
    cuda=${CUDA_HOME:-/usr/local/cuda}
    if [ -z "$build" ]; then
        build=$outd/build
        mkdir -p "$build"
        (cd "$top" && { [ -x configure ] || autoreconf -fi; })
        if [ ! -f "$build/Makefile" ]; then
            (cd "$build" && "$top/configure" --with-cuda="$cuda" --with-cuda-arch="$arch" \
                --without-onednn --prefix="$outd/prefix" >configure.log)
        fi
    fi
    mkdir -p "$outd"
    make -C "$build" -j"$jobs" >"$outd/make.log"
    make -C "$build" -j"$jobs" check TESTS= >"$outd/make-check-build.log" # builds, runs none
    [ -f "$build/plugins/cuda/.libs/cuda.so" ] || {
        echo "gpu-verify: $build has no cuda plugin (configure --with-cuda)" >&2
        exit 1
    }
    rm -rf "$pk"
    mkdir -p "$pk/bin/.libs" "$pk/plugins" "$pk/tests/fixtures/.libs" "$pk/lib" "$pk/data"
    # The CLI and its benchmark modules, which it finds beside itself in a .libs directory.
    cp "$build"/tools/.libs/tessera "$build"/tools/.libs/tessera-bench*.so "$pk/bin/.libs/"
    cp "$build/tests/fixtures/.libs/hostonly.so" "$pk/tests/fixtures/.libs/"
    # Every plugin but cpu_onednn (its libdnnl alone is 40 MiB of a 64 MiB carry).
    for p in "$build"/plugins/*/.libs/*.so; do
        case $p in */cpu_onednn.so) ;; *) cp "$p" "$pk/plugins/" ;; esac
    done
    for t in test-cuda test-train-reference; do
        cp "$build/tests/plugins/.libs/$t" "$pk/tests/"
    done
    cp -P "$build"/core/.libs/libtessera.so* "$pk/lib/"
    cp "$top/tests/data/test.ini" "$pk/tessera.ini"
    printf '[core]\ndevice = @GPU@\nfallback = cpu_blas\nlog_level = warn\n\n[dist]\nbackend = @COMM@\n' \
        >"$pk/dist.ini.in"
    cp "$0" "$pk/verify.sh"
    # Open MPI's run-time parts (comm_nccl bootstraps NCCL over MPI): its components and help
    # texts under a prefix that OPAL_PREFIX relocates.
    ompi=$(ompi_info --path pkglibdir --parsable 2>/dev/null | sed -n 's/^path:pkglibdir://p')
    mpilibs=
    if [ -n "$ompi" ] && [ -d "$ompi" ]; then
        rel=${ompi#/usr/}
        mkdir -p "$pk/mpi/$rel" "$pk/mpi/share"
        cp "$ompi"/*.so "$pk/mpi/$rel/"
        cp -r /usr/share/openmpi "$pk/mpi/share/"
        mpilibs=$(ls "$pk/mpi/$rel"/*.so)
    fi
    # Shared libraries: everything ldd resolves, except glibc's, the CUDA driver's and (unless
    # --cuda-libs) the CUDA Toolkit's and NCCL (the GPU machine brings its own).
    for f in "$pk"/bin/.libs/* "$pk"/plugins/*.so "$pk"/tests/test-* "$pk"/lib/libtessera.so.0 $mpilibs; do
        LD_LIBRARY_PATH="$pk/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ldd "$f" 2>/dev/null |
            awk '/=> \//{print $3}'
    done | sort -u | while read -r lib; do
        base=$(basename "$lib")
        case $base in
        libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libcuda.so*) continue ;;
        libstdc++.so*|libgcc_s.so*) continue ;; # the GPU image's own are newer
        libtessera.so*) continue ;;
        libcudart.so*|libcublas.so*|libcublasLt.so*|libnccl.so*) [ $cuda_libs = yes ] || continue ;;
        esac
        cp -L "$lib" "$pk/lib/$base"
    done
    # A cut-down Fashion-MNIST (12800 training, 1000 test images) and 1 MiB of text.
    ds=/usr/share/datasets/fashion-mnist
    for f in train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte \
        t10k-labels-idx1-ubyte; do
        [ -f "$ds/$f.gz" ] || { echo "gpu-verify: $ds/$f.gz missing (dataset-fashion-mnist)" >&2; exit 1; }
    done
    python3 - "$ds" "$pk/data" <<'EOF'
import gzip, struct, sys
src, dst = sys.argv[1], sys.argv[2]
for name, keep in [("train-images-idx3-ubyte", 12800), ("train-labels-idx1-ubyte", 12800),
                   ("t10k-images-idx3-ubyte", 1000), ("t10k-labels-idx1-ubyte", 1000)]:
    raw = gzip.open(f"{src}/{name}.gz").read()
    ndim = raw[3]
    dims = list(struct.unpack(">" + "I" * ndim, raw[4:4 + 4 * ndim]))
    per = 1
    for d in dims[1:]:
        per *= d
    head = raw[:4] + struct.pack(">" + "I" * ndim, keep, *dims[1:])
    body = raw[4 + 4 * ndim:4 + 4 * ndim + keep * per]
    with gzip.open(f"{dst}/{name}.gz", "wb") as f:
        f.write(head + body)
EOF
    fortunes=/usr/share/games/fortunes
    if [ -d "$fortunes" ]; then
        find "$fortunes" -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | sort |
            xargs cat 2>/dev/null | head -c 1048576 >"$pk/data/text.txt"
    else
        awk 'BEGIN {srand(7); for (i = 0; i < 20000; i++) {for (j = 0; j < 50; j++)
             printf "%c", 97 + int(rand() * 26); print ""}}' >"$pk/data/text.txt"
    fi
    (cd "$outd" && tar -cJf tessera-gpu.tar.xz tessera-gpu)
    ls -la "$outd/tessera-gpu.tar.xz"
    echo "packed: carry _gpu/tessera-gpu.tar.xz; on the GPU machine:"
    echo "  tar -xJf _gpu/tessera-gpu.tar.xz -C /tmp && /tmp/tessera-gpu/verify.sh run"
}

cmd=${1:-}
[ $# -gt 0 ] && shift
case $cmd in
pack) pack "$@" ;;
run) run_checks "$@" ;;
dry-run)
    pack "$@"
    top=$(cd "$(dirname "$0")/.." && pwd)
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    tar -xJf "$top/_gpu/tessera-gpu.tar.xz" -C "$tmp"
    mkdir -p "$tmp/out"
    set +e
    OUT=$tmp/out "$tmp/tessera-gpu/verify.sh" run --dry-run
    rc=$?
    set -e
    tar -xzf "$tmp/out/logs.tar.gz" -C "$tmp/out" 2>/dev/null || true
    [ $rc -eq 0 ] || for f in "$tmp"/out/logs/*.log; do echo "---- $f"; tail -20 "$f"; done
    exit $rc
    ;;
-h|--help) usage ;;
*) usage >&2; exit 2 ;;
esac
