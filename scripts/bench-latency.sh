#!/usr/bin/env bash
# Small-message latency of Conflux beside Open MPI, on loopback, in one run.
#
#   scripts/bench-latency.sh [--check] [-r RUNS] [-n ITERS] [-w WARMUP]
#                            [--sizes "8 64 512 4K 64K"] [--build-dir DIR]
#                            [--timeout SEC] [--only REGEX]
#
# Rows (medians over RUNS runs, each run a mean over ITERS timed calls):
#   - 2 ranks, ping-pong, shm (Open MPI: btl self,vader) and tcp (btl
#     self,tcp on lo): `cfx_coll_perf -o sendrecv` against `mpi_coll -o
#     sendrecv` (test/mpi/mpi_coll.c), the same blocking send-then-receive /
#     receive-then-send pattern; with 2 ranks one call is a round trip, and
#     the table shows half of it (the one-way latency);
#   - 2 ranks, a burst of 128 messages of 8 B and one answer, shm and tcp:
#     `-o sendburst` of both tools; the table shows the call / 128, the time
#     per message when several are in flight;
#   - 4 ranks, allreduce (float sum), broadcast (root 0) and barrier on shm
#     (Open MPI: vader, its default algorithm choices).
# --only REGEX keeps the rows whose "RANKS TRANSPORT OP" matches (grep -E),
# e.g. --only '^2 tcp'.
# Each row prints Conflux's and Open MPI's median in microseconds, the ratio
# Conflux / Open MPI and the goal of issue 14 where it states one (blank
# where it does not).  Runs of Conflux and Open MPI alternate, so both see
# the same load.
#
# Open MPI runs with --allow-run-as-root --oversubscribe --bind-to none and
# --mca mpi_yield_when_idle 1 (busy-polling ranks otherwise starve each
# other on a 2-core machine).  openmpi-bin and libopenmpi-dev are installed
# when missing (as root or through sudo); mpi_coll is built with mpicc into
# the build directory.  Builds nothing else: uses BUILD/bin/cfx_run and
# BUILD/bin/cfx_coll_perf (default build/).
#
# A measurement: exits 0 after printing; with --check, 1 when a stated goal
# is missed (on a loaded machine that can be the load).  2 on bad usage or a
# failed run.
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/.." && pwd)
BUILD=$ROOT/build
RUNS=3
ITERS=1000
WARMUP=100
SIZES="8 64 512 4K 64K"
ONLY=
CHECK=0
RUN_TIMEOUT=120

die() { echo "bench-latency: $*" >&2; exit 2; }
usage() { sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; }

while [ $# -gt 0 ]; do
    case "$1" in
    -r | -n | -w | --sizes | --build-dir | --timeout | --only)
        [ $# -ge 2 ] || die "$1 needs a value" ;;
    esac
    case "$1" in
    --check) CHECK=1; shift ;;
    -r) RUNS=$2; shift 2 ;;
    -n) ITERS=$2; shift 2 ;;
    -w) WARMUP=$2; shift 2 ;;
    --sizes) SIZES=$2; shift 2 ;;
    --build-dir) BUILD=$(realpath -m "$2"); shift 2 ;;
    --timeout) RUN_TIMEOUT=$2; shift 2 ;;
    --only) ONLY=$2; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "bench-latency: unknown option '$1' (--help lists them)" >&2; exit 2 ;;
    esac
done
[[ $RUNS =~ ^[0-9]+$ ]] && [ "$RUNS" -ge 1 ] && [ "$RUNS" -le 99 ] || die "-r: 1..99"
[[ $ITERS =~ ^[0-9]+$ ]] && [ "$ITERS" -ge 1 ] || die "-n: a positive number"
[[ $WARMUP =~ ^[0-9]+$ ]] || die "-w: a number"
[[ $RUN_TIMEOUT =~ ^[0-9]+$ ]] && [ "$RUN_TIMEOUT" -ge 5 ] || die "--timeout: seconds, >= 5"
for s in $SIZES; do [[ $s =~ ^[0-9]+[KM]?$ ]] || die "--sizes: e.g. \"8 64 4K\""; done
CFX_RUN=$BUILD/bin/cfx_run
PERF=$BUILD/bin/cfx_coll_perf
[ -x "$CFX_RUN" ] && [ -x "$PERF" ] || die "no $CFX_RUN or $PERF: build first"

# ---- Open MPI (idempotent install, as scripts/deps.sh does) -----------------
mpi_pkgs=(openmpi-bin libopenmpi-dev)
missing=()
for p in "${mpi_pkgs[@]}"; do
    st=$(dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null || true)
    [[ $st == ii* ]] || missing+=("$p")
