#!/usr/bin/env bash
# Install what building and testing Conflux needs on Debian 12 (bookworm).
#
#   scripts/deps.sh [EXTRA_PACKAGE...]
#
# Idempotent: when every package is already installed it does not touch apt
# at all; otherwise it runs `apt-get update` once and installs only what is
# missing.  Runs as root, or through sudo when not root.  Extra package names
# on the command line are added to the list (later test stages use this).
set -euo pipefail

packages=(
    build-essential   # gcc, make, libc headers
    cmake             # >= 3.20 (bookworm ships 3.25)
    pkg-config        # criterion, libdpdk, conflux.pc in the install test
    binutils          # readelf: SONAME check in the install test
    libssl-dev        # libcrypto: HMAC token authentication, SHA-1 object ids
    libcriterion-dev  # unit and integration tests
    dpdk-dev          # DPDK transport: testpmd and tools (CFX_WITH_DPDK=AUTO finds libdpdk)
    libdpdk-dev       # librte_* and the net_memif / net_af_packet drivers
    libibverbs-dev    # RDMA verbs transport (CFX_WITH_VERBS=AUTO finds it)
    librdmacm-dev
    ibverbs-providers # user-space drivers, rdma_rxe (Soft-RoCE) among them
    iperf3            # baseline for the bandwidth benchmarks
    iproute2          # ip netns / tc for the cluster benchmarks
    prometheus        # promtool: the metrics test checks the coordinator's exposition
    clang             # libFuzzer targets; the clang Release build
    stress-ng         # CPU hogs: kernel-cap tests, test-repeat.sh --load
    ccache            # compiler cache: test.sh's six builds of the same sources
    python3-venv      # the Python package's test venv (test.sh stage 4a)
    python3-dev       # Python.h for its extension module
    python3-pip
)
packages+=("$@")

missing=()
for p in "${packages[@]}"; do
    status=$(dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null || true)
    [[ $status == ii* ]] || missing+=("$p")
done

if ((${#missing[@]} == 0)); then
    echo "deps: all ${#packages[@]} packages present"
    exit 0
fi

echo "deps: installing ${missing[*]}"
sudo=()
if ((EUID != 0)); then
    if ! command -v sudo >/dev/null 2>&1; then
        echo "deps: not root and sudo is missing; install as root: apt-get install ${missing[*]}" >&2
        exit 1
    fi
    sudo=(sudo)
fi

export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -q --no-install-recommends "${missing[@]}"
