#!/usr/bin/env bash
# Object get bandwidth and latency against same-run references:
#   tcp : cfx_get_bw -t tcp  vs iperf3 single-stream loopback
#   shm : cfx_get_bw -t shm  vs single-thread memcpy (measured by cfx_get_bw -m)
#   lat : cfx_get_lat 8-byte objects over tcp and shm, p50 / p99: the first
#         get of each object, and (known) a second one, whose location the
#         getter's location cache holds; (known_nokeep) that second get
#         keeping no copy, as Python's get into a buffer does
#
#   scripts/bench-get.sh [BUILD_DIR]      (default: build)
#
# Prints one "RESULT" line per figure and the ratios; exits non-zero if a
# tool fails.  Uses only 127.0.0.1 and ports 18515-18530 and 5299.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
case ${1:-} in
-h | --help) sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; exit 0 ;;
-*) echo "bench-get.sh: unknown option '$1' (--help says what it takes)" >&2; exit 2 ;;
esac
bin=${1:-$repo/build}/bin
for t in cfx_get_bw cfx_get_lat; do
    [[ -x $bin/$t ]] || { echo "bench-get.sh: no $bin/$t: build first, or name the build directory" >&2; exit 2; }
done
size=${CFX_BENCH_SIZE:-64M}
iters=${CFX_BENCH_ITERS:-20}
export CFX_TOKEN=${CFX_TOKEN:-bench-$$-$RANDOM}

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

# pair PORT ARGS...: server and client of a perftest-style tool; prints the client's output
pair() {
    local tool=$1 port=$2
    shift 2
    timeout 300 "$bin/$tool" -p "$port" "$@" >/dev/null & # a server whose client died
    local spid=$!
    pids+=("$spid")
    local out rc=0
    out=$(timeout 300 "$bin/$tool" -p "$port" "$@" 127.0.0.1) || rc=$?
    wait "$spid" || rc=$?
    echo "$out"
    return "$rc"
}

command -v iperf3 >/dev/null || { echo "bench-get.sh: iperf3 is missing (scripts/deps.sh installs it)" >&2; exit 1; }
iperf3 -s -1 -p 5299 -B 127.0.0.1 >/dev/null 2>&1 &
pids+=($!)
sleep 0.5
iperf_gbps=$(iperf3 -c 127.0.0.1 -p 5299 -t 5 -J | python3 -c 'import json,sys; print("%.3f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/1e9))')
echo "RESULT iperf3_loopback_gbps $iperf_gbps"

tcp_json=$(pair cfx_get_bw 18515 -t tcp -s "$size" -n "$iters" --report_gbits --json)
tcp_gbps=$(echo "$tcp_json" | python3 -c 'import json,sys; print("%.3f" % json.load(sys.stdin)["results"][0]["bw_avg"])')
echo "RESULT cfx_get_bw_tcp_gbps $tcp_gbps"

shm_json=$(pair cfx_get_bw 18516 -t shm -s "$size" -n "$iters" -m --json)
read -r shm_gbs memcpy_gbs shm_ratio < <(echo "$shm_json" | python3 -c 'import json,sys; r=json.load(sys.stdin)["results"][0]; print("%.3f %.3f %.3f" % (r["bw_avg"], r["memcpy_bw"], r["memcpy_ratio"]))')
echo "RESULT cfx_get_bw_shm_GBps $shm_gbs"
echo "RESULT memcpy_GBps $memcpy_gbs"

shm_user_json=$(pair cfx_get_bw 18517 -t shm -s "$size" -n "$iters" -u -m --json)
read -r shmu_gbs shmu_ratio < <(echo "$shm_user_json" | python3 -c 'import json,sys; r=json.load(sys.stdin)["results"][0]; print("%.3f %.3f" % (r["bw_avg"], r["memcpy_ratio"]))')
echo "RESULT cfx_get_bw_shm_userbuf_GBps $shmu_gbs"

for tp in tcp shm; do
    lat=$(pair cfx_get_lat 18520 -t "$tp" -n 2000 --json)
    echo "$lat" | python3 -c 'import json,sys; r=json.load(sys.stdin); print("RESULT cfx_get_lat_%s_8B p50_us %.1f p99_us %.1f" % (r["transport"], r["t_p50_us"], r["t_p99_us"]))'
    lat=$(pair cfx_get_lat 18521 -t "$tp" -n 2000 --repeat --json)
    echo "$lat" | python3 -c 'import json,sys; r=json.load(sys.stdin); print("RESULT cfx_get_lat_%s_8B_known p50_us %.1f p99_us %.1f" % (r["transport"], r["t_p50_us"], r["t_p99_us"]))'
    lat=$(pair cfx_get_lat 18522 -t "$tp" -n 2000 --repeat --no-keep --json)
    echo "$lat" | python3 -c 'import json,sys; r=json.load(sys.stdin); print("RESULT cfx_get_lat_%s_8B_known_nokeep p50_us %.1f p99_us %.1f" % (r["transport"], r["t_p50_us"], r["t_p99_us"]))'
done

python3 - "$tcp_gbps" "$iperf_gbps" "$shm_ratio" "$shmu_ratio" <<'PY'
import sys
tcp, iperf, shm, shmu = map(float, sys.argv[1:])
print("RATIO tcp/iperf3 = %.2f (goal >= 0.90)" % (tcp / iperf))
print("RATIO shm(arena)/memcpy = %.2f (goal >= 0.70)" % shm)
print("RATIO shm(user buffer)/memcpy = %.2f" % shmu)
PY
