#!/usr/bin/env bash
# Conflux through conflux.ray against Ray's own object store and
# ray.util.collective, side by side in one run on the emulated cluster.
#
#   scripts/bench-ray.sh [--nodes 8] [--rate 1gbit] [--size 64M] [--receivers 3,7]
#                        [--ranks 4] [--iters 3] [--warmup 1] [--ps-size 16M]
#                        [--ps-workers 3] [--ps-steps 20] [--ps-batch 64]
#                        [--cases broadcast,allreduce,ps] [--order ray,conflux]
#                        [--venv DIR] [--build-dir DIR] [--timeout 900]
#
# 1. A venv with Ray, PyTorch (ray.util.collective's "gloo" backend is
#    torch.distributed's gloo in Ray 2.x), numpy and the conflux package:
#    --venv DIR, else the test venv ($CFX_VENV, by default
#    ~/.cache/conflux/venv-X.Y: scripts/test.sh stage 4a) when Ray and torch
#    import there, else $BUILD/venv-ray, created and
#    filled from PyPI on first use (about 6 GB: PyPI's torch carries CUDA).
#    The conflux package is (re)built into it each run (its CMake tree in
#    $BUILD/python-wheel-ray, so a rerun only recompiles what changed).
# 2. test/cluster/cluster.sh up NODES RATE (prefix cfxray, from
#    $CFX_CLUSTER_PREFIX): one network namespace per node, each link shaped
#    to RATE both ways; `ray start` in every node (the head in node 0, node i
#    carrying the custom resource "node<i>" so actors can be pinned), object
#    store 512 MB per node.
# 3. python/benchmarks/ray_bench.py in node 0: every case with Ray and with
#    Conflux, alternating, --warmup + --iters times; medians and the ratio
#    measured in the same run; every transfer checked (docstring there).
#    Conflux runs with its defaults: between namespaces that is tcp (the
#    shm transport only pairs processes of one network namespace).
# Everything started here runs niced inside the cluster's namespaces and is
# stopped by PID when the cluster is taken down (cluster.sh down), on every
# exit path.  Prints the JSON lines and the table; exits non-zero when a
# check fails or anything errors.  Needs root (network namespaces).
set -euo pipefail

CMDLINE="$0 $*"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
CLUSTER=$ROOT/test/cluster/cluster.sh
export CFX_CLUSTER_PREFIX=${CFX_CLUSTER_PREFIX:-cfxray}
PREFIX=$CFX_CLUSTER_PREFIX

NODES=8
RATE=1gbit
VENV=
BUILD=$ROOT/build
RUN_TIMEOUT=900
BENCH_ARGS=()

die() { echo "bench-ray.sh: $*" >&2; exit 1; }
log() { echo "bench-ray.sh: $*" >&2; }
usage() { sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; }

