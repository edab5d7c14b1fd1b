#!/usr/bin/env bash
# GPU device check: on a machine with an NVIDIA GPU, build conflux with CUDA,
# run the GPU tests for real, and print the device reduction kernels'
# bandwidth as a ratio of device-to-device cudaMemcpy bandwidth measured in
# the same run (goal >= 0.8).  Finishes in well under 5 minutes on one GPU.
#
#   test/gpu/device-check.sh [BUILD_DIR]      (default: build-devcheck)
#
# Exit status: 0 when every GPU test ran and passed (none skipped), 1
# otherwise.  The bandwidth ratio is reported, not enforced.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
build=${1:-build-devcheck}
jobs=$(nproc 2>/dev/null || echo 4)
start=$SECONDS

say() { printf 'device-check: %s\n' "$*"; }
fail() { say "FAILED: $*" >&2; exit 1; }

say "gpu:"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null ||
    say "(nvidia-smi not available)"

mkdir -p "$build"
say "configuring $build (CFX_WITH_CUDA=ON)"
cmake -S . -B "$build" -DCFX_WITH_CUDA=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >"$build/configure.log" 2>&1 ||
    { tail -30 "$build/configure.log"; fail "cmake configure"; }
grep -q 'cuda=ON' "$build/configure.log" || fail "configure did not enable CUDA"
say "building with $jobs jobs"
cmake --build "$build" -j"$jobs" --target conflux test_cuda_memtype test_cuda_reduce \
    test_cuda_xfer test_cuda_coll test_memtype test_gpu_sim cfx_gpu_bench >"$build/build.log" 2>&1 ||
    { tail -40 "$build/build.log"; fail "build"; }
say "built in $((SECONDS - start)) s"

status=0
for t in test_memtype test_gpu_sim test_cuda_memtype test_cuda_reduce test_cuda_xfer test_cuda_coll; do
    log="$build/$t.log"
    say "running $t"
    if ! timeout 240 "$build/bin/$t" --jobs 1 --verbose >"$log" 2>&1; then
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
timeout 120 "$build/bin/cfx_gpu_bench" -s 256M -n 20 || { say "cfx_gpu_bench failed"; status=1; }

say "done in $((SECONDS - start)) s: $([[ $status == 0 ]] && echo PASS || echo FAIL)"
exit $status
