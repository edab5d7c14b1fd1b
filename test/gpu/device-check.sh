#!/usr/bin/env bash
# GPU device check: on a machine with an NVIDIA GPU, build conflux with CUDA,
# run the GPU tests for real, and print the device reduction kernels'
# bandwidth as a ratio of device-to-device cudaMemcpy bandwidth measured in
# the same run (goal >= 0.8).  Finishes in well under 5 minutes on one GPU.
#
#   test/gpu/device-check.sh [BUILD_DIR]      build there (default:
#                                             build-devcheck), then run
#   test/gpu/device-check.sh --pack DIR [BUILD_DIR]
#                                             build here (no GPU needed), and
#                                             put the test programs, the
#                                             shared libraries they use (all
#                                             but the C runtime's) and this
#                                             script into DIR
#   DIR/device-check.sh --packed DIR          run a packed DIR: for a GPU
#                                             machine without the build's
#                                             packages (Criterion, rdma-core,
#                                             DPDK); glibc there >= here
#
# The test logs go to BUILD_DIR, to $OUT when set, else to a temporary
# folder (named at the end).  Exit status: 0 when every GPU test ran and
# passed (none skipped), 1 otherwise, 2 on a usage error.  The bandwidth
# ratio is reported, not enforced.
set -euo pipefail
PROGS="test_memtype test_gpu_sim test_cuda_memtype test_cuda_reduce test_cuda_xfer test_cuda_coll"
start=$SECONDS

say() { printf 'device-check: %s\n' "$*"; }
fail() { say "FAILED: $*" >&2; exit 1; }
usage_error() { say "$*" >&2; exit 2; }

build() { # dir
    local build=$1 jobs
    jobs=$(nproc 2>/dev/null || echo 4)
    mkdir -p "$build"
    say "configuring $build (CFX_WITH_CUDA=ON)"
    cmake -S . -B "$build" -DCFX_WITH_CUDA=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        >"$build/configure.log" 2>&1 || { tail -30 "$build/configure.log"; fail "cmake configure"; }
    grep -q 'cuda=ON' "$build/configure.log" || fail "configure did not enable CUDA"
    say "building with $jobs jobs"
    # shellcheck disable=SC2086
    cmake --build "$build" -j"$jobs" --target conflux $PROGS cfx_gpu_bench \
        >"$build/build.log" 2>&1 || { tail -40 "$build/build.log"; fail "build"; }
    say "built in $((SECONDS - start)) s"
}

case "${1:-}" in
-h | --help)
    sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed -e '$d' -e 's/^# \{0,1\}//'
    exit 0
    ;;
--pack)
    [ $# -ge 2 ] || usage_error "--pack DIR [BUILD_DIR]"
    out=$(realpath -m "$2")
    cd "$(dirname "${BASH_SOURCE[0]}")/../.."
    build=${3:-build-devcheck}
    build "$build"
    rm -rf "$out"
    mkdir -p "$out/bin" "$out/lib"
    for p in $PROGS cfx_gpu_bench; do
        strip --strip-debug -o "$out/bin/$p" "$build/bin/$p"
    done
    # every shared library they load, but the C runtime's (the GPU machine's own)
    for p in "$out"/bin/*; do ldd "$p"; done | awk '/=> \// {print $3}' | sort -u |
        grep -v -E '/(libc|libm|libdl|librt|libpthread|libresolv|libstdc\+\+|libgcc_s)\.so' |
        while read -r lib; do cp -L "$lib" "$out/lib/"; done
    cp "${BASH_SOURCE[0]}" "$out/device-check.sh"
    say "packed into $out ($(du -sh "$out" | cut -f1)); there: $out/device-check.sh --packed $out"
    exit 0
    ;;
--packed)
    [ $# -ge 2 ] || usage_error "--packed DIR"
    [ -x "$2/bin/cfx_gpu_bench" ] || usage_error "--packed $2: not a folder --pack made"
    dir=$(realpath "$2")
    bin=$dir/bin
    export LD_LIBRARY_PATH=$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    logs=${OUT:-$(mktemp -d /tmp/cfx-devcheck.XXXXXX)}
    ;;
-*)
    usage_error "unknown option '$1' (--help says how to run it)"
    ;;
*)
    cd "$(dirname "${BASH_SOURCE[0]}")/../.."
    logs=${1:-build-devcheck}
    build "$logs"
    bin=$logs/bin
    ;;
esac

say "gpu:"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null ||
    say "(nvidia-smi not available)"

status=0
for t in $PROGS; do
    log="$logs/$t.log"
    say "running $t"
    if ! timeout 240 "$bin/$t" --jobs 1 --verbose >"$log" 2>&1; then
        tail -30 "$log"
        say "$t: FAILED"
        status=1
    fi
    # On a GPU machine a GPU test that skips is a failure: it did not run.
    if grep -E '^\[SKIP\].*no CUDA device' "$log"; then
        say "$t: GPU tests skipped on a machine that should have a GPU"
        status=1
    fi
    # ... and so is a binary in which nothing passed (nothing ran for real)
    if ! grep -qE '^\[PASS\]' "$log"; then
        say "$t: no test passed"
        status=1
    fi
    grep -E '^\[====\] Synthesis' "$log" || true
done

say "device reduction kernel bandwidth vs device-to-device cudaMemcpy"
timeout 120 "$bin/cfx_gpu_bench" -s 256M -n 20 || { say "cfx_gpu_bench failed"; status=1; }

say "test logs in $logs"
say "done in $((SECONDS - start)) s: $([[ $status == 0 ]] && echo PASS || echo FAIL)"
exit $status
