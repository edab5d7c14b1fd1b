#!/usr/bin/env bash
# Build the libFuzzer targets and run each for a fixed time on a copy of its
# seed corpus; fail on any crash, leak, sanitizer report or timeout.
#
#   test/fuzz/run.sh BUILD_DIR [SECONDS]     (SECONDS per target, default 20)
#
# BUILD_DIR is configured with CC=clang -DCFX_FUZZ=ON (a build directory of
# its own: the fuzz build instruments the decoders for libFuzzer, ASan and
# UBSan).  Crash inputs land in BUILD_DIR/fuzz-work/<target>/; reproduce one
# with BUILD_DIR/bin/<target> FILE.  CFX_FUZZ_TARGETS limits the targets.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build_dir=${1:?usage: test/fuzz/run.sh BUILD_DIR [SECONDS]}
seconds=${2:-20}
all_targets="fuzz_proto fuzz_ctl_seal fuzz_dp_msg fuzz_tcp_hdr fuzz_shm_msg fuzz_shm_ring"
all_targets+=" fuzz_dpdk_hdr fuzz_coord_state fuzz_metrics_req"
targets=${CFX_FUZZ_TARGETS:-$all_targets}
cc=${CFX_FUZZ_CC:-clang}

case $build_dir in /*) ;; *) build_dir=$PWD/$build_dir ;; esac
if ! command -v "$cc" >/dev/null; then
    echo "fuzz: $cc not found (libFuzzer needs clang)" >&2
    exit 1
fi

CC=$cc cmake -S "$repo" -B "$build_dir" -DCFX_FUZZ=ON -DBUILD_TESTING=OFF \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCFX_WITH_VERBS=OFF -DCFX_WITH_DPDK=OFF -DCFX_WITH_CUDA=OFF >/dev/null
cmake --build "$build_dir" --target cfx_fuzzers -j"$(nproc 2>/dev/null || echo 2)" >/dev/null

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
work=$build_dir/fuzz-work
failed=()
for t in $targets; do
    dir=$work/$t
    rm -rf "$dir"
    mkdir -p "$dir/corpus"
    cp "$repo/test/fuzz/corpus/$t/"* "$dir/corpus/"
    max_len=4096
    [[ $t == fuzz_shm_msg ]] && max_len=4160
    [[ $t == fuzz_proto || $t == fuzz_ctl_seal ]] && max_len=16384
    [[ $t == fuzz_dpdk_hdr ]] && max_len=9200
    start=$SECONDS
    rc=0
    "$build_dir/bin/$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
        -max_len=$max_len -artifact_prefix="$dir/" -print_final_stats=1 \
        "$dir/corpus" >"$dir/log" 2>&1 || rc=$?
    execs=$(grep -m1 -o 'stat::number_of_executed_units: *[0-9]*' "$dir/log" | grep -o '[0-9]*$' || echo '?')
    if ((rc != 0)); then
        echo "fuzz: $t FAILED (exit $rc) after $((SECONDS - start))s; log: $dir/log" >&2
        grep -E 'ERROR|SUMMARY|Test unit written|==[0-9]+==' "$dir/log" | head -20 >&2 || true
        failed+=("$t")
    else
        echo "fuzz: $t ok: $execs runs in $((SECONDS - start))s, corpus $(ls "$dir/corpus" | wc -l) inputs"
    fi
done
if ((${#failed[@]})); then
    echo "fuzz: failed: ${failed[*]}" >&2
    exit 1
fi
