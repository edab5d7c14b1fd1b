#!/usr/bin/env bash
# Conflux group collectives against Open MPI on an emulated cluster.
#
#   test/cluster/bench.sh [--nodes 4] [--rate 1gbit] [--sizes 1M:64M]
#                         [--ops "broadcast reduce allreduce [barrier]"] [--iters 5]
#                         [--obj-ops "broadcast reduce allreduce"] [--spacing MS]
#                         [--obj-args "ARGS"]
#                         [--coord-args "ARGS"] [--transport tcp|dpdk]
#                         [--warmup 1] [--timeout 300] [--build-dir DIR]
#                         [--results DIR] [--port 5000] [--no-conflux] [--no-mpi]
#                         [--prebuilt]
#
# Brings up cluster.sh's namespaces (one process per node), then for each op:
#   1. conflux-coord in node 0, cfx_coll_perf in every node (CFX_TRANSPORT=tcp,
#      CFX_BIND_ADDR = the node's address; with --transport dpdk the data
#      plane is the dpdk transport on the node's link through net_af_packet,
#      qdisc_bypass=0 so that the link's shaping holds);
#   2. test/mpi/mpi_coll under mpirun started in node 0, with Open MPI's
#      default algorithm choices;
#   3. the same with expert settings: dynamic rules, pipelined chain
#      broadcast and reduce in 128 KiB segments, ring allreduce.
# With --obj-ops, the object operations too (cfx_obj_perf: one rank puts and
# the others get; every rank puts an input and rank 0 reduces them; reduce
# and every rank gets the result), with --spacing MS between arrivals, on the
# same table as obj-broadcast, obj-reduce, obj-allreduce beside Open MPI's
# group operation of the same name; --obj-args passes more options to
# cfx_obj_perf (e.g. "--kill 2@200": node 2 dies 200 ms into the first
# timed iteration, and the survivors' time is reported; the victim exits 0,
# as cfx_obj_perf's victim does, so that no launcher stops the others; a
# kill timed after the operation ended changes nothing).  --coord-args passes options to
# conflux-coord (e.g. "--fanout 2" to compare with a fixed fan-out).
# --prebuilt takes the tools already in --build-dir/bin (cfx_coll_perf,
# cfx_obj_perf, conflux-coord) and builds nothing: for a machine that runs
# the bench but lacks the build's packages.
# Prints one table: per op and size the three times, their ratios and
# the bound the link rate sets (S/B for broadcast and reduce, 2(n-1)/n S/B
# for allreduce; a barrier has no size and no bound: one row, "0 B").  Every run has a timeout; everything started is stopped
# by PID and the cluster is torn down on exit.  Needs root.
# Exit status: 0, 1 when a run failed (or the set-up did), 2 on a usage
# error (an unknown option or a bad value, named on stderr).
set -euo pipefail

CMDLINE="$0 $*"
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
CLUSTER=$HERE/cluster.sh
export CFX_CLUSTER_PREFIX=${CFX_CLUSTER_PREFIX:-cfxc}
PREFIX=$CFX_CLUSTER_PREFIX
SUBNET=10.77.0.0/24

NODES=4
RATE=1gbit
SIZES=1M:64M
OPS="broadcast reduce allreduce"
OBJ_OPS=
SPACING=0
OBJ_ARGS=
COORD_ARGS=
ITERS=5
WARMUP=1
RUN_TIMEOUT=300
BUILD=$ROOT/build-perf
RESULTS=
PORT=5000
DO_CFX=1
DO_MPI=1
PREBUILT=0
TRANSPORT=tcp

die() { echo "bench.sh: $*" >&2; exit 1; }
bad() { echo "bench.sh: $*" >&2; exit 2; } # a usage error, as an unknown option
log() { echo "bench.sh: $*" >&2; }

usage() { sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; }

