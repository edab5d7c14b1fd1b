#!/usr/bin/env bash
# Build Conflux and run its test suite: the README's test command.
#
#   scripts/test.sh
#
# Works from any directory.  Stages, in order:
#   1. deps        scripts/deps.sh (installs only what is missing)
#   2. configure   cmake -S . -B $CFX_BUILD_DIR (RelWithDebInfo, CFX_WERROR=ON)
#   3. build       all targets, -j$(nproc)
#   4. test        ctest: unit and install tests in parallel (the multi-process
#                  integration tests run in stage 5, under the sanitizers; here
#                  too, one at a time, when CFX_TEST_SANITIZE=0)
#   4a. python     the conflux Python package (python/): built by pip into a
#                  venv, its pytest suite run (CFX_TEST_PYTHON=0 skips)
#   4b. kernel caps the reduction and collective tests (ctest -L reduce) again
#                  with CFX_REDUCE_ISA=avx2 and =default: what an AVX2-only
#                  and a baseline x86-64 CPU run, beside two CPU hogs
#   4c. release    Release builds with gcc and clang, warnings as errors
#                  (CFX_TEST_RELEASE=0 skips)
#   5. sanitize    ASan+UBSan build (-O1): the unit tests, then the integration
#                  tests one at a time (CFX_TEST_SANITIZE=0 skips)
#   6. rdma-vm     Soft-RoCE tests in a QEMU guest        (later step)
#   7. fuzz        libFuzzer targets, time-boxed (CFX_TEST_FUZZ=0 skips)
#
# Environment:
#   CFX_BUILD_DIR      build directory (default: build)
#   CFX_CMAKE_ARGS     extra cmake configure arguments, word-split
#   CFX_TEST_TIMEOUT   per-test timeout in seconds for tests that set none
#                      (default 600; tests' own TIMEOUT properties win)
#   CFX_TEST_SANITIZE  0 to skip stage 5 (build dir: ${CFX_BUILD_DIR}-asan)
#   CFX_TEST_BUDGET    seconds the whole script may take (default 1740, 29 min);
#                      a ctest run still going when it is spent is killed
#   CFX_SKIP_DEPS      1 to skip stage 1
#   CFX_TEST_PYTHON    0 to skip stage 4a (venv: $CFX_VENV, below)
#   CFX_TEST_TORCH     0 to leave PyTorch out of that venv (by default it is
#                      installed, 2.15.0, for the torch tests when 12 GB are free
#                      there: PyPI has only the CUDA build, 5.3 GB installed,
#                      about 75 s); without it they run when torch is
#                      importable there, else skip
#   CFX_FUZZ_SECONDS   seconds each fuzz target runs (default 10)
#   CFX_TEST_SUBSET    set to 1 by this script from stage 4b on: test_coll and
#                      test_objects run fewer group sizes (the full matrix ran
#                      in stage 4)
#   CFX_TEST_RAY       0 to skip installing Ray (2.60.0, about 80 MB from PyPI)
#                      into that venv; the conflux.ray tests then run when Ray
#                      is importable there, else skip.  By default they run
#                      (a local Ray cluster: 10-30 s)
#   CFX_VENV           the venv of stage 4a (default ~/.cache/conflux/venv-X.Y,
#                      X.Y the Python's version): its third-party packages are
#                      installed once per machine, the conflux package each run
#   CFX_CCACHE         0 to compile without ccache (by default every build goes
#                      through it when it is installed: the same sources are
#                      compiled six times, and again by each run)
#
# Exits non-zero when any stage fails; prints the elapsed time either way.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"

build_dir=${CFX_BUILD_DIR:-build}
test_timeout=${CFX_TEST_TIMEOUT:-600}
budget=${CFX_TEST_BUDGET:-1740}
jobs=$(nproc 2>/dev/null || echo 2)
read -r -a extra_cmake_args <<<"${CFX_CMAKE_ARGS:-}"

start=$SECONDS
hog_pid=

finish() {
    local rc=$?
    if [[ -n $hog_pid ]]; then
        kill "$hog_pid" 2>/dev/null || true
    fi
    local t=$((SECONDS - start))
    if ((rc == 0)); then
        printf '\ntest.sh: PASSED in %dm%02ds\n' $((t / 60)) $((t % 60))
    else
        printf '\ntest.sh: FAILED (exit %d) after %dm%02ds\n' "$rc" $((t / 60)) $((t % 60)) >&2
    fi
}
trap finish EXIT

stage() {
    printf '\n==== %s (%ds) ====\n' "$1" $((SECONDS - start))
}

# configure_and_build DIR [CMAKE_ARG...]
configure_and_build() {
    local dir=$1
    shift
    cmake -S . -B "$dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBUILD_TESTING=ON -DCFX_WERROR=ON \
        "$@" "${extra_cmake_args[@]}"
    cmake --build "$dir" -j"$jobs"
}

