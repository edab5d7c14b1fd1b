#!/usr/bin/env bash
# Measure, then draw, the PNGs docs/PERFORMANCE.md shows, on this host.
#
#   scripts/bench-plots.sh [--build-dir DIR] [--img DIR] [--results DIR]
#                          [--ops "allreduce broadcast"] [-b 1K] [-e 64M]
#                          [-n ITERS] [-w WARMUP] [--epochs N] [--timeout SEC]
#
# (--ops "" draws only the parameter-server timeline.)
# 1. For each op: `cfx_run -n 4 cfx_coll_perf -o OP -b B -e E -f 4 -n ITERS
#    -w WARMUP -c 1 --json` (Conflux's defaults: no transport forced) and the
#    same sweep of test/mpi/mpi_coll under `mpirun -np 4` (Open MPI's
#    defaults on one host, with --oversubscribe --bind-to none --mca
#    mpi_yield_when_idle 1 as scripts/bench-latency.sh: busy-polling ranks
#    starve each other on 2 cores otherwise), one after the other; -c 1
#    checks every element of one extra call on both sides.  Then
#    scripts/plot.sh busbw draws IMG/busbw-OP.png.
# 2. The parameter-server demo (`cfx_run -n 6 cfx_train --epochs N`, server
#    1 made slow halfway) with `rdmactl --json ps --job train shards` asked
#    every 0.2 s (each ask joins the coordinator briefly): the blocks of each
#    server over time into ps-timeline.csv, and scripts/plot.sh ps draws
#    IMG/ps-blocks.png.
#
# The raw JSON and CSV stay in RESULTS (default: a new /tmp/cfx-plots-XXXXXX,
# printed).  Needs gnuplot and jq, and Open MPI with mpicc (apt-get install
# gnuplot-nox jq openmpi-bin libopenmpi-dev); mpi_coll is built into the
# build directory.  Uses BUILD/bin/{cfx_run,cfx_coll_perf,cfx_train,rdmactl}
# (default build/; measure a Release build).  Every run has a timeout.
# Exits 0 after drawing, 2 on bad usage or a failed run.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
BUILD=$ROOT/build
IMG=$ROOT/docs/img
RESULTS=
OPS="allreduce broadcast"
MINB=1K
MAXB=64M
ITERS=10
WARMUP=2
EPOCHS=16
RUN_TIMEOUT=300

die() { echo "bench-plots: $*" >&2; exit 2; }
usage() { sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; }

while [ $# -gt 0 ]; do
    case "$1" in
    --build-dir) BUILD=$(realpath -m "$2"); shift 2 ;;
    --img) IMG=$(realpath -m "$2"); shift 2 ;;
    --results) RESULTS=$(realpath -m "$2"); shift 2 ;;
    --ops) OPS=$2; shift 2 ;;
    -b) MINB=$2; shift 2 ;;
    -e) MAXB=$2; shift 2 ;;
    -n) ITERS=$2; shift 2 ;;
    -w) WARMUP=$2; shift 2 ;;
    --epochs) EPOCHS=$2; shift 2 ;;
    --timeout) RUN_TIMEOUT=$2; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; exit 2 ;;
    esac
done
[[ $ITERS =~ ^[0-9]+$ ]] && [ "$ITERS" -ge 1 ] || die "-n: a positive number"
[[ $WARMUP =~ ^[0-9]+$ ]] || die "-w: a number"
[[ $EPOCHS =~ ^[0-9]+$ ]] && [ "$EPOCHS" -ge 2 ] || die "--epochs: 2 or more"
[[ $RUN_TIMEOUT =~ ^[0-9]+$ ]] && [ "$RUN_TIMEOUT" -ge 5 ] || die "--timeout: seconds, >= 5"
for s in "$MINB" "$MAXB"; do [[ $s =~ ^[0-9]+[KMG]?$ ]] || die "-b/-e: e.g. 1K, 64M"; done
for op in $OPS; do
    case "$op" in allreduce | broadcast | reduce) ;; *) die "--ops: allreduce broadcast reduce" ;; esac
done
for p in cfx_run cfx_coll_perf cfx_train rdmactl; do
    [ -x "$BUILD/bin/$p" ] || die "no $BUILD/bin/$p: build first"
done
need=(gnuplot jq)
[ -z "$OPS" ] || need+=(mpicc mpirun)
for c in "${need[@]}"; do
    command -v "$c" >/dev/null || die "$c not found (apt-get install gnuplot-nox jq openmpi-bin libopenmpi-dev)"
done
MPI_COLL=$BUILD/mpi_coll
if [ -n "$OPS" ] && { [ ! -x "$MPI_COLL" ] || [ "$ROOT/test/mpi/mpi_coll.c" -nt "$MPI_COLL" ]; }; then
    mpicc -O2 -o "$MPI_COLL" "$ROOT/test/mpi/mpi_coll.c" || die "mpicc failed"
