#!/bin/sh
# tools/gpu-pack.sh: builds tessera with the cuda plugin into _gpu/ (git-ignored) and packs
# what a GPU machine that cannot install anything needs to run the GPU checks: the CLI, the
# plugins, the test programs, the shared libraries they load (found with ldd, minus glibc's
# and CUDA's own: the GPU machine brings its driver and CUDA 13 runtime/cuBLAS), a cut-down
# Fashion-MNIST, and gpu-checks.sh, which runs every GPU check and writes its logs to $OUT.
# Result: _gpu/tessera-gpu.tar.xz (a few tens of MiB; docs/backends.md says how to use it).
#
# usage: tools/gpu-pack.sh [--arch LIST] [--cuda-libs] [--jobs N]
#   --arch LIST   SM list for nvcc (default 90: H100 / H200; e.g. 80,90)
#   --cuda-libs   also pack libcudart / libcublas / libcublasLt (about 600 MiB: only for a
#                 machine without CUDA 13, and too large for a 64 MiB carry)
#   --jobs N      make -j N (default 2)
set -eu
arch=90
cuda_libs=no
jobs=2
while [ $# -gt 0 ]; do
    case $1 in
    --arch) arch=$2; shift 2 ;;
    --cuda-libs) cuda_libs=yes; shift ;;
    --jobs) jobs=$2; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-pack: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
top=$(cd "$(dirname "$0")/.." && pwd)
out=$top/_gpu
build=$out/build
pack=$out/tessera-gpu
cuda=${CUDA_HOME:-/usr/local/cuda}
mkdir -p "$build"
cd "$top"
[ -x configure ] || autoreconf -fi
cd "$build"
if [ ! -f Makefile ]; then
    "$top/configure" --with-cuda="$cuda" --with-cuda-arch="$arch" --without-onednn \
        --prefix="$out/prefix" >configure.log
fi
make -j"$jobs" >make.log
make -j"$jobs" check TESTS= >make-check-build.log # builds every test program, runs none

rm -rf "$pack"
mkdir -p "$pack/bin" "$pack/plugins" "$pack/tests" "$pack/lib" "$pack/data"
cp tools/.libs/tessera "$pack/bin/"
cp plugins/*/.libs/*.so "$pack/plugins/"
for t in tests/plugins/.libs/test-* tests/unit/.libs/test-*; do
    [ -f "$t" ] && cp "$t" "$pack/tests/"
done
cp -P core/.libs/libtessera.so* "$pack/lib/"
cp "$top/tests/data/test.ini" "$pack/tessera.ini"

# Shared libraries: everything ldd resolves, except glibc's, the CUDA driver's and (unless
# --cuda-libs) the CUDA Toolkit's.
for f in "$pack"/bin/* "$pack"/plugins/*.so "$pack"/tests/* "$pack"/lib/libtessera.so.0; do
    LD_LIBRARY_PATH="$pack/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" ldd "$f" 2>/dev/null |
        awk '/=> \//{print $3}'
done | sort -u | while read -r lib; do
    base=$(basename "$lib")
    case $base in
    libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libcuda.so*) continue ;;
    libstdc++.so*|libgcc_s.so*) continue ;; # the GPU image's own are newer
    libtessera.so*) continue ;;
    libcudart.so*|libcublas.so*|libcublasLt.so*) [ $cuda_libs = yes ] || continue ;;
    esac
    cp -L "$lib" "$pack/lib/$base"
done

# A cut-down Fashion-MNIST (12800 training, 1000 test images) for the 200-step comparison.
ds=/usr/share/datasets/fashion-mnist
if [ -f "$ds/train-images-idx3-ubyte.gz" ]; then
    python3 - "$ds" "$pack/data" <<'EOF'
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
fi

cat >"$pack/run.sh" <<'EOF'
#!/bin/sh
# run.sh COMMAND...: runs a packed program with the packed libraries and plugins.
here=$(cd "$(dirname "$0")" && pwd)
# CUDA 13's runtime and cuBLAS: the toolkit's, else the pip wheels' (nvidia-cublas, ...).
cudalibs=
for d in "${CUDA_HOME:-/usr/local/cuda}/lib64" /usr/local/cuda/targets/x86_64-linux/lib \
    /opt/*/.venv/lib/python3*/site-packages/nvidia/*/lib; do
    [ -d "$d" ] && cudalibs="$cudalibs:$d"
done
LD_LIBRARY_PATH="$here/lib$cudalibs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
TESSERA_PLUGIN_PATH="$here/plugins"
TESSERA_SYSTEM_PLUGIN_DIR="$here/plugins"
TESSERA_CONFIG="${TESSERA_CONFIG:-$here/tessera.ini}"
XDG_CONFIG_HOME=/nonexistent
TESSERA_SYSTEM_CONFIG=
export LD_LIBRARY_PATH TESSERA_PLUGIN_PATH TESSERA_SYSTEM_PLUGIN_DIR TESSERA_CONFIG XDG_CONFIG_HOME
export TESSERA_SYSTEM_CONFIG
exec "$@"
EOF
cat >"$pack/gpu-checks.sh" <<'EOF'
#!/bin/sh
# gpu-checks.sh: every GPU check of the cuda plugin; logs go to ${OUT:-.}. Exit status: the
# number of failed steps.
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-.}
run=$here/run.sh
failed=0
step() { name=$1; shift; echo "== $name"; if "$@" >"$out/$name.log" 2>&1; then echo "   ok";
         else echo "   FAILED (rc $?)"; failed=$((failed + 1)); fi; tail -15 "$out/$name.log"; }
nvidia-smi -L 2>&1 | head -3
step info "$run" "$here/bin/tessera" info
step conformance "$run" "$here/tests/test-cuda"
cs=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
step memcheck "$run" "$cs" --tool memcheck --leak-check full --target-processes all \
    --error-exitcode 1 "$here/tests/test-cuda"
args="--model lenet5 --max-steps 200 --train-limit 12800 --seed 3 --log-steps --data $here/data"
step train-cpu "$run" "$here/bin/tessera" train $args --device cpu_blas
step train-cuda "$run" "$here/bin/tessera" train $args --device cuda
grep '^step' "$out/train-cpu.log" >"$out/c.txt"; grep '^step' "$out/train-cuda.log" >"$out/g.txt"
[ -s "$out/g.txt" ] || echo "train agreement: no cuda losses (see train-cuda.log)"
[ -s "$out/g.txt" ] && paste -d' ' "$out/c.txt" "$out/g.txt" | awk '{r = $4 - $8; if (r < 0) r = -r; r /= $4;
    if (r > m) { m = r; at = $2 } n++} END {printf "train agreement: %d steps, worst relative loss difference %.3g at step %s\n", n, m, at}'
step bench "$run" "$here/bin/tessera" bench cuda
exit $failed
EOF
chmod +x "$pack/run.sh" "$pack/gpu-checks.sh"
cd "$out"
tar -cJf tessera-gpu.tar.xz tessera-gpu
ls -la "$out/tessera-gpu.tar.xz"
echo "packed: carry _gpu/tessera-gpu.tar.xz; on the GPU machine:"
echo "  tar -xJf _gpu/tessera-gpu.tar.xz -C /tmp && OUT=\$OUT /tmp/tessera-gpu/gpu-checks.sh"