while [ $# -gt 0 ]; do
    case "$1" in
    --nodes | --rate | --sizes | --ops | --obj-ops | --spacing | --obj-args | --coord-args | \
        --iters | --warmup | --timeout | --build-dir | --results | --port | --transport)
        [ $# -ge 2 ] || { echo "bench.sh: $1 needs a value" >&2; exit 2; } ;;
    esac
    case "$1" in
    --nodes) NODES=$2; shift 2 ;;
    --rate) RATE=$2; shift 2 ;;
    --sizes) SIZES=$2; shift 2 ;;
    --ops) OPS=$2; shift 2 ;;
    --obj-ops) OBJ_OPS=$2; shift 2 ;;
    --spacing) SPACING=$2; shift 2 ;;
    --obj-args) OBJ_ARGS=$2; shift 2 ;;
    --coord-args) COORD_ARGS=$2; shift 2 ;;
    --iters) ITERS=$2; shift 2 ;;
    --warmup) WARMUP=$2; shift 2 ;;
    --timeout) RUN_TIMEOUT=$2; shift 2 ;;
    --build-dir) BUILD=$(realpath -m "$2"); shift 2 ;;
    --results) RESULTS=$(realpath -m "$2"); shift 2 ;;
    --port) PORT=$2; shift 2 ;;
    --no-conflux) DO_CFX=0; shift ;;
    --no-mpi) DO_MPI=0; shift ;;
    --prebuilt) PREBUILT=1; shift ;;
    --transport) TRANSPORT=$2; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "bench.sh: unknown option '$1' (--help lists them)" >&2; exit 2 ;;
    esac
done

[[ $NODES =~ ^[0-9]+$ ]] && [ "$NODES" -ge 2 ] && [ "$NODES" -le 64 ] || bad "--nodes: 2..64"
# one rate for every link: the table's bound is computed from it
[[ $RATE =~ ^[0-9]+(\.[0-9]+)?(bit|kbit|mbit|gbit)$ ]] ||
    bad "--rate: one rate such as 1gbit, 500mbit, 100kbit, not '$RATE'"
[[ $SIZES =~ ^([0-9]+[KMG]?):([0-9]+[KMG]?)$ ]] || bad "--sizes: MIN:MAX, e.g. 1M:64M"
MINB=${BASH_REMATCH[1]}
MAXB=${BASH_REMATCH[2]}
bytes() { numfmt --from=iec "$1"; }
[ "$(bytes "$MINB")" -le "$(bytes "$MAXB")" ] || bad "--sizes: MIN ($MINB) above MAX ($MAXB)"
[[ $ITERS =~ ^[0-9]+$ ]] && [ "$ITERS" -ge 1 ] || bad "--iters: a positive number"
[[ $WARMUP =~ ^[0-9]+$ ]] || bad "--warmup: a number"
[[ $RUN_TIMEOUT =~ ^[0-9]+$ ]] && [ "$RUN_TIMEOUT" -ge 10 ] || bad "--timeout: seconds, >= 10"
[[ $PORT =~ ^[0-9]+$ ]] && [ "$PORT" -ge 1024 ] && [ "$PORT" -le 65535 ] || bad "--port"
for op in $OPS; do
    case "$op" in
    broadcast | reduce | allreduce | barrier) ;;
    *) bad "--ops: broadcast, reduce, allreduce, barrier" ;;
    esac
done
for op in $OBJ_OPS; do
    case "$op" in
    broadcast | reduce | allreduce) ;;
    *) bad "--obj-ops: broadcast, reduce, allreduce" ;;
    esac
done
[[ $SPACING =~ ^[0-9]+$ ]] || bad "--spacing: milliseconds"
case "$TRANSPORT" in tcp | dpdk) ;; *) bad "--transport: tcp or dpdk" ;; esac
[ "$(id -u)" = 0 ] || die "needs root (network namespaces)"
[ -z "${CFX_BENCH_LOCKED:-}" ] || die "already inside a bench run"
if [ "$DO_CFX" = 1 ] && [ "$PREBUILT" = 1 ]; then
    for t in cfx_coll_perf cfx_obj_perf conflux-coord; do
        [ -x "$BUILD/bin/$t" ] || die "--prebuilt: $BUILD/bin/$t is missing"
    done
fi

