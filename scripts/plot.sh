#!/usr/bin/env bash
# Draw the benchmark results as PNGs with gnuplot.
#
#   scripts/plot.sh busbw OUT.png TITLE FILE.json...
#       bus bandwidth (GB/s) against message size, one line per file: the
#       --json documents of cfx_coll_perf and mpi_coll (test/mpi/mpi_coll.c),
#       labelled "Conflux OP" / "Open MPI OP" from their "tool" and "op";
#       out-of-place rows only; log-scaled size axis.
#   scripts/plot.sh ps OUT.png TITLE TIMELINE.csv
#       the parameter server's blocks per server over time: the CSV
#       scripts/bench-plots.sh writes (header "t_s,map,s0,s1,...", then one
#       row per sample; an optional "# slow T" line marks when a server was
#       made slow), one step line per server.
#
# Needs gnuplot (Debian: apt-get install gnuplot-nox) and jq.  Writes only
# OUT.png; its data files go to a temporary directory removed at the end.
# Exits 2 on bad usage or input it cannot read, 1 when gnuplot fails.
set -euo pipefail

die() { echo "plot.sh: $*" >&2; exit 2; }
usage() { sed -n '2,/^set -euo/p' "$0" | sed -e '$d' -e 's/^# \{0,1\}//'; }

[ $# -ge 4 ] || { usage >&2; exit 2; }
kind=$1 out=$2 title=$3
shift 3
command -v gnuplot >/dev/null || die "gnuplot not found (apt-get install gnuplot-nox)"
command -v jq >/dev/null || die "jq not found (apt-get install jq)"
for f in "$@"; do [ -r "$f" ] || die "cannot read $f"; done
case "$title" in *\"* | *\\*) die "the title may not hold \" or \\" ;; esac

tmp=$(mktemp -d /tmp/cfx-plot-XXXXXX)
trap 'rm -rf "$tmp"' EXIT

# Settings both kinds share: small PNGs (well under 100 KB), no fancy fonts.
common="set terminal pngcairo size 800,480 font 'sans,10' noenhanced
set output '$out'
set title \"$title\"
set grid
set key top left"

case "$kind" in
busbw)
    plots=()
    i=0
    for f in "$@"; do
        i=$((i + 1))
        # a benchmark's stdout may hold log lines besides its one JSON document
        grep -h '^{.*"results"' "$f" | head -n 1 > "$tmp/doc.json"
        [ -s "$tmp/doc.json" ] || die "$f: no --json document of cfx_coll_perf or mpi_coll"
        label=$(jq -r '(if .tool == "mpi_coll" then "Open MPI" else "Conflux" end)
            + " " + .op + " (" + (.nranks | tostring) + " ranks)"' "$tmp/doc.json") ||
            die "$f: not JSON"
        jq -r '.results[] | select((.inplace // 0) == 0) | "\(.size) \(.busbw)"' \
            "$tmp/doc.json" > "$tmp/$i.dat" || die "$f: no results"
        [ -s "$tmp/$i.dat" ] || die "$f: no out-of-place results"
        plots+=("'$tmp/$i.dat' using 1:2 with linespoints lw 2 title \"$label\"")
    done
    plot=$(IFS=,; echo "${plots[*]}")
    gnuplot <<EOF || exit 1
$common
set logscale x 2
set format x '%.0b%B'
set xlabel 'message size (bytes)'
set ylabel 'bus bandwidth (GB/s)'
set yrange [0:*]
plot $plot
EOF
    ;;
ps)
    [ $# -eq 1 ] || die "ps takes one CSV file"
    csv=$1
    header=$(grep -v '^#' "$csv" | head -n 1)
    [[ $header == t_s,map,s* ]] || die "$csv: header is not t_s,map,s0,..."
    nserv=$(($(echo "$header" | tr ',' '\n' | wc -l) - 2))
    grep -v '^#' "$csv" | tail -n +2 | tr ',' ' ' > "$tmp/ps.dat"
    [ -s "$tmp/ps.dat" ] || die "$csv: no samples"
    slow=$(sed -n 's/^# slow \([0-9.]*\)$/\1/p' "$csv" | head -n 1)
    plots=()
    for s in $(seq 0 $((nserv - 1))); do
        plots+=("'$tmp/ps.dat' using 1:$((s + 3)) with steps lw 2 title 'server $s'")
    done
    plot=$(IFS=,; echo "${plots[*]}")
    arrow=
    if [ -n "$slow" ]; then
        arrow="set arrow from $slow, graph 0 to $slow, graph 1 nohead dt 2 lc 'gray'
set label 'server 1 made slow' at $slow, graph 0.05 offset 0.5,0"
    fi
    gnuplot <<EOF || exit 1
$common
set key below
set offsets 0, 0, 1, 0
set xlabel 'time since the job started (s)'
set ylabel 'blocks'
set yrange [0:*]
$arrow
plot $plot
EOF
    ;;
*) usage >&2; exit 2 ;;
esac
[ -s "$out" ] || { echo "plot.sh: gnuplot wrote no $out" >&2; exit 1; }
