#!/usr/bin/env bash
# An emulated cluster on one machine: N network namespaces ("nodes") joined
# by a Linux bridge that lives in a namespace of its own, every node's link
# shaped to its RATE in both directions with tbf.
#
#   cluster.sh up N RATE[,RATE...]
#                               create or reshape the cluster (e.g. up 4 1gbit);
#                               one rate per node, node 0 first, the last one
#                               repeated for the nodes after it (up 5
#                               4gbit,1gbit: node 0 at 4 Gbit/s, 1-4 at 1)
#   cluster.sh down             remove everything this script made
#   cluster.sh exec I CMD...    run CMD in node I (hostname PREFIX-nI)
#   cluster.sh status           what exists now
#   cluster.sh addr I           print node I's address
#   cluster.sh rsh HOST CMD...  run the shell command CMD on node HOST (the
#                               remote shell for mpirun's plm_rsh_agent)
#
# Names: every namespace, link and /etc/netns entry starts with $PREFIX
# (default cfxc, from $CFX_CLUSTER_PREFIX: 1 to 10 letters, digits or _):
#   PREFIX-br            namespace holding the bridge PREFIX-br0
#   PREFIX-nI            node I; its link is PREFIX-eI, peered with PREFIX-bI
#                        on the bridge; address 10.77.0.(I+1)/24
#   /etc/netns/PREFIX-nI/hosts   so that the nodes resolve each other by name
# The subnet exists only inside these namespaces: nothing is routed out.
#
# Shaping (see the notes on the emulated cluster): tbf on the egress of both
# ends of a node's veth; the node side limits what the node sends, the
# bridge side what it receives.  "tbf rate R burst 512kb latency 50ms": a
# smaller burst makes TCP retransmit heavily at 1 Gbit/s.
#
# Every subcommand may be re-run: up creates what is missing, reshapes what
# exists and removes nodes beyond N; down on no cluster does nothing.
# Exit status: 0, 1 when a step fails, 2 on a usage error (a bad argument or
# prefix, named on stderr).
set -euo pipefail

PREFIX=${CFX_CLUSTER_PREFIX:-cfxc}
SUBNET_PREFIX=10.77.0   # a /24 that exists only inside our namespaces
SUBNET=$SUBNET_PREFIX.0/24
BURST=512kb
LATENCY=50ms
MAX_NODES=200
BR_NS=$PREFIX-br
BR=$PREFIX-br0

die() { echo "cluster.sh: $*" >&2; exit 1; }
bad() { echo "cluster.sh: $*" >&2; exit 2; } # a usage error

# every name is PREFIX plus at most 5 characters (-b199), and a link name
# holds 15; the prefix also goes into patterns, so plain characters only
[[ $PREFIX =~ ^[A-Za-z0-9_]{1,10}$ ]] ||
    bad "CFX_CLUSTER_PREFIX '$PREFIX': 1 to 10 letters, digits or _ (link names hold 15)"

usage() {
    sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'
}

need_root() {
    [ "$(id -u)" = 0 ] || die "needs root (network namespaces)"
    command -v ip >/dev/null || die "ip (iproute2) not found"
    command -v tc >/dev/null || die "tc (iproute2) not found"
}

ns_exists() { ip netns list | awk '{print $1}' | grep -qx -- "$1"; }

# Our node namespaces, by index, in numeric order.
node_indexes() {
    ip netns list | awk '{print $1}' | sed -n "s/^$PREFIX-n\([0-9][0-9]*\)\$/\1/p" | sort -n
}

node_ns() { echo "$PREFIX-n$1"; }
node_ip() { echo "$SUBNET_PREFIX.$(($1 + 1))"; }

valid_rate() { [[ $1 =~ ^[0-9]+(\.[0-9]+)?(bit|kbit|mbit|gbit)$ ]]; }

shape() { # ns dev rate
    ip netns exec "$1" tc qdisc replace dev "$2" root tbf rate "$3" burst "$BURST" \
        latency "$LATENCY"
}

quiet_ipv6() { # no router solicitations or DAD noise on our links
    ip netns exec "$1" sh -c 'for f in /proc/sys/net/ipv6/conf/*/disable_ipv6; do
        echo 1 > "$f"; done' 2>/dev/null || true
}