# One bench at a time: the cluster's names are fixed.
mkdir -p /run/lock
exec 9>"/run/lock/$PREFIX-bench.lock"
flock -n 9 || die "another bench.sh holds /run/lock/$PREFIX-bench.lock"
if ip netns list | awk '{print $1}' | grep -q "^$PREFIX-"; then
    die "namespaces $PREFIX-* exist already (another cluster?): '$CLUSTER down' first"
fi

RESULTS=${RESULTS:-$(mktemp -d /tmp/cfx-bench.XXXXXX)}
mkdir -p "$RESULTS"

# ---- build -------------------------------------------------------------------
if [ "$DO_MPI" = 1 ] && ! command -v mpicc >/dev/null; then
    log "installing Open MPI (openmpi-bin libopenmpi-dev)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q openmpi-bin libopenmpi-dev >&2 ||
        { apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive \
            apt-get install -y -q openmpi-bin libopenmpi-dev >&2; }
fi
if [ "$DO_CFX" = 1 ] && [ "$PREBUILT" = 0 ]; then
    # a Release build, as the figures in docs/PERFORMANCE.md were measured
    [ -f "$BUILD/CMakeCache.txt" ] ||
        cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DCFX_WITH_CUDA=OFF >&2
    cmake --build "$BUILD" -j"$(nproc)" --target cfx_coll_perf cfx_obj_perf conflux-coord >&2 ||
        die "build of the Conflux tools failed (--no-conflux runs the MPI side alone)"
fi
if [ "$DO_MPI" = 1 ]; then
    mkdir -p "$BUILD"
    mpicc -O2 -std=gnu11 -Wall -Wextra -Werror -o "$BUILD/mpi_coll" "$ROOT/test/mpi/mpi_coll.c"
fi