# budgeted CMD...: run CMD with what is left of the time budget; the whole
# process group (ctest and the tests it started) is killed when it runs out.
budgeted() {
    local left=$((budget - (SECONDS - start))) rc=0
    if ((left <= 0)); then
        echo "test.sh: the time budget of ${budget}s is spent; not running: $*" >&2
        return 124
    fi
    timeout -k 20 "$left" "$@" || rc=$?
    if ((rc == 124)); then
        echo "test.sh: killed after the time budget of ${budget}s ran out: $*" >&2
    fi
    return "$rc"
}

# run_ctest DIR [unit]: unit and install tests in parallel, then (unless
# "unit") the integration tests serially (each one already runs several
# processes).  Runs both groups before reporting, so one failure does not
# hide another.
run_ctest() {
    local dir=$1 rc=0
    budgeted ctest --test-dir "$dir" --output-on-failure --timeout "$test_timeout" \
        -j"$jobs" -LE integration --output-junit ctest-unit.xml || rc=1
    if [[ ${2:-} != unit ]]; then
        budgeted ctest --test-dir "$dir" --output-on-failure --timeout "$test_timeout" \
            -L integration --no-tests=ignore --output-junit ctest-integration.xml || rc=1
    fi
    return "$rc"
}

# ---- 1. deps ----------------------------------------------------------------
stage "deps"
if [[ ${CFX_SKIP_DEPS:-0} != 1 ]]; then
    "$repo/scripts/deps.sh"
else
    echo "skipped (CFX_SKIP_DEPS=1)"
fi

# Every build below (and the Python package's) compiles through ccache
# (stage 1 installs it), with paths taken relative to the repository, so a
# fresh clone elsewhere hits what an earlier run compiled.  The compiler's
# output is the same either way.
if [[ ${CFX_CCACHE:-1} != 0 ]] && command -v ccache >/dev/null 2>&1; then
    export CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache
    export CMAKE_CUDA_COMPILER_LAUNCHER=ccache
    export CCACHE_BASEDIR=$repo CCACHE_NOHASHDIR=1
fi

# ---- 2, 3. configure and build ---------------------------------------------
stage "configure + build: $build_dir"
configure_and_build "$build_dir"

# ---- 4. test ----------------------------------------------------------------
# The integration tests run once: in stage 5, under ASan and UBSan (which
# see what they do wrong with memory as well as what they get wrong), and
# here only when that stage is off.  Twice, the script passed its budget on
# a 2-core machine.  Stage 4b still runs the collective test here, beside
# two CPU hogs.
stage "test: $build_dir"
if [[ ${CFX_TEST_SANITIZE:-1} != 0 ]]; then
    run_ctest "$build_dir" unit
else
    run_ctest "$build_dir"
fi

# ---- 4a. python ---------------------------------------------------------------
# The conflux package from a venv: pip builds it with the project's CMake
# (scikit-build-core; its build tree is kept in $build_dir/python-wheel, so a
# rerun recompiles only what changed), then pytest runs python/tests, whose
# multi-process tests start their ranks with the package's cfx_run.
stage "python"
if [[ ${CFX_TEST_PYTHON:-1} != 0 ]]; then
    py=${CFX_PYTHON:-/usr/bin/python3}
    py_ver=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    py_venv=${CFX_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/conflux/venv-$py_ver}
    [[ -x $py_venv/bin/python ]] || "$py" -m venv "$py_venv"
    # already-satisfied requirements cost no network round trip
    "$py_venv/bin/pip" install -q --disable-pip-version-check numpy pytest \
        'scikit-build-core>=0.10' ml_dtypes
    if [[ ${CFX_TEST_TORCH:-1} != 0 ]]; then
        free_gb=$(df -P -BG "$py_venv" | awk 'NR == 2 { sub("G", "", $4); print $4 }')
        if "$py_venv/bin/python" -c 'import torch' 2>/dev/null; then
            :
        elif ((free_gb >= 12)); then
            "$py_venv/bin/pip" install -q --disable-pip-version-check 'torch==2.15.0'
        else
            echo "torch: not installed, ${free_gb} GB free where it goes (needs 12):" \
                "the torch tests will skip (CFX_TEST_TORCH=0 leaves torch out on purpose)"
        fi
    fi
    if [[ ${CFX_TEST_RAY:-1} != 0 ]]; then
        "$py_venv/bin/pip" install -q --disable-pip-version-check 'ray==2.60.0'
    fi
    SKBUILD_BUILD_DIR="$repo/$build_dir/python-wheel" CMAKE_BUILD_PARALLEL_LEVEL=$jobs \
        "$py_venv/bin/pip" install -q --disable-pip-version-check --no-build-isolation \
        --config-settings=cmake.define.CFX_WERROR=ON "$repo/python"
    (cd "$repo/python" && budgeted "$py_venv/bin/python" -m pytest -q -rs \
        --junitxml="$repo/$build_dir/pytest.xml" tests)
else
    echo "skipped (CFX_TEST_PYTHON=0)"
fi

