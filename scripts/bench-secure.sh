#!/usr/bin/env bash
# The cost of sealing (CFX_SECURE) against plain connections in the same
# run, rounds alternating off / integrity / encrypt:
#   bw  : cfx_get_bw -t tcp, one object of CFX_BENCH_SIZE (64M), GB/s and the
#         CPU seconds per GB of both processes (sealed tcp data connections)
#   lat : cfx_get_lat -t tcp --repeat, 8-byte gets of a known location, p50
#         (one sealed record each way on a data connection)
#   ctl : cfx_get_lat -i, inline gets of 8 B, 4 KiB and 64 KiB through the
#         coordinator, p50 (sealed control frames: a lookup whose reply
#         carries the bytes)
# and, as the reference for what one core can seal, `openssl speed -evp
# aes-256-gcm` on 16 KiB blocks (the tcp record size).
#
#   scripts/bench-secure.sh [BUILD_DIR] [ROUNDS]     (default: build, 3)
#
# Prints one "RESULT" line per run, then medians and ratios to off.  Uses
# only 127.0.0.1 and ports 18540-18542.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bin=${1:-$repo/build}/bin
rounds=${2:-3}
size=${CFX_BENCH_SIZE:-64M}
iters=${CFX_BENCH_ITERS:-20}
export CFX_TOKEN=${CFX_TOKEN:-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')}

pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

# pair TOOL PORT MODE ARGS...: server and client with CFX_SECURE=MODE
pair() {
    local tool=$1 port=$2 mode=$3
    shift 3
    CFX_SECURE=$mode "$bin/$tool" -p "$port" "$@" >/dev/null &
    local spid=$!
    pids+=("$spid")
    local out rc=0
    out=$(CFX_SECURE=$mode timeout 300 "$bin/$tool" -p "$port" "$@" 127.0.0.1) || rc=$?
    wait "$spid" || rc=$?
    echo "$out"
    return "$rc"
}

aes=$(openssl speed -evp aes-256-gcm -seconds 2 2>/dev/null |
      awk '/^AES-256-GCM|^aes-256-gcm/ { v = $NF; sub(/k$/, "", v); printf "%.3f", v * 1000 / 1e9 }')
echo "RESULT openssl_aes256gcm_16k_GBps $aes"

results=$(mktemp)
for r in $(seq "$rounds"); do
    for mode in off integrity encrypt; do
        bw=$(pair cfx_get_bw 18540 "$mode" -t tcp -s "$size" -n "$iters" --json)
        read -r gbs cpu < <(echo "$bw" | python3 -c 'import json,sys; x=json.load(sys.stdin)["results"][0]; print("%.3f %.3f" % (x["bw_avg"], x["cpu_s_per_gb"]))')
        lat=$(pair cfx_get_lat 18541 "$mode" -t tcp -n 2000 --repeat --json)
        p50=$(echo "$lat" | python3 -c 'import json,sys; print("%.1f" % json.load(sys.stdin)["t_p50_us"])')
        ctl=""
        for sz in 8 4K 64K; do
            lat=$(pair cfx_get_lat 18542 "$mode" -i -s "$sz" -n 2000 -w 200 --json)
            ctl+=" $(echo "$lat" | python3 -c 'import json,sys; print("%.1f" % json.load(sys.stdin)["t_p50_us"])')"
        done
        echo "RESULT round $r $mode bw_GBps $gbs cpu_s_per_GB $cpu lat_known_p50_us $p50" \
             "inline_8B_4K_64K_p50_us$ctl"
        echo "$mode $gbs $cpu $p50$ctl" >>"$results"
    done
done

python3 - "$results" "$aes" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
aes = float(sys.argv[2] or 0)
med = {}
for mode in ("off", "integrity", "encrypt"):
    r = [x for x in rows if x[0] == mode]
    med[mode] = [statistics.median(float(x[i]) for x in r) for i in range(1, 7)]
for mode, (bw, cpu, lat, i8, i4k, i64k) in med.items():
    print("MEDIAN %-9s bw %.2f GB/s  cpu %.3f s/GB  known get p50 %.1f us  "
          "inline get p50 8 B %.1f / 4 KiB %.1f / 64 KiB %.1f us"
          % (mode, bw, cpu, lat, i8, i4k, i64k))
off = med["off"]
for mode in ("integrity", "encrypt"):
    m = med[mode]
    print("RATIO %-9s bw/off %.2f  cpu/off %.2f  lat/off %.2f  bw/aes-gcm(1 core) %.2f  "
          "inline/off %.2f %.2f %.2f"
          % (mode, m[0] / off[0], m[1] / off[1], m[2] / off[2], m[0] / aes if aes else 0,
             m[3] / off[3], m[4] / off[4], m[5] / off[5]))
PY
rm -f "$results"