# ---- cleanup: what we started, by PID; then the cluster --------------------------
PIDS=()
cleanup() {
    local rc=$? pid
    trap - EXIT INT TERM
    for pid in "${PIDS[@]}"; do
        kill -TERM "$pid" 2>/dev/null || true
    done
    for pid in "${PIDS[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    "$CLUSTER" down || true
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

forget_pid() { # drop $1 from PIDS once it has been waited for
    local keep=() p
    for p in "${PIDS[@]}"; do [ "$p" = "$1" ] || keep+=("$p"); done
    PIDS=("${keep[@]+"${keep[@]}"}")
}

LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
"$CLUSTER" up "$NODES" "$RATE" >&2
HOSTS=$(for i in $(seq 0 $((NODES - 1))); do printf '%s-n%s:1,' "$PREFIX" "$i"; done)
HOSTS=${HOSTS%,}
NODE0_IP=$("$CLUSTER" addr 0)
export CFX_BENCH_LOCKED=1

COMMON_FLAGS=(-b "$MINB" -e "$MAXB" -f 2 -n "$ITERS" -w "$WARMUP" -c 1 --json)

# ---- conflux -------------------------------------------------------------------
run_conflux() { # op [tool name flags...]: cfx_coll_perf, or cfx_obj_perf as obj-OP
    local op=$1 tool=${2:-cfx_coll_perf} name=${3:-$1} i coord_pid pids=() rc=0 token
    local flags=("${COMMON_FLAGS[@]}")
    [ $# -gt 3 ] && flags=("${@:4}")
    token=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
    CFX_TOKEN=$token timeout -k 5 "$((RUN_TIMEOUT + 30))" "$CLUSTER" exec 0 \
        "$BUILD/bin/conflux-coord" --bind "$NODE0_IP" --port "$PORT" $COORD_ARGS \
        > "$RESULTS/coord-$name.log" 2>&1 9>&- &
    coord_pid=$!
    PIDS+=("$coord_pid")
    for _ in $(seq 100); do
        grep -q "listening" "$RESULTS/coord-$name.log" 2>/dev/null && break
        kill -0 "$coord_pid" 2>/dev/null || break
        sleep 0.1
    done
    if ! grep -q "listening" "$RESULTS/coord-$name.log"; then
        log "conflux-coord did not start: $(cat "$RESULTS/coord-$name.log")"
        kill -TERM "$coord_pid" 2>/dev/null || true
        wait "$coord_pid" 2>/dev/null || true
        forget_pid "$coord_pid"
        return 1
    fi
    local dpdk_env=()
    if [ "$TRANSPORT" = dpdk ]; then # the node's own link, through the kernel's packet socket
        for i in $(seq 0 $((NODES - 1))); do
            dpdk_env[i]=CFX_DPDK_VDEV=net_af_packet0,iface=$PREFIX-e$i,qdisc_bypass=0
        done
    fi
    for i in $(seq 0 $((NODES - 1))); do
        CFX_COORD=$NODE0_IP:$PORT CFX_TOKEN=$token CFX_RANK=$i CFX_WORLD_SIZE=$NODES \
            CFX_TRANSPORT=$TRANSPORT CFX_BIND_ADDR=$("$CLUSTER" addr "$i") \
            env ${dpdk_env[$i]:+"${dpdk_env[$i]}"} \
            timeout -k 5 "$RUN_TIMEOUT" "$CLUSTER" exec "$i" \
            "$BUILD/bin/$tool" -o "$op" "${flags[@]}" \
            > "$RESULTS/cfx-$name.$i.out" 2> "$RESULTS/cfx-$name.$i.err" 9>&- &
        pids+=($!)
        PIDS+=($!)
    done
    for i in "${!pids[@]}"; do
        if ! wait "${pids[$i]}"; then
            rc=1
            log "conflux $name: rank $i failed: $(tail -3 "$RESULTS/cfx-$name.$i.err")"
        fi
        forget_pid "${pids[$i]}"
    done
    kill -TERM "$coord_pid" 2>/dev/null || true
    wait "$coord_pid" 2>/dev/null || true
    forget_pid "$coord_pid"
    cp "$RESULTS/cfx-$name.0.out" "$RESULTS/cfx-$name.json"
    return $rc
}

# ---- Open MPI ------------------------------------------------------------------
# shellcheck disable=SC2054  # "tcp,self" is one argument
MPI_COMMON=(--allow-run-as-root -np "$NODES" --host "$HOSTS" --map-by node --bind-to none
    --mca plm rsh --mca plm_rsh_agent "$HERE/rsh-agent.sh"
    --mca btl tcp,self --mca btl_tcp_if_include "$SUBNET" --mca oob_tcp_if_include "$SUBNET"
    --mca mpi_yield_when_idle 1)
# what an expert sets: pipelined chain (pipeline = chain of fan-out 1) in
# 128 KiB segments for broadcast and reduce, ring allreduce
MPI_TUNED=(--mca coll_tuned_use_dynamic_rules 1
    --mca coll_tuned_bcast_algorithm 3 --mca coll_tuned_bcast_algorithm_segmentsize 131072
    --mca coll_tuned_reduce_algorithm 3 --mca coll_tuned_reduce_algorithm_segmentsize 131072
    --mca coll_tuned_allreduce_algorithm 4)

run_mpi() { # op default|tuned
    local op=$1 kind=$2 pid extra=()
    [ "$kind" = tuned ] && extra=("${MPI_TUNED[@]}")
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
        timeout -k 5 "$RUN_TIMEOUT" "$CLUSTER" exec 0 \
        mpirun "${MPI_COMMON[@]}" "${extra[@]}" "$BUILD/mpi_coll" -o "$op" "${COMMON_FLAGS[@]}" \
        > "$RESULTS/mpi-$kind-$op.json" 2> "$RESULTS/mpi-$kind-$op.err" 9>&- &
    pid=$!
    PIDS+=("$pid")
    if ! wait "$pid"; then
        log "mpi $kind $op failed: $(tail -3 "$RESULTS/mpi-$kind-$op.err")"
        forget_pid "$pid"
        return 1
    fi
    forget_pid "$pid"
}

status=0
for op in $OPS; do
    if [ "$DO_CFX" = 1 ]; then
        log "conflux $op ($NODES nodes, $RATE)"
        run_conflux "$op" || status=1
    fi
    if [ "$DO_MPI" = 1 ]; then
        log "Open MPI $op, default"
        run_mpi "$op" default || status=1
        log "Open MPI $op, tuned"
        run_mpi "$op" tuned || status=1
    fi
done

for op in $OBJ_OPS; do
    log "conflux object $op ($NODES nodes, $RATE, arrivals ${SPACING} ms apart)"
    run_conflux "$op" cfx_obj_perf "obj-$op" -b "$MINB" -e "$MAXB" -f 2 -n "$ITERS" -w "$WARMUP" \
        -A "$SPACING" $OBJ_ARGS --json || status=1
done

# ---- the table -----------------------------------------------------------------
python3 - "$RESULTS" "$NODES" "$RATE" "$OPS" "$OBJ_OPS" > "$RESULTS/table.md" <<'EOF'
import json, re, sys
results, n, rate, ops = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4].split()
ops += ['obj-' + o for o in sys.argv[5].split()]
m = re.fullmatch(r'([0-9.]+)(bit|kbit|mbit|gbit)', rate)
bps = float(m.group(1)) * {'bit': 1, 'kbit': 1e3, 'mbit': 1e6, 'gbit': 1e9}[m.group(2)]

def load(name):
    try:
        text = open(f'{results}/{name}').read()
    except OSError:
        return {}
    out = {}
    for obj in re.findall(r'\{"size":[^{}]*\}', text):  # survives a truncated document
        r = json.loads(obj)
        if 'time_ms' in r:  # cfx_obj_perf
            r['time_us'] = r['time_ms'] * 1000
        if r.get('inplace', 0) == 0:
            out[r['size']] = r
    return out

def ms(r):  # 0.1 ms steps hide the small sizes: three decimals below 10 ms
    if not r:
        return '-'
    t = r['time_us'] / 1000
    return (f"{t:.1f}" if t >= 10 else f"{t:.3f}") + ('' if not r.get('wrong') else ' (wrong!)')

def ratio(a, b):
    return f"{a['time_us'] / b['time_us']:.2f}" if a and b and b['time_us'] > 0 else '-'

print(f"| op | size | conflux ms | MPI default ms | MPI tuned ms | conflux/default "
      f"| conflux/tuned | bound ms | conflux/bound | default/bound | tuned/bound |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for op in ops:
    group_op = op[4:] if op.startswith('obj-') else op  # an object op beside MPI's same op
    c = load(f'cfx-{op}.json')
    d, t = load(f'mpi-default-{group_op}.json'), load(f'mpi-tuned-{group_op}.json')
    factor = 2 * (n - 1) / n if group_op == 'allreduce' else 1.0
    for size in sorted(set(c) | set(d) | set(t)):
        bound = {'time_us': factor * size * 8 / bps * 1e6}
        sz = (f"{size >> 20} MiB" if size >= 1 << 20 else
              f"{size >> 10} KiB" if size >= 1 << 10 else f"{size} B")
        bound_ms = ms(bound) if size else '-'
        print(f"| {op} | {sz} | {ms(c.get(size))} | {ms(d.get(size))} | {ms(t.get(size))} "
              f"| {ratio(c.get(size), d.get(size))} | {ratio(c.get(size), t.get(size))} "
              f"| {bound_ms} | {ratio(c.get(size), bound)} "
              f"| {ratio(d.get(size), bound)} | {ratio(t.get(size), bound)} |")
EOF
echo "# command: $CMDLINE"
echo "# $(nproc) CPUs; load average before: $LOAD_BEFORE, after: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# $NODES nodes, each link $RATE (tbf burst 512kb); $ITERS iterations + $WARMUP warm-up;"
echo "# conflux data plane: $TRANSPORT"
echo "# bound = S/B (broadcast, reduce), 2(n-1)/n * S/B (allreduce) at the link rate;"
echo "# up to a few MiB, tbf's burst (512 KB) lets a transfer beat the rate"
[ -z "$OBJ_OPS" ] || echo "# obj-*: cfx_obj_perf, arrivals $SPACING ms apart (time = last finish - last start)"
cat "$RESULTS/table.md"
log "logs and JSON in $RESULTS"
exit $status