while [ $# -gt 0 ]; do
    case "$1" in
    --nodes) NODES=$2; shift 2 ;;
    --rate) RATE=$2; shift 2 ;;
    --venv) VENV=$(realpath -m "$2"); shift 2 ;;
    --build-dir) BUILD=$(realpath -m "$2"); shift 2 ;;
    --timeout) RUN_TIMEOUT=$2; shift 2 ;;
    --size | --receivers | --ranks | --iters | --warmup | --ps-size | --ps-workers | \
        --ps-steps | --ps-batch | --cases | --order)
        [ $# -ge 2 ] || die "$1 needs a value"
        BENCH_ARGS+=("$1" "$2"); shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; exit 2 ;;
    esac
done
[[ $NODES =~ ^[0-9]+$ ]] && [ "$NODES" -ge 2 ] && [ "$NODES" -le 32 ] || die "--nodes: 2..32"
[[ $RUN_TIMEOUT =~ ^[0-9]+$ ]] && [ "$RUN_TIMEOUT" -ge 60 ] || die "--timeout: seconds, >= 60"
[ "$(id -u)" = 0 ] || die "needs root (network namespaces)"

# ---- venv ------------------------------------------------------------------------
has_ray() { [ -x "$1/bin/python" ] && "$1/bin/python" -c 'import ray, torch' 2>/dev/null; }
if [ -z "$VENV" ]; then
    ver=$(/usr/bin/python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    TESTVENV=${CFX_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/conflux/venv-$ver}
    if has_ray "$TESTVENV"; then VENV=$TESTVENV; else VENV=$BUILD/venv-ray; fi
fi
if ! has_ray "$VENV"; then
    log "installing Ray and PyTorch into $VENV (PyPI; torch pulls its CUDA libraries: ~6 GB)"
    [ -x "$VENV/bin/python" ] || /usr/bin/python3 -m venv "$VENV"
    nice -n 10 "$VENV/bin/pip" install -q --disable-pip-version-check ray torch >&2
fi
nice -n 10 "$VENV/bin/pip" install -q --disable-pip-version-check numpy \
    'scikit-build-core>=0.10' >&2
log "building the conflux package into $VENV"
SKBUILD_BUILD_DIR=$BUILD/python-wheel-ray CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) \
    nice -n 10 "$VENV/bin/pip" install -q --disable-pip-version-check --no-build-isolation \
    "$ROOT/python" >&2 || die "building the conflux package failed"
RAY_VERSION=$("$VENV/bin/python" -c 'import ray; print(ray.__version__)')
TORCH_VERSION=$("$VENV/bin/python" -c 'import torch; print(torch.__version__)')

# ---- cluster and Ray -------------------------------------------------------------
mkdir -p /run/lock
exec 9>"/run/lock/$PREFIX-bench.lock"
flock -n 9 || die "another run holds /run/lock/$PREFIX-bench.lock"
if ip netns list | awk '{print $1}' | grep -q "^$PREFIX-"; then
    die "namespaces $PREFIX-* exist already: '$CLUSTER down' (CFX_CLUSTER_PREFIX=$PREFIX) first"
fi
RAY_TMP=$(mktemp -d /tmp/cfxray.XXXXXX)
cleanup() {
    local rc=$?
    trap - EXIT INT TERM
    "$CLUSTER" down >/dev/null 2>&1 || true   # stops every process in our namespaces, by PID
    rm -rf "$RAY_TMP"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)
"$CLUSTER" up "$NODES" "$RATE" >&2
HEAD_IP=$("$CLUSTER" addr 0)
# Token authentication with a token of this run's own: Ray 2.x turns it on
# by itself in `ray start --head` when ~/.ray/auth_token exists (a local
# ray.init() writes one), and then nodes started without it cannot join.
(umask 077 && od -An -N32 -tx1 /dev/urandom | tr -d ' \n' > "$RAY_TMP/auth_token")
RAY_ENV=(env PATH="$VENV/bin:$PATH" RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=token
    RAY_AUTH_TOKEN_PATH="$RAY_TMP/auth_token")
RAY_COMMON=(--num-cpus 2 --object-store-memory 512000000 --temp-dir "$RAY_TMP"
    --disable-usage-stats)
for i in $(seq 0 $((NODES - 1))); do
    if [ "$i" = 0 ]; then
        where=(--head --port 6379 --include-dashboard=false)
    else
        where=(--address "$HEAD_IP:6379")
    fi
    timeout -k 5 120 "$CLUSTER" exec "$i" "${RAY_ENV[@]}" nice -n 10 "$VENV/bin/ray" start \
        "${where[@]}" --node-ip-address "$("$CLUSTER" addr "$i")" \
        --resources "{\"node$i\": 1}" "${RAY_COMMON[@]}" > "$RAY_TMP/start-$i.log" 2>&1 9>&- ||
        { cat "$RAY_TMP/start-$i.log" >&2; die "ray start failed in node $i"; }
done
log "Ray $RAY_VERSION on $NODES nodes, torch $TORCH_VERSION"

echo "# command: $CMDLINE"
echo "# Ray $RAY_VERSION (ray.util.collective backend gloo = torch $TORCH_VERSION gloo);" \
    "$NODES nodes, each link $RATE (tbf burst 512kb)"
rc=0
timeout -k 10 "$RUN_TIMEOUT" "$CLUSTER" exec 0 "${RAY_ENV[@]}" RAY_DEDUP_LOGS=1 nice -n 10 \
    "$VENV/bin/python" "$ROOT/python/benchmarks/ray_bench.py" --address "$HEAD_IP:6379" \
    --nodes "$NODES" "${BENCH_ARGS[@]}" 9>&- || rc=$?
echo "# $(nproc) CPUs; load average before: $LOAD_BEFORE, after: $(cut -d' ' -f1-3 /proc/loadavg)"
[ "$rc" = 0 ] || log "the benchmark failed (exit $rc)"
exit "$rc"