done
if ((${#missing[@]})); then
    echo "bench-latency: installing ${missing[*]}" >&2
    sudo=()
    if ((EUID != 0)); then
        command -v sudo >/dev/null 2>&1 || die "not root and no sudo: apt-get install ${missing[*]}"
        sudo=(sudo)
    fi
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q >&2
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
fi
MPI_COLL=$BUILD/mpi_coll
if [ ! -x "$MPI_COLL" ] || [ "$ROOT/test/mpi/mpi_coll.c" -nt "$MPI_COLL" ]; then
    mpicc -O2 -o "$MPI_COLL" "$ROOT/test/mpi/mpi_coll.c" || die "mpicc failed"
fi
MPI_VERSION=$(mpirun --version 2>/dev/null | head -1 || true)

TMP=$(mktemp -d /tmp/bench-latency.XXXXXX)
trap 'rm -rf "$TMP"' EXIT

# ---- one run of each side; prints the mean time per call (us) ----------------
# conflux RANKS TRANSPORT OP SIZE
conflux() {
    local out=$TMP/cfx.out
    if ! timeout "$RUN_TIMEOUT" "$CFX_RUN" -n "$1" -t "$2" -T "$RUN_TIMEOUT" "$PERF" -o "$3" \
        -b "$4" -e "$4" -n "$ITERS" -w "$WARMUP" -c 0 >"$out" 2>&1; then
        echo "bench-latency: conflux $*: failed" >&2
        tail -5 "$out" >&2
        return 1
    fi
    awk '$1 == "[0]" && $2 ~ /^[0-9]+$/ { print $7; exit }' "$out"
}

# mpi RANKS TRANSPORT OP SIZE
mpi() {
    local out=$TMP/mpi.out btl=(--mca btl self,vader)
    [ "$2" = tcp ] && btl=(--mca btl self,tcp --mca btl_tcp_if_include lo
                            --mca oob_tcp_if_include lo)
    if ! timeout "$RUN_TIMEOUT" mpirun --allow-run-as-root --oversubscribe --bind-to none \
        --mca mpi_yield_when_idle 1 "${btl[@]}" -np "$1" "$MPI_COLL" -o "$3" -b "$4" -e "$4" \
        -n "$ITERS" -w "$WARMUP" -c 0 >"$out" 2>&1; then
        echo "bench-latency: mpi $*: failed" >&2
        tail -5 "$out" >&2
        return 1
    fi
    awk '$1 ~ /^[0-9]+$/ { print $6; exit }' "$out"
}

median() { tr ' ' '\n' | grep . | sort -g | awk '{ v[NR] = $1 } END {
    if (NR == 0) { print "nan"; exit }
    print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# ---- the rows ----------------------------------------------------------------
# case: ranks transport op size div goal_kind
#   div: the time shown is the call / div (2: ping-pong round trip -> one
#   way; 128: a sendburst call -> per message; 1: the call)
#   goal: "abs:2,ratio:3" (at most 2 us and at most 3x), "ratio:1.5", or "-"
rows=()
for s in $SIZES; do
    g=-; [ "$s" = 8 ] && g="abs:2,ratio:3"
    rows+=("2 shm sendrecv $s 2 $g")
done
for s in $SIZES; do
    g=-; [ "$s" = 8 ] && g="ratio:1.5"
    rows+=("2 tcp sendrecv $s 2 $g")
done
rows+=("2 shm sendburst 8 128 -" "2 tcp sendburst 8 128 -")
for s in $SIZES; do
    g=-; [ "$s" = 8 ] && g="ratio:2"
    rows+=("4 shm allreduce $s 1 $g")
done
for s in $SIZES; do rows+=("4 shm broadcast $s 1 -"); done
rows+=("4 shm barrier 0 1 -")
if [ -n "$ONLY" ]; then
    kept=()
    for row in "${rows[@]}"; do
        read -r n tp op _ <<<"$row"
        if echo "$n $tp $op" | grep -Eq -- "$ONLY"; then kept+=("$row"); fi
    done
    rows=("${kept[@]}")
fi

echo "# bench-latency: $(date -u '+%F %T') UTC, $(nproc) CPUs, load average" \
    "$(cut -d' ' -f1-3 /proc/loadavg), $MPI_VERSION"
echo "# medians of $RUNS runs x $ITERS calls (after $WARMUP warm-up); ping-pong rows: half round trip;" \
    "sendburst rows: per message"
printf '%-6s %-4s %-10s %7s %12s %12s %8s  %s\n' ranks tp op size "conflux_us" "openmpi_us" \
    ratio goal
missed=0
for row in "${rows[@]}"; do
    read -r n tp op size div goal <<<"$row"
    c=() m=()
    for ((i = 0; i < RUNS; i++)); do
        c+=("$(conflux "$n" "$tp" "$op" "$size")") || exit 2
        m+=("$(mpi "$n" "$tp" "$op" "$size")") || exit 2
    done
    cm=$(echo "${c[*]}" | median)
    mm=$(echo "${m[*]}" | median)
    if [ "$div" != 1 ]; then
        cm=$(awk -v v="$cm" -v d="$div" 'BEGIN { print v / d }')
        mm=$(awk -v v="$mm" -v d="$div" 'BEGIN { print v / d }')
    fi
    ratio=$(awk -v a="$cm" -v b="$mm" 'BEGIN { printf (b > 0 ? "%.1f" : "nan"), a / b }')
    gtext="" verdict=""
    if [ "$goal" != - ]; then
        ok=1
        IFS=, read -ra parts <<<"$goal"
        for p in "${parts[@]}"; do
            k=${p%%:*} v=${p#*:}
            if [ "$k" = abs ]; then
                gtext+="${gtext:+, }<= $v us"
                awk -v a="$cm" -v v="$v" 'BEGIN { exit !(a <= v) }' || ok=0
            else
                gtext+="${gtext:+, }<= ${v}x"
                awk -v r="$ratio" -v v="$v" 'BEGIN { exit !(r <= v) }' || ok=0
            fi
        done
        verdict=$([ $ok = 1 ] && echo met || echo missed)
        [ $ok = 1 ] || missed=$((missed + 1))
    fi
    [ "$op" = barrier ] && size=-
    printf '%-6s %-4s %-10s %7s %12.1f %12.2f %8s  %s\n' "$n" "$tp" "$op" "$size" "$cm" "$mm" \
        "$ratio" "${gtext:+$gtext ($verdict)}"
done
echo "# goals missed: $missed"
if [ "$CHECK" = 1 ] && [ "$missed" -gt 0 ]; then
    exit 1
fi
exit 0