write_hosts() { # n
    local n=$1 i j
    for i in $(seq 0 $((n - 1))); do
        mkdir -p "/etc/netns/$(node_ns "$i")"
        {
            echo "127.0.0.1 localhost"
            for j in $(seq 0 $((n - 1))); do
                echo "$(node_ip "$j") $(node_ns "$j")"
            done
        } > "/etc/netns/$(node_ns "$i")/hosts.tmp"
        mv "/etc/netns/$(node_ns "$i")/hosts.tmp" "/etc/netns/$(node_ns "$i")/hosts"
    done
}

# Stop what still runs inside one of our namespaces (only ours: PREFIX-*).
stop_ns_pids() { # ns
    local pids
    pids=$(ip netns pids "$1" 2>/dev/null || true)
    [ -n "$pids" ] || return 0
    kill -TERM $pids 2>/dev/null || true
    for _ in 1 2 3 4 5 6 7 8 9 10; do
        pids=$(ip netns pids "$1" 2>/dev/null || true)
        [ -n "$pids" ] || return 0
        sleep 0.2
    done
    kill -KILL $pids 2>/dev/null || true
}

remove_node() { # i
    local ns
    ns=$(node_ns "$1")
    if ns_exists "$ns"; then
        stop_ns_pids "$ns"
        ip netns del "$ns"
    fi
    if ns_exists "$BR_NS"; then
        ip -n "$BR_NS" link del "$PREFIX-b$1" 2>/dev/null || true
    fi
    rm -rf "/etc/netns/$ns"
}

