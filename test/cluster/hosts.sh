#!/usr/bin/env bash
# cfx_run --hosts on the emulated cluster: cfx_run runs in node 0 and starts
# N ranks of cfx_boottest, one per node, through the remote shell
# test/cluster/rsh-agent.sh (which enters the named node's namespace where
# ssh would log in).  The coordinator inside cfx_run binds node 0's cluster
# address (CFX_SOCKET_IFNAME=PREFIX-e, which the ranks get too); the token
# reaches every rank on its rsh's stdin.  Every rank prints the node it ran
# on and checks its allreduce element by element ("rank R/N ok: SUM").
# Then rank 1 exits 3 in a second job: cfx_run must exit 3 naming it and
# its node, and leave no rank behind on any node.
#
#   test/cluster/hosts.sh BUILD_DIR [N]
#
# Needs root (network namespaces).  Uses its own cluster prefix (default
# cfxhost, from $CFX_CLUSTER_PREFIX) and removes it at the end.
set -euo pipefail

build=${1:?usage: hosts.sh BUILD_DIR [N]}
n=${2:-4}
here=$(cd "$(dirname "$0")" && pwd)
export CFX_CLUSTER_PREFIX=${CFX_CLUSTER_PREFIX:-cfxhost}
prefix=$CFX_CLUSTER_PREFIX
bin=$(cd "$build" && pwd)/bin
for p in cfx_run cfx_boottest; do
    [ -x "$bin/$p" ] || { echo "hosts.sh: no $bin/$p (build first)" >&2; exit 1; }
done
[ "$n" -ge 2 ] || { echo "hosts.sh: N must be at least 2" >&2; exit 1; }

out=$(mktemp /tmp/cfx-hosts-XXXXXX)
cleanup() {
    "$here/cluster.sh" down >/dev/null 2>&1 || true
    rm -f "$out"
}
trap cleanup EXIT

"$here/cluster.sh" up "$n" 1gbit
hosts=$(for i in $(seq 0 $((n - 1))); do printf '%s-n%s,' "$prefix" "$i"; done)
hosts=${hosts%,}

run() { # cfx_run in node 0 with ARGS...; its output in $out
    "$here/cluster.sh" exec 0 env CFX_SOCKET_IFNAME="$prefix-e" CFX_TIMEOUT_MS=60000 \
        "$bin/cfx_run" --hosts "$hosts" --rsh "$here/rsh-agent.sh" --timeout 120 -v "$@" \
        >"$out" 2>&1
}

set -x
run sh -c 'echo "on $(hostname)"; exec '"$bin"'/cfx_boottest 1048583' || {
    cat "$out" >&2; echo "hosts.sh: FAILED: the allreduce job failed" >&2; exit 1; }
set +x
cat "$out"
fail=0
for r in $(seq 0 $((n - 1))); do
    grep -qx "\[$r\] on $prefix-n$r" "$out" || { echo "rank $r not on node $r" >&2; fail=1; }
done
oks=$(grep -c "^\[[0-9]*\] rank [0-9]*/$n ok: " "$out" || true)
sums=$(sed -n "s|^\[[0-9]*\] rank [0-9]*/$n ok: \(-\{0,1\}[0-9]*\)$|\1|p" "$out" | sort -u)
coord=$(sed -n 's/^cfx_run: coordinator on \([0-9.]*\):.*/\1/p' "$out")
[ "$coord" = "$("$here/cluster.sh" addr 0)" ] || { echo "coordinator on '$coord'" >&2; fail=1; }
if [ "$fail" -ne 0 ] || [ "$oks" -ne "$n" ] || [ "$(echo "$sums" | wc -l)" -ne 1 ]; then
    echo "hosts.sh: FAILED ($oks of $n ranks ok)" >&2
    exit 1
fi

# A failing rank: its status is cfx_run's, the others are stopped on every node.
set +e
run sh -c 'if [ "$CFX_RANK" = 1 ]; then sleep 1; exit 3; fi; exec sleep 600'
rc=$?
set -e
cat "$out"
grep -q "cfx_run: rank 1 on $prefix-n1 exited with status 3" "$out" || fail=1
left=0
for t in $(seq 50); do # a stopped process may take a moment to go: 5 s at most
    left=0
    for i in $(seq 0 $((n - 1))); do
        left=$((left + $(ip netns pids "$prefix-n$i" | wc -l)))
    done
    [ "$left" -ne 0 ] || break
    sleep 0.1
done
if [ "$rc" -ne 3 ] || [ "$fail" -ne 0 ] || [ "$left" -ne 0 ]; then
    echo "hosts.sh: FAILED: exit $rc (want 3), $left processes left in the nodes" >&2
    exit 1
fi
echo "hosts.sh: $n ranks on $n nodes through rsh-agent.sh, coordinator on $coord:" \
    "every allreduce checked (sum $sums); rank 1 exiting 3 gave exit 3 and stopped the rest"
