#!/usr/bin/env bash
# The Conflux demo: a data-parallel training job on this host.  Six
# processes: two parameter servers and four workers train a small MLP on a
# synthetic data set; halfway through one server is made slow and the
# scheduler moves its blocks away.  Each epoch prints loss, accuracy, samples
# per second and the blocks per server; the run ends with the test accuracy.
# (`-- --allreduce` trains the same model with group allreduce instead.)
#
#   scripts/demo.sh [CFX_RUN_OPTION...] [-- DEMO_ARG...]
#
# Installs what is missing (scripts/deps.sh), configures and builds the two
# programs it needs when they are out of date, then runs
#
#   build/bin/cfx_run -n 6 [CFX_RUN_OPTION...] build/bin/cfx_train [DEMO_ARG...]
#
# e.g.  scripts/demo.sh --transport tcp      (options of cfx_run)
#       scripts/demo.sh -- --allreduce       (arguments for cfx_train: --epochs N,
#                                             --batch B, --slow-us US, --allreduce)
# The earlier broadcast demo is still built: cfx_run -n 4 build/bin/cfx_demo_bcast
#
# Environment: CFX_BUILD_DIR (default: build), CFX_SKIP_DEPS=1.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
build_dir=${CFX_BUILD_DIR:-build}

run_opts=()
demo_args=()
while (($#)); do
    if [[ $1 == -- ]]; then
        shift
        demo_args=("$@")
        break
    fi
    run_opts+=("$1")
    shift
done

if [[ ${CFX_SKIP_DEPS:-0} != 1 ]]; then
    "$repo/scripts/deps.sh"
fi

if [[ ! -f $build_dir/CMakeCache.txt ]]; then
    cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo
fi
# Incremental: a no-op when nothing changed.
cmake --build "$build_dir" -j"$(nproc 2>/dev/null || echo 2)" --target cfx_run cfx_train

exec "$build_dir/bin/cfx_run" -n 6 "${run_opts[@]}" \
    "$build_dir/bin/cfx_train" "${demo_args[@]}"
