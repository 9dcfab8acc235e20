#!/bin/sh
# quickstart.sh: from a fresh Debian 12 checkout to a working tessera in one command.
#   ./quickstart.sh train   install what is missing, build, then train (the main job)
#   ./quickstart.sh check   install what is missing, build, then run `make check`
#   ./quickstart.sh build   install what is missing and build only
# Re-running is fast: packages already installed are skipped, autoreconf/configure run only
# when their inputs changed, make rebuilds only what changed.
# The build goes to _build/ (out of tree), so ./_build/tools/tessera is the uninstalled CLI.
# Environment: CONFIGURE_FLAGS (extra ./configure flags), BUILD_DIR (default _build),
# JOBS (make -j, default nproc), EXTRA_PACKAGES (more Debian packages to install).
set -eu
# Plugins load only from files and directories no other user can write (docs/configuration.md):
# a build under a group-writable umask (002) would make the build tree's own plugins untrusted.
umask 022

cd "$(dirname "$0")"
mode=${1:-train}
[ $# -gt 0 ] && shift

case $mode in
train | check | build) ;;
-h | --help | help)
    sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//'
    exit 0
    ;;
*)
    echo "quickstart.sh: unknown mode '$mode' (train, check or build)" >&2
    exit 2
    ;;
esac

say() { printf '==> %s\n' "$*"; }

# ---- Debian packages ---------------------------------------------------------------------
PACKAGES="autoconf automake libtool pkg-config make gcc libc6-dev
  libinih-dev libcjson-dev libopenblas-dev libdnnl-dev zlib1g-dev"
# Open MPI: the comm_mpi plugin (data-parallel training under mpirun) and its tests.
PACKAGES="$PACKAGES libopenmpi-dev openmpi-bin"
# The training tests (test-train.sh, test-sdk.sh) train on the real set: check needs it too.
[ "$mode" != build ] && PACKAGES="$PACKAGES dataset-fashion-mnist"
# train: the GPT's default corpus (tessera train --model gpt), Debian's fortunes.
[ "$mode" = train ] && PACKAGES="$PACKAGES fortunes"
# check: valgrind for the memory tests, librsvg2-bin to render tessera memplot's SVG.
[ "$mode" = check ] && PACKAGES="$PACKAGES valgrind librsvg2-bin"
# EXTRA_PACKAGES: more Debian packages (.ci/run asks for clang + libclang-rt-14-dev: fuzzing).
PACKAGES="$PACKAGES ${EXTRA_PACKAGES:-}"

missing=
for p in $PACKAGES; do
    if ! dpkg-query -W -f='${Status}\n' "$p" 2>/dev/null | grep -q 'install ok installed'; then
        missing="$missing $p"
    fi
done
if [ -n "$missing" ]; then
    if [ "$(id -u)" -eq 0 ]; then
        sudo=
    elif command -v sudo >/dev/null 2>&1; then
        sudo=sudo
    else
        echo "quickstart.sh: these Debian packages are missing:$missing" >&2
        echo "quickstart.sh: run as root, or install them with apt-get first" >&2
        exit 1
    fi
    say "installing:$missing"
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -q
    # shellcheck disable=SC2086
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $missing
fi

# ---- bootstrap, configure, build ---------------------------------------------------------
if [ ! -x configure ] || [ configure.ac -nt configure ] || [ Makefile.am -nt configure ] ||
    [ lists.am -nt configure ]; then
    say "autoreconf -fi"
    autoreconf -fi
fi
flags=${CONFIGURE_FLAGS:-}
build=${BUILD_DIR:-_build}
src=$(pwd)
mkdir -p "$build"
cd "$build"
if [ ! -f config.status ] || [ "$src/configure" -nt config.status ] ||
    [ "$(cat .quickstart-flags 2>/dev/null)" != "$flags" ]; then
    say "configure $flags (in $build/)"
    # shellcheck disable=SC2086
    "$src/configure" $flags
    printf '%s' "$flags" >.quickstart-flags
fi
jobs=${JOBS:-$(nproc 2>/dev/null || echo 2)}
say "make -j$jobs (in $build/)"
make -j"$jobs"

case $mode in
build) say "built: ./$build/tools/tessera info" ;;
check)
    say "make check"
    make -j"$jobs" check
    ;;
train)
    if ./tools/tessera help 2>/dev/null | grep -q '^  train'; then
        say "tessera train ${*:---model lenet5 --epochs 1}"
        # shellcheck disable=SC2086
        exec ./tools/tessera train ${*:---model lenet5 --epochs 1}
    fi
    say "tessera info"
    exec ./tools/tessera info "$@"
    ;;
esac