# ---- 4b. kernel caps ---------------------------------------------------------
# CFX_REDUCE_ISA caps the reduction kernels; a capped set counts as
# unsupported everywhere, so this machine runs what a CPU without AVX-512, and
# one without AVX2, would.  test_reduce lists its skipped sets with the reason.
# Two CPU hogs (stress-ng) run beside it: no test may depend on an idle machine.
stage "kernel caps: $build_dir"
if command -v stress-ng >/dev/null 2>&1; then
    stress-ng --cpu 2 --timeout "$budget" --quiet &
    hog_pid=$!
fi
caps_rc=0
# The full collective matrix ran in stage 4: here (and under the sanitizers)
# test_coll and test_objects keep every test but fewer group sizes
# (CFX_TEST_SUBSET, see their headers), so the whole script stays in budget.
export CFX_TEST_SUBSET=1
for isa in avx2 default; do
    echo "-- CFX_REDUCE_ISA=$isa"
    CFX_REDUCE_ISA=$isa "$build_dir/bin/test_reduce" --jobs 1 -S --verbose 2>&1 | grep -F '[SKIP]' || true
    CFX_REDUCE_ISA=$isa budgeted ctest --test-dir "$build_dir" --output-on-failure \
        --timeout "$test_timeout" -L reduce --output-junit "ctest-isa-$isa.xml" || caps_rc=1
done
if [[ -n $hog_pid ]]; then
    kill "$hog_pid" 2>/dev/null || true
    wait "$hog_pid" 2>/dev/null || true
    hog_pid=
fi
((caps_rc == 0))

# ---- 4c. release builds ------------------------------------------------------
# What a user's `cmake -DCMAKE_BUILD_TYPE=Release` compiles (-O3 finds
# warnings -O2 does not), with gcc and with clang, warnings as errors.
stage "release builds"
if [[ ${CFX_TEST_RELEASE:-1} != 0 ]]; then
    CC=gcc configure_and_build "${build_dir}-release-gcc" -DCMAKE_BUILD_TYPE=Release
    # clang: the library and the tools as a user builds them (the tests are
    # compiled at -O3 by the gcc build above)
    CC=clang configure_and_build "${build_dir}-release-clang" -DCMAKE_BUILD_TYPE=Release \
        -DCFX_WITH_CUDA=OFF -DBUILD_TESTING=OFF
else
    echo "skipped (CFX_TEST_RELEASE=0)"
fi

# ---- 5. sanitize --------------------------------------------------------------
stage "sanitize"
# Debug build with -fsanitize=address,undefined (UB aborts: no recovery);
# leak checking on, so a rank program or tool that loses memory on any exit
# path fails its test.  CUDA is left out: nothing of it runs here.  Not
# detect_stack_use_after_return: its fake stack frames break the 64-byte
# alignment of AVX-512 spill slots at -O0 (the bf16 kernels fault in them).
if [[ ${CFX_TEST_SANITIZE:-1} != 0 ]]; then
    export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1}
    export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
    # -O1: ASan's own advice for tests of any length (at -O0 they run about
    # twice as long; every check is still made)
    configure_and_build "${build_dir}-asan" -DCFX_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug \
        -DCMAKE_C_FLAGS_DEBUG="-g -O1" -DCFX_WITH_CUDA=OFF
    run_ctest "${build_dir}-asan"
    unset ASAN_OPTIONS UBSAN_OPTIONS
else
    echo "skipped (CFX_TEST_SANITIZE=0)"
fi

# ---- 6. rdma-vm -------------------------------------------------------------
# The build's programs on Soft-RoCE (rdma_rxe) in a QEMU guest made from
# Debian packages: test/vm/run.sh, commands from test/vm/tests.list.
# CFX_TEST_VM=0 skips it; its metrics land in $build_dir/vm-metrics.txt.
stage "rdma-vm"
if [[ ${CFX_TEST_VM:-1} != 0 ]]; then
    vm_timeout=$((budget - (SECONDS - start) - 10))
    ((vm_timeout < 540)) || vm_timeout=540
    ((vm_timeout >= 30)) || vm_timeout=30
    budgeted "$repo/test/vm/run.sh" --build-dir "$build_dir" --timeout "$vm_timeout"
else
    echo "skipped (CFX_TEST_VM=0)"
fi

# ---- 7. fuzz ----------------------------------------------------------------
# libFuzzer targets for every decoder of network bytes (test/fuzz), built with
# clang in ${build_dir}-fuzz and run CFX_FUZZ_SECONDS each (default 10: seven
# targets and the build stay under about three minutes) on copies of their
# seed corpora.  CFX_TEST_FUZZ=0 skips it.
stage "fuzz"
if [[ ${CFX_TEST_FUZZ:-1} != 0 ]]; then
    budgeted "$repo/test/fuzz/run.sh" "${build_dir}-fuzz" "${CFX_FUZZ_SECONDS:-10}"
else
    echo "skipped (CFX_TEST_FUZZ=0)"
fi