cmd_up() {
    [ $# -eq 2 ] || bad "usage: cluster.sh up N RATE[,RATE...]"
    local n=$1 i ns e b rate rates desc
    [[ $n =~ ^[0-9]+$ ]] && [ "$n" -ge 1 ] && [ "$n" -le $MAX_NODES ] ||
        bad "N must be 1..$MAX_NODES, not '$n'"
    IFS=, read -r -a rates <<< "$2"
    [ "${#rates[@]}" -ge 1 ] || bad "RATE must look like 1gbit, 500mbit, 100kbit, not '$2'"
    [ "${#rates[@]}" -le "$n" ] || bad "${#rates[@]} rates for $n nodes"
    for rate in "${rates[@]}"; do
        valid_rate "$rate" ||
            bad "each RATE must look like 1gbit, 500mbit, 100kbit, not '$rate' (in '$2')"
    done
    need_root

    if ! ns_exists "$BR_NS"; then
        ip netns add "$BR_NS"
    fi
    ip -n "$BR_NS" link set lo up
    quiet_ipv6 "$BR_NS"
    if ! ip -n "$BR_NS" link show "$BR" >/dev/null 2>&1; then
        ip -n "$BR_NS" link add "$BR" type bridge stp_state 0 forward_delay 0
    fi
    ip -n "$BR_NS" link set "$BR" up

    # nodes left over from a larger cluster
    for i in $(node_indexes); do
        [ "$i" -lt "$n" ] || remove_node "$i"
    done

    for i in $(seq 0 $((n - 1))); do
        ns=$(node_ns "$i")
        e=$PREFIX-e$i
        b=$PREFIX-b$i
        if ! ns_exists "$ns"; then
            ip netns add "$ns"
        fi
        ip -n "$ns" link set lo up
        quiet_ipv6 "$ns"
        if ! ip -n "$ns" link show "$e" >/dev/null 2>&1; then
            ip -n "$BR_NS" link del "$b" 2>/dev/null || true
            ip -n "$BR_NS" link add "$b" type veth peer name "$e" netns "$ns"
        fi
        ip -n "$BR_NS" link set "$b" master "$BR" up
        ip -n "$ns" addr replace "$(node_ip "$i")/24" dev "$e"
        ip -n "$ns" link set "$e" up
        # node i's rate: its own, else the last one given
        rate=${rates[$((i < ${#rates[@]} ? i : ${#rates[@]} - 1))]}
        shape "$ns" "$e" "$rate"      # what node i sends
        shape "$BR_NS" "$b" "$rate"   # what node i receives
    done
    write_hosts "$n"
    if [ "${#rates[@]}" -eq 1 ]; then
        desc="each link ${rates[0]}"
    else
        desc="links $2 (node 0 first, the last repeated)"
    fi
    echo "cluster $PREFIX: $n nodes on $SUBNET, $desc (tbf burst $BURST)"
}

cmd_down() {
    [ "$(id -u)" = 0 ] || die "needs root"
    local i
    for i in $(node_indexes); do
        remove_node "$i"
    done
    if ns_exists "$BR_NS"; then
        stop_ns_pids "$BR_NS"
        ip netns del "$BR_NS"
    fi
    # /etc/netns entries of nodes whose namespace was already gone
    local d
    for d in /etc/netns/"$PREFIX"-n*; do
        [ -d "$d" ] && [[ $(basename "$d") =~ ^$PREFIX-n[0-9]+$ ]] && rm -rf "$d"
    done
    rmdir /etc/netns 2>/dev/null || true
    return 0
}

cmd_exec() {
    [ $# -ge 2 ] || bad "usage: cluster.sh exec I CMD..."
    local i=$1 ns
    shift
    [[ $i =~ ^[0-9]+$ ]] || bad "node index must be a number, not '$i'"
    ns=$(node_ns "$i")
    ns_exists "$ns" || die "no node $i (namespace $ns): run 'cluster.sh up N RATE' first"
    # own UTS namespace: the node's hostname is its namespace's name, as on a
    # real cluster (Open MPI tells nodes apart by hostname)
    exec ip netns exec "$ns" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$ns" "$@"
}

cmd_rsh() {
    # called as an ssh stand-in: [options] HOST CMD...; CMD is a shell command
    while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done
    [ $# -ge 2 ] || bad "usage: cluster.sh rsh HOST CMD..."
    local host=$1
    shift
    [[ $host =~ ^$PREFIX-n([0-9]+)$ ]] || die "rsh: '$host' is not a node of cluster $PREFIX"
    ns_exists "$host" || die "rsh: no namespace $host"
    exec ip netns exec "$host" unshare --uts sh -c 'hostname "$0" && exec sh -c "$1"' \
        "$host" "$*"
}

cmd_addr() {
    [ $# -eq 1 ] && [[ $1 =~ ^[0-9]+$ ]] || bad "usage: cluster.sh addr I"
    # 10.77.0.(I+1) is an address for the nodes up can make, no other
    [[ $1 =~ ^[0-9]{1,9}$ ]] && [ "$((10#$1))" -lt "$MAX_NODES" ] ||
        bad "addr: node index 0..$((MAX_NODES - 1)), not '$1'"
    node_ip "$((10#$1))"
}

cmd_status() {
    local i ns any=0
    if ns_exists "$BR_NS"; then
        any=1
        echo "bridge  $BR_NS: $(ip -n "$BR_NS" -br link show "$BR" 2>/dev/null | awk '{print $1, $2}')"
    fi
    for i in $(node_indexes); do
        any=1
        ns=$(node_ns "$i")
        printf 'node %-3s %-10s %-16s send: %s\n' "$i" "$ns" \
            "$(ip -n "$ns" -4 -br addr show "$PREFIX-e$i" 2>/dev/null | awk '{print $3}')" \
            "$(ip netns exec "$ns" tc qdisc show dev "$PREFIX-e$i" 2>/dev/null | head -1)"
        printf '         %-27s recv: %s\n' "" \
            "$(ip netns exec "$BR_NS" tc qdisc show dev "$PREFIX-b$i" 2>/dev/null | head -1)"
        local pids
        pids=$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')
        [ -z "$pids" ] || echo "         processes: $pids"
    done
    [ "$any" = 1 ] || echo "no cluster $PREFIX"
}

[ $# -ge 1 ] || { usage >&2; exit 2; }
sub=$1
shift
case "$sub" in
up) cmd_up "$@" ;;
down) cmd_down "$@" ;;
exec) cmd_exec "$@" ;;
rsh) cmd_rsh "$@" ;;
addr) cmd_addr "$@" ;;
status) need_root; cmd_status "$@" ;;
-h | --help | help) usage ;;
*) echo "cluster.sh: unknown command '$sub'" >&2; usage >&2; exit 2 ;;
esac