fi
if [ -z "$RESULTS" ]; then
    RESULTS=$(mktemp -d /tmp/cfx-plots-XXXXXX)
fi
mkdir -p "$RESULTS" "$IMG"
echo "bench-plots: results in $RESULTS" >&2
SWEEP=(-b "$MINB" -e "$MAXB" -f 4 -n "$ITERS" -w "$WARMUP" -c 1 --json)

# ---- 1. bus bandwidth against size ---------------------------------------------
for op in $OPS; do
    echo "bench-plots: $op: Conflux (cfx_run -n 4)" >&2
    timeout "$RUN_TIMEOUT" "$BUILD/bin/cfx_run" -n 4 -T "$RUN_TIMEOUT" "$BUILD/bin/cfx_coll_perf" \
        -o "$op" "${SWEEP[@]}" > "$RESULTS/cfx-$op.out" 2>&1 ||
        { tail -5 "$RESULTS/cfx-$op.out" >&2; die "cfx_coll_perf -o $op failed"; }
    sed -n 's/^\[0\] \({.*"results".*\)$/\1/p' "$RESULTS/cfx-$op.out" > "$RESULTS/cfx-$op.json"
    echo "bench-plots: $op: Open MPI (mpirun -np 4)" >&2
    timeout "$RUN_TIMEOUT" mpirun --allow-run-as-root --oversubscribe --bind-to none \
        --mca mpi_yield_when_idle 1 -np 4 "$MPI_COLL" -o "$op" "${SWEEP[@]}" \
        > "$RESULTS/mpi-$op.json" 2> "$RESULTS/mpi-$op.err" ||
        { tail -5 "$RESULTS/mpi-$op.err" >&2; die "mpi_coll -o $op failed"; }
    for f in cfx mpi; do
        [ "$(jq '.wrong' "$RESULTS/$f-$op.json")" = 0 ] || die "$f $op: wrong elements"
    done
    "$HERE/plot.sh" busbw "$IMG/busbw-$op.png" \
        "$op, 4 ranks on one host (float sum; default settings of each)" \
        "$RESULTS/cfx-$op.json" "$RESULTS/mpi-$op.json"
    echo "bench-plots: wrote $IMG/busbw-$op.png" >&2
done

# ---- 2. the parameter server's blocks per server over time ------------------------
tok=$RESULTS/token
(umask 077; head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$tok"; echo >> "$tok")
log=$RESULTS/demo.log
: > "$log"
t0=$(date +%s.%N)
( timeout "$RUN_TIMEOUT" "$BUILD/bin/cfx_run" -n 6 -v -T "$RUN_TIMEOUT" --token-file "$tok" \
    "$BUILD/bin/cfx_train" --epochs "$EPOCHS" 2>&1 |
    while IFS= read -r l; do printf '%s %s\n' "$(date +%s.%N)" "$l"; done > "$log" ) &
demo=$!
addr=
for _ in $(seq 200); do # the coordinator's address, from cfx_run -v (10 s at most)
    addr=$(sed -n 's/.*cfx_run: coordinator on \([0-9.]*:[0-9]*\),.*/\1/p' "$log" | head -n 1)
    [ -n "$addr" ] && break
    sleep 0.05
done
[ -n "$addr" ] || { kill "$demo" 2>/dev/null; die "the demo printed no coordinator address"; }
samples=$RESULTS/ps-samples.txt
: > "$samples"
while kill -0 "$demo" 2>/dev/null; do
    t=$(date +%s.%N)
    if j=$(CFX_TOKEN_FILE=$tok timeout 10 "$BUILD/bin/rdmactl" --coord "$addr" --json \
            ps --job train shards 2>/dev/null); then
        printf '%s %s\n' "$t" "$j" >> "$samples"
    fi
    sleep 0.2
done
wait "$demo" || { tail -5 "$log" >&2; die "the demo failed"; }
[ -s "$samples" ] || die "no shard map was ever read"
csv=$RESULTS/ps-timeline.csv
nserv=$(tail -n 1 "$samples" | cut -d' ' -f2- | jq '.servers | length')
{
    printf 't_s,map'
    for s in $(seq 0 $((nserv - 1))); do printf ',s%d' "$s"; done
    echo
    awk -v t0="$t0" '/becomes slow/ { printf "# slow %.3f\n", $1 - t0; exit }' "$log"
    while read -r t j; do
        echo "$j" | jq -r --argjson t "$t" --argjson t0 "$t0" \
            '[(($t - $t0) * 1000 | round) / 1000, .map_version] + [.servers[].blocks]
             | map(tostring) | join(",")'
    done < "$samples"
} > "$csv"
"$HERE/plot.sh" ps "$IMG/ps-blocks.png" \
    "parameter server demo: blocks per server (cfx_run -n 6 cfx_train --epochs $EPOCHS)" "$csv"
echo "bench-plots: wrote $IMG/ps-blocks.png" >&2
grep -E "epoch|final" "$log" | cut -d' ' -f2- >&2
rm -f "$tok"
