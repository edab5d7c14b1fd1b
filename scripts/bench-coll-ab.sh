#!/usr/bin/env bash
# A/B latency of group collectives: two builds, runs interleaved, medians.
#
#   scripts/bench-coll-ab.sh BUILD_A BUILD_B [-n RANKS] [-s SIZE] [-r RUNS] OP...
#
# For each OP (cfx_coll_perf -o names) and transport (shm, tcp): RUNS runs
# (default 3) of BUILD_A's and BUILD_B's cfx_coll_perf under their own
# cfx_run, alternating A and B so that both see the same load, then prints
# the median time of each and A/B.  Typical use: BUILD_A = a build of the
# previous commit (git worktree), BUILD_B = build.
set -euo pipefail

usage() { sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
[[ $# -ge 3 ]] || usage
a=$1 b=$2
shift 2
n=4 size=1K runs=3
while getopts "n:s:r:" o; do
    case $o in
        n) n=$OPTARG ;;
        s) size=$OPTARG ;;
        r) runs=$OPTARG ;;
        *) usage ;;
    esac
done
shift $((OPTIND - 1))
[[ $# -ge 1 ]] || usage
[[ $runs =~ ^[0-9]+$ && $runs -ge 1 ]] || { echo "bench-coll-ab.sh: -r: '$runs' is not a run count (>= 1)" >&2; exit 2; }
for d in "$a" "$b"; do
    [[ -x $d/bin/cfx_run && -x $d/bin/cfx_coll_perf ]] || { echo "no cfx_run/cfx_coll_perf in $d/bin" >&2; exit 2; }
done

# one_run DIR OP TP: the time column (us) of rank 0's row; a failed run (a bad
# OP or size, a rank that failed, the timeout) shows its output and ends the script
one_run() {
    local out rc=0 t
    out=$("$1/bin/cfx_run" -n "$n" -t "$3" --timeout 120 "$1/bin/cfx_coll_perf" -o "$2" \
        -b "$size" -e "$size" -n 200 -w 20 -c 0 2>&1) || rc=$?
    t=$(awk '/^\[0\] +[0-9]+ /{print $7; exit}' <<<"$out")
    if [[ $rc != 0 || -z $t ]]; then
        tail -n 5 <<<"$out" >&2
        echo "bench-coll-ab.sh: $1: cfx_coll_perf -o $2 over $3 failed (status $rc)" >&2
        exit 2
    fi
    echo "$t"
}

median() { sort -n | awk '{v[NR]=$1} END {print NR ? v[int((NR+1)/2)] : "nan"}'; }

printf "# %d ranks, %s, %d runs each, medians (us)\n" "$n" "$size" "$runs"
printf "%-14s %-4s %10s %10s %6s\n" op tp A B A/B
for op in "$@"; do
    for tp in shm tcp; do
        ta=() tb=()
        for ((i = 0; i < runs; i++)); do
            ta+=("$(one_run "$a" "$op" "$tp")")
            tb+=("$(one_run "$b" "$op" "$tp")")
        done
        ma=$(printf "%s\n" "${ta[@]}" | median)
        mb=$(printf "%s\n" "${tb[@]}" | median)
        printf "%-14s %-4s %10s %10s %6s\n" "$op" "$tp" "$ma" "$mb" \
            "$(awk -v x="$ma" -v y="$mb" 'BEGIN {printf (y > 0 ? "%.2f" : "nan"), x / y}')"
    done
done
