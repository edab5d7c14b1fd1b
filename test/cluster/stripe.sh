#!/usr/bin/env bash
# Striped gets on the emulated cluster: one getter with a fast link pulls an
# object from several complete holders with slower links, with striping
# (the default CFX_GET_SOURCES) and without (CFX_GET_SOURCES=1), and the
# ratio of the two times.
#
#   test/cluster/stripe.sh [--nodes 5] [--rates 4gbit,1gbit] [--size 64M]
#                          [--runs 3] [--iters 3] [--build-dir DIR]
#
# Node 0 is the getter (its link the first rate), node 1 puts the object,
# nodes 2..N-1 get it first (cfx_obj_perf --replicas), so N-1 complete
# holders exist when node 0's timed get starts.  Each run is one
# cfx_obj_perf invocation per setting (its median over --iters); the two
# settings alternate, and the medians over the runs are compared.  Prints
# each run's times, the medians and their ratio.  The cluster's names
# start with $CFX_CLUSTER_PREFIX (default cfxs); it is removed at the end.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
export CFX_CLUSTER_PREFIX=${CFX_CLUSTER_PREFIX:-cfxs}
CLUSTER=$HERE/cluster.sh
NODES=5
RATES=4gbit,1gbit
SIZE=64M
RUNS=3
ITERS=3
BUILD=$ROOT/build-perf
PORT=5000

die() { echo "stripe.sh: $*" >&2; exit 1; }
usage_die() { echo "stripe.sh: $*" >&2; exit 2; }

while [ $# -gt 0 ]; do
    case "$1" in
    --nodes | --rates | --size | --runs | --iters | --build-dir)
        [ $# -ge 2 ] || usage_die "$1 needs a value" ;;
    esac
    case "$1" in
    --nodes) NODES=$2; shift 2 ;;
    --rates) RATES=$2; shift 2 ;;
    --size) SIZE=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    --iters) ITERS=$2; shift 2 ;;
    --build-dir) BUILD=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
    *) usage_die "unknown argument '$1' (--help)" ;;
    esac
done
[[ $NODES =~ ^[0-9]+$ ]] && [ "$NODES" -ge 3 ] || usage_die "--nodes: at least 3"
[[ $RUNS =~ ^[0-9]+$ ]] && [ "$RUNS" -ge 1 ] || usage_die "--runs: a count"
[ "$(id -u)" = 0 ] || die "needs root (network namespaces)"
[ -x "$BUILD/bin/cfx_obj_perf" ] && [ -x "$BUILD/bin/conflux-coord" ] ||
    die "no cfx_obj_perf / conflux-coord in $BUILD/bin (cmake --build $BUILD --target cfx_obj_perf conflux-coord)"
if ip netns list | awk '{print $1}' | grep -q "^$CFX_CLUSTER_PREFIX-"; then
    die "namespaces $CFX_CLUSTER_PREFIX-* exist already: '$CLUSTER down' first"
fi

RESULTS=$(mktemp -d /tmp/cfx-stripe.XXXXXX)
PIDS=()
cleanup() {
    local rc=$? pid
    trap - EXIT INT TERM
    for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
    "$CLUSTER" down || true
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
"$CLUSTER" up "$NODES" "$RATES"
NODE0_IP=$("$CLUSTER" addr 0)

# One cfx_obj_perf run; prints its median time in ms.  $1: CFX_GET_SOURCES
# ("" = the default), $2: a name for the logs.
run_one() {
    local sources=$1 name=$2 token coord_pid i pids=() rc=0
    token=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
    CFX_TOKEN=$token timeout -k 5 300 "$CLUSTER" exec 0 \
        "$BUILD/bin/conflux-coord" --bind "$NODE0_IP" --port "$PORT" \
        > "$RESULTS/coord-$name.log" 2>&1 &
    coord_pid=$!
    PIDS+=("$coord_pid")
    for _ in $(seq 100); do
        grep -q "listening" "$RESULTS/coord-$name.log" 2>/dev/null && break
        sleep 0.1
    done
    for i in $(seq 0 $((NODES - 1))); do
        CFX_COORD=$NODE0_IP:$PORT CFX_TOKEN=$token CFX_RANK=$i CFX_WORLD_SIZE=$NODES \
            CFX_TRANSPORT=tcp CFX_BIND_ADDR=$("$CLUSTER" addr "$i") \
            env ${sources:+CFX_GET_SOURCES=$sources} \
            timeout -k 5 300 "$CLUSTER" exec "$i" \
            "$BUILD/bin/cfx_obj_perf" -o broadcast -r 1 --replicas $((NODES - 2)) \
            -b "$SIZE" -e "$SIZE" -n "$ITERS" -w 1 -c 1 --json \
            > "$RESULTS/$name.$i.out" 2> "$RESULTS/$name.$i.err" &
        pids+=($!)
    done
    for i in "${!pids[@]}"; do
        wait "${pids[$i]}" || { rc=1; echo "stripe.sh: $name rank $i failed: $(tail -3 "$RESULTS/$name.$i.err")" >&2; }
    done
    kill -TERM "$coord_pid" 2>/dev/null || true
    wait "$coord_pid" 2>/dev/null || true
    [ "$rc" = 0 ] || return 1
    python3 -c 'import json,sys
d = json.load(open(sys.argv[1]))
r = d["results"][0] if "results" in d else d["rows"][0]
assert r["wrong"] == 0 and r["failed"] == 0, r
print("%.1f" % r["time_ms"])' "$RESULTS/$name.0.out"
}

STRIPED=()
SINGLE=()
for run in $(seq 1 "$RUNS"); do
    s=$(run_one "" "striped-$run") || die "striped run $run failed (logs in $RESULTS)"
    o=$(run_one 1 "single-$run") || die "single-source run $run failed (logs in $RESULTS)"
    echo "run $run: striped $s ms, CFX_GET_SOURCES=1 $o ms"
    STRIPED+=("$s")
    SINGLE+=("$o")
done
python3 -c 'import statistics,sys
n = int(sys.argv[1]); a = [float(x) for x in sys.argv[2:2 + n]]; b = [float(x) for x in sys.argv[2 + n:]]
ms, mo = statistics.median(a), statistics.median(b)
print("median: striped %.1f ms, one source %.1f ms, ratio %.2fx" % (ms, mo, mo / ms))' \
    "$RUNS" "${STRIPED[@]}" "${SINGLE[@]}"
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "logs: $RESULTS"
