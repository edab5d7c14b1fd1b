#!/usr/bin/env bash
# Starting across hosts the way torchrun starts ranks, on the emulated
# cluster: N ranks of cfx_boottest, one per node namespace, with only
# MASTER_ADDR (node 0's host name), MASTER_PORT, RANK, WORLD_SIZE,
# CFX_TOKEN_FILE and CFX_SOCKET_IFNAME=PREFIX-e (the cluster link, chosen
# by prefix) in their environment.  Rank 1 starts first and is seen
# retrying before the others start; every rank checks its allreduce element
# by element and prints "rank R/N ok: SUM".
#
#   test/cluster/bootstrap.sh BUILD_DIR [N]
#
# Needs root (network namespaces).  Uses its own cluster prefix (default
# cfxboot, from $CFX_CLUSTER_PREFIX) and removes it at the end.
set -euo pipefail

build=${1:?usage: bootstrap.sh BUILD_DIR [N]}
n=${2:-3}
here=$(cd "$(dirname "$0")" && pwd)
export CFX_CLUSTER_PREFIX=${CFX_CLUSTER_PREFIX:-cfxboot}
prefix=$CFX_CLUSTER_PREFIX
bin=$(cd "$build" && pwd)/bin/cfx_boottest
[ -x "$bin" ] || { echo "bootstrap.sh: no $bin (build first)" >&2; exit 1; }
[ "$n" -ge 2 ] || { echo "bootstrap.sh: N must be at least 2" >&2; exit 1; }

dir=$(mktemp -d /tmp/cfx-boot-XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    "$here/cluster.sh" down >/dev/null 2>&1 || true
    rm -rf "$dir"
}
trap cleanup EXIT

(umask 077; head -c 16 /dev/urandom | xxd -p > "$dir/token")
"$here/cluster.sh" up "$n" 1gbit

rank() { # R: start rank R in node R, output in $dir/rR.log
    local r=$1 level=${2:-warn}
    "$here/cluster.sh" exec "$r" env -i MASTER_ADDR="$prefix-n0" MASTER_PORT=29500 \
        RANK="$r" WORLD_SIZE="$n" CFX_TOKEN_FILE="$dir/token" CFX_SOCKET_IFNAME="$prefix-e" \
        CFX_LOG_LEVEL="$level" CFX_TIMEOUT_MS=60000 "$bin" 1048583 >"$dir/r$r.log" 2>&1 &
    pids+=($!)
}

rank 1 info
# rank 1 is refused until rank 0 listens: wait for it to say so (60 s at most)
if ! timeout 60 sh -c 'tail -n +1 -f "$1" | grep -q -m 1 "retrying until the deadline"' \
        sh "$dir/r1.log"; then
    echo "bootstrap.sh: rank 1 never retried:" >&2
    cat "$dir/r1.log" >&2
    exit 1
fi
for r in $(seq 2 $((n - 1))) 0; do
    rank "$r"
done

fail=0
for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || fail=1
done
pids=()
sums=$(cat "$dir"/r*.log | sed -n "s|^rank [0-9]*/$n ok: \(-\{0,1\}[0-9]*\)$|\1|p" | sort -u)
oks=$(cat "$dir"/r*.log | grep -c "^rank [0-9]*/$n ok: " || true)
grep -h "interface $prefix-e" "$dir/r1.log" || { echo "rank 1 did not take $prefix-e" >&2; fail=1; }
if [ "$fail" -ne 0 ] || [ "$oks" -ne "$n" ] || [ "$(echo "$sums" | wc -l)" -ne 1 ]; then
    for r in $(seq 0 $((n - 1))); do echo "--- rank $r"; cat "$dir/r$r.log"; done >&2
    echo "bootstrap.sh: FAILED ($oks of $n ranks ok)" >&2
    exit 1
fi
echo "bootstrap.sh: $n ranks on $n nodes, started from MASTER_ADDR=$prefix-n0, rank 1 first: every allreduce checked (sum $sums)"
