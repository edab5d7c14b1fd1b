#!/usr/bin/env bash
# Run ctest again and again to find the tests that fail only sometimes.
#
#   scripts/test-repeat.sh [--load] N [CTEST_ARGS...]
#
# Runs `ctest CTEST_ARGS` N times in the build directory, then prints every
# test that failed and in how many of the N runs, with the Criterion cases
# that failed inside it and the log of each failing run.  Exits 0 only when
# all N runs passed.  Works from any directory.
#
#   --load   two CPU hogs (stress-ng --cpu 2) run beside every pass, so that
#            the tests run on a loaded machine, as CI and a busy laptop do;
#            stress-ng is installed through scripts/deps.sh when missing
#
# Examples:
#   scripts/test-repeat.sh --load 20 -R integration/
#   scripts/test-repeat.sh --load 5 -LE integration -j2
#   scripts/test-repeat.sh 50 -R integration/test_objects
#
# Each pass is `ctest --test-dir DIR --output-on-failure --timeout T
# CTEST_ARGS`; its output goes to DIR/test-repeat/run-I.log (kept only for
# failing passes, so the cause can be read afterwards).
#
# Environment:
#   CFX_BUILD_DIR       build directory (default: build)
#   CFX_TEST_TIMEOUT    per-test timeout in seconds for tests that set none
#                       (default 600; tests' own TIMEOUT properties win)
#   CFX_REPEAT_BUDGET   seconds all N passes may take (default 14400, 4 h):
#                       no pass starts when less is left than the last pass
#                       took, and a pass still going when it is spent is
#                       killed (and counted as failed)
set -euo pipefail

usage() {
    echo "usage: scripts/test-repeat.sh [--load] N [CTEST_ARGS...]" >&2
    exit 2
}

load=0
if [[ ${1:-} == --load ]]; then
    load=1
    shift
fi
[[ ${1:-} =~ ^[1-9][0-9]{0,4}$ ]] || usage
runs=$1
shift

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
build_dir=${CFX_BUILD_DIR:-build}
test_timeout=${CFX_TEST_TIMEOUT:-600}
budget=${CFX_REPEAT_BUDGET:-14400}
[[ $test_timeout =~ ^[1-9][0-9]*$ ]] || { echo "test-repeat: bad CFX_TEST_TIMEOUT '$test_timeout'" >&2; exit 2; }
[[ $budget =~ ^[1-9][0-9]*$ ]] || { echo "test-repeat: bad CFX_REPEAT_BUDGET '$budget'" >&2; exit 2; }
if [[ ! -f $build_dir/CTestTestfile.cmake ]]; then
    echo "test-repeat: $build_dir has no tests; build it first (scripts/test.sh, or cmake -B $build_dir -DBUILD_TESTING=ON)" >&2
    exit 2
fi
log_dir=$build_dir/test-repeat
mkdir -p "$log_dir"
rm -f "$log_dir"/run-*.log

start=$SECONDS
hog_pid='' pass_pid=''
# stop_all: end the pass in flight (timeout passes the signal on to ctest's
# process group) and the hogs; runs on every exit, interrupts included.
stop_all() {
    local pid
    for pid in $pass_pid $hog_pid; do
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    pass_pid='' hog_pid=''
}
trap stop_all EXIT
trap 'echo "test-repeat: interrupted" >&2; exit 130' INT TERM

if ((load)); then
    if ! command -v stress-ng >/dev/null 2>&1; then
        "$repo/scripts/deps.sh"
    fi
    # its own timeout too: the hogs end even if this script is killed -9
    stress-ng --cpu 2 --timeout "$budget" --quiet &
    hog_pid=$!
fi

declare -A fails=()   # ctest test name -> failing passes
declare -A cases=()   # "test<TAB>suite::case" -> failing passes
passed=0 done_runs=0 last=0
for ((i = 1; i <= runs; i++)); do
    left=$((budget - (SECONDS - start)))
    # a pass that cannot finish in what is left would only be killed
    if ((left <= 0 || left < last)); then
        echo "test-repeat: ${left}s of the budget of ${budget}s left, a pass took ${last}s: stopping after $done_runs of $runs passes" >&2
        break
    fi
    log=$log_dir/run-$i.log
    t0=$SECONDS rc=0
    # in the background, so that an interrupt is handled at once (bash runs
    # traps between commands, and `wait` is one)
    timeout -k 20 "$left" ctest --test-dir "$build_dir" --output-on-failure \
        --timeout "$test_timeout" "$@" >"$log" 2>&1 &
    pass_pid=$!
    wait "$pass_pid" || rc=$?
    pass_pid=''
    done_runs=$i
    t=$((SECONDS - t0)) last=$((SECONDS - t0))
    if ((rc == 0)); then
        passed=$((passed + 1))
        printf 'pass %d/%d: ok (%ds)\n' "$i" "$runs" "$t"
        rm -f "$log"
        continue
    fi
    # ctest's summary: "The following tests FAILED:" then "  12 - name (Failed)"
    mapfile -t failed < <(sed -n '/^The following tests FAILED:/,$ s/^[[:space:]]*[0-9]\+ - \(.*\) ([^)]*)$/\1/p' "$log")
    if ((rc == 124 || rc == 137)); then
        failed+=("(budget: pass killed)")
    elif ((${#failed[@]} == 0)); then
        failed+=("(ctest exit $rc)")
    fi
    for name in "${failed[@]}"; do
        fails[$name]=$((${fails[$name]:-0} + 1))
    done
    # Criterion names its failing cases "[FAIL] suite::case"; --output-on-failure
    # prints them inside the block of the ctest test they belong to
    while IFS=$'\t' read -r name case; do
        [[ -n $case ]] && cases[$name$'\t'$case]=$((${cases[$name$'\t'$case]:-0} + 1))
    done < <(awk '
        /^[[:space:]]*[0-9]+\/[0-9]+ Test +#[0-9]+: / { name = $4 }
        match($0, /\[FAIL\] [A-Za-z0-9_]+::[A-Za-z0-9_]+/) {
            c = substr($0, RSTART + 7, RLENGTH - 7)
            if (!seen[name "\t" c]++) print name "\t" c
        }' "$log")
    printf 'pass %d/%d: FAILED (%ds): %s; log %s\n' "$i" "$runs" "$t" "${failed[*]}" "$log"
done
stop_all

t=$((SECONDS - start))
printf '\ntest-repeat: %d of %d passes of ctest %s passed%s, %dm%02ds\n' "$passed" "$done_runs" \
    "$*" "$( ((load)) && echo ' under load (stress-ng --cpu 2)')" $((t / 60)) $((t % 60))
if ((${#fails[@]} == 0 && done_runs == runs)); then
    exit 0
fi
mapfile -t names < <(printf '%s\n' "${!fails[@]}" | sort)
mapfile -t keys < <(printf '%s\n' "${!cases[@]}" | sort)
for name in "${names[@]}"; do
    [[ -n $name ]] || continue
    printf '  %-40s failed %d of %d\n' "$name" "${fails[$name]}" "$done_runs"
    for key in "${keys[@]}"; do
        if [[ -n $key && ${key%%$'\t'*} == "$name" ]]; then
            printf '      %-36s %d\n' "${key#*$'\t'}" "${cases[$key]}"
        fi
    done
done
exit 1
