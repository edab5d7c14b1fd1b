#!/usr/bin/env bash
# Run the project's tests on Soft-RoCE (rdma_rxe) inside a QEMU guest built
# from Debian packages.  This host's kernel has no RDMA; the guest's does.
#
#   test/vm/run.sh [--build-dir DIR] [--timeout SEC] [--list FILE]
#                  [--test-timeout SEC] [--keep] [-- CMD...]
#
#   --build-dir DIR     the project's build tree (default: $CFX_BUILD_DIR or
#                       build); its bin/ programs are copied into the guest
#   --timeout SEC       limit for the whole run, downloads and boot included
#                       (default 540); qemu is killed when it is spent
#   --list FILE         commands to run in the guest (default test/vm/tests.list)
#   --test-timeout SEC  per-command timeout for lines that set none (120)
#   --keep              keep the initramfs staging folder and print its path
#   -- CMD...           run this one command instead of the list (a single
#                       word is taken as a shell command line: -- 'a; b')
#
# Steps: install qemu-system-x86 on the host if it is missing; fetch the
# guest's Debian packages with `apt-get download` into the cache
# ($CFX_VM_CACHE, default ${XDG_CACHE_HOME:-$HOME/.cache}/conflux-vm) unless
# they are there already; unpack them with dpkg -x; build the initramfs
# (build-initramfs.sh); boot it under TCG; echo the console prefixed by
# "vm| ".
#
# Writes, in the build directory:
#   vm-metrics.txt      the guest's "METRIC <name> <value>" lines, without
#                       the "METRIC " (one run's worth, replaced each run)
#   vm/console.log      the guest's console
#   vm/initramfs.cpio.gz
#
# Environment: CFX_VM_CACHE (the cache above), CFX_VM_MEM (guest memory,
# default 2G), CFX_VM_KERNEL_PKG (a linux-image-* package instead of the
# one linux-image-amd64 points to).
#
# Exit status: 0 when the guest's summary line says 0 failed; 1 when tests
# failed; 2 on a usage or host-side setup error (package, build tree, qemu);
# 3 when the guest never printed its summary (boot failure, crash);
# 124 when the run exceeded --timeout.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
start=$SECONDS

say() { echo "vm: $*"; }
die() {
    echo "vm: error: $*" >&2
    exit 2
}
usage() {
    sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"
    exit "${1:-2}"
}

build_dir=${CFX_BUILD_DIR:-build}
timeout=540
list=$here/tests.list
test_timeout=120
keep=0
cmd=()
while (($#)); do
    case $1 in
        --build-dir) build_dir=${2:?--build-dir needs a folder}; shift 2 ;;
        --timeout) timeout=${2:?--timeout needs seconds}; shift 2 ;;
        --list) list=${2:?--list needs a file}; shift 2 ;;
        --test-timeout) test_timeout=${2:?--test-timeout needs seconds}; shift 2 ;;
        --keep) keep=1; shift ;;
        -h | --help) usage 0 ;;
        --) shift; cmd=("$@"); break ;;
        *) echo "vm: unknown argument: $1" >&2; usage ;;
    esac
done
if ! [[ $timeout =~ ^[0-9]+$ ]] || ((timeout < 30)); then
    die "--timeout takes seconds (at least 30), not '$timeout'"
fi
[[ $test_timeout =~ ^[0-9]+$ ]] || die "--test-timeout takes seconds, not '$test_timeout'"
[[ $build_dir == /* ]] || build_dir=$PWD/$build_dir
[[ -d $build_dir ]] || die "no build directory $build_dir: build the project first"
build_dir=$(cd "$build_dir" && pwd)
compgen -G "$build_dir/bin/*" >/dev/null ||
    die "$build_dir/bin has no programs: build the project first (cmake --build $build_dir)"
[[ ${#cmd[@]} -gt 0 || -r $list ]] || die "cannot read the test list $list"

cache=${CFX_VM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/conflux-vm}
mem=${CFX_VM_MEM:-2G}
vmdir=$build_dir/vm
mkdir -p "$cache/debs" "$vmdir"

left() { echo $((timeout - (SECONDS - start))); }

# ---- qemu on the host -----------------------------------------------------------
apt_updated=0
apt_update() {
    ((apt_updated == 0)) || return 0
    apt_updated=1
    say "apt-get update (package lists missing or stale)"
    apt-get update -qq || say "apt-get update failed; carrying on with the lists there are"
}

qemu=$(command -v qemu-system-x86_64 || true)
if [[ -z $qemu ]]; then
    ((EUID == 0)) || die "qemu-system-x86_64 is missing; install it: sudo apt-get install qemu-system-x86"
    say "installing qemu-system-x86 on the host"
    install_qemu() {
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            -o DPkg::Lock::Timeout=120 qemu-system-x86
    }
    install_qemu || { apt_update && install_qemu; } || die "could not install qemu-system-x86 (apt-get's error above)"
    qemu=$(command -v qemu-system-x86_64) || die "qemu-system-x86_64 still missing after installing qemu-system-x86"
fi
if [[ -w /dev/kvm ]]; then
    say "using TCG (KVM is not used: nested KVM is not usable on these machines)"
else
    say "no usable /dev/kvm: using TCG"
fi

# ---- guest packages ---------------------------------------------------------------
# Each cached package is reused as is: delete the cache to pick up newer ones.
guest_pkgs=(busybox-static iproute2 libibverbs1 ibverbs-providers librdmacm1
    libnl-3-200 libnl-route-3-200 ibverbs-utils perftest libibumad3 libpci3)

cached_deb() { compgen -G "$cache/debs/${1}_*.deb" | sort -V | tail -n 1 || true; }

# fetch PKG...: apt-get download what is not cached; on failure update the
# lists once and retry, then report each package that is still missing.
fetch() {
    local want=() p err
    for p in "$@"; do
        [[ -n $(cached_deb "$p") ]] || want+=("$p")
    done
    ((${#want[@]})) || return 0
    say "downloading ${want[*]}"
    apt_get_download() {
        # apt-get's messages are the result; its progress goes nowhere.
        # shellcheck disable=SC2069
        (cd "$cache/debs" && apt-get download -q -o APT::Sandbox::User=root "$@" 2>&1 >/dev/null)
    }
    if err=$(apt_get_download "${want[@]}"); then return 0; fi
    echo "vm: apt-get download failed:" >&2
    echo "vm:   ${err//$'\n'/$'\n'vm:   }" >&2
    apt_update
    for p in "${want[@]}"; do
        [[ -n $(cached_deb "$p") ]] && continue
        err=$(apt_get_download "$p") ||
            die "package $p could not be downloaded from the archive; apt-get said:
$err"
    done
}

# One run at a time fetches and unpacks into a cache.
exec 9>"$cache/.lock"
flock -w "$(left)" 9 || die "another run held $cache/.lock for ${timeout}s"

if [[ -n ${CFX_VM_KERNEL_PKG:-} ]]; then
    kernel_pkg=$CFX_VM_KERNEL_PKG
else
    fetch linux-image-amd64
    meta=$(cached_deb linux-image-amd64)
    kernel_pkg=$(dpkg-deb -f "$meta" Depends | tr ',' '\n' | grep -o 'linux-image-[^ ]*' | head -n 1)
    [[ -n $kernel_pkg ]] || die "cannot tell which kernel $meta depends on"
fi
fetch "$kernel_pkg" "${guest_pkgs[@]}"

debs=()
for p in "$kernel_pkg" "${guest_pkgs[@]}"; do
    debs+=("$(cached_deb "$p")")
done

# Unpack once per set of packages.
key=$(printf '%s\n' "${debs[@]##*/}" | sha256sum | cut -c1-16)
root=$cache/root-$key
if [[ ! -e $root/.complete ]]; then
    say "unpacking ${#debs[@]} packages into $root"
    rm -rf "$root"
    mkdir -p "$root"
    for d in "${debs[@]}"; do
        dpkg -x "$d" "$root" || die "dpkg -x $d failed"
    done
    # The package's postinst would run depmod; busybox's does it here.
    for m in "$root"/lib/modules/*; do
        "$root/bin/busybox" depmod -b "$root" "${m##*/}" || die "depmod failed for ${m##*/}"
    done
    touch "$root/.complete"
fi
exec 9>&-
vmlinuz=$(compgen -G "$root/boot/vmlinuz-*" | head -n 1) || true
[[ -n $vmlinuz ]] || die "no /boot/vmlinuz-* in $kernel_pkg"

# ---- initramfs ---------------------------------------------------------------------
run_list=$list
if ((${#cmd[@]})); then
    run_list=$vmdir/command.list
    if ((${#cmd[@]} == 1)); then
        printf '%s\n' "${cmd[0]}" >"$run_list" # one word: a shell command line
    else
        printf '%q ' "${cmd[@]}" >"$run_list"
        echo >>"$run_list"
    fi
fi
work_args=()
if ((keep)); then
    work=$(mktemp -d "${TMPDIR:-/tmp}/cfx-vm-work.XXXXXX")
    work_args=(--work "$work")
fi
initrd=$vmdir/initramfs.cpio.gz
"$here/build-initramfs.sh" --root "$root" --build-dir "$build_dir" --list "$run_list" \
    --out "$initrd" --test-timeout "$test_timeout" "${work_args[@]}" ||
    die "building the initramfs failed"
((keep)) && say "kept the staging folder: $work"

# ---- boot ----------------------------------------------------------------------------
console=$vmdir/console.log
metrics=$build_dir/vm-metrics.txt
: >"$console"
rm -f "$metrics"

# The guest gets what is left minus a margin (its clock starts some 5 s
# after qemu does; then it prints its summary and powers off); the host
# kills qemu when the whole budget is spent.
guest_budget=$(($(left) - 20))
((guest_budget >= 20)) || {
    echo "vm: error: only $(left)s of the ${timeout}s budget left before boot" >&2
    exit 124
}

# shellcheck disable=SC2054 # the commas belong to qemu's option syntax
qemu_args=(
    -machine q35,accel=tcg -cpu max -m "$mem" -smp 2
    -nographic -no-reboot -no-user-config
    -kernel "$vmlinuz" -initrd "$initrd"
    -append "console=ttyS0 quiet panic=1 cfx_budget=$guest_budget"
    -netdev user,id=n0 -device virtio-net-pci,netdev=n0,romfile=
)
say "booting: $qemu ${qemu_args[*]}"
boot_t0=$SECONDS

qpid=
tpid=
stop_qemu() {
    if [[ -n $qpid ]] && kill -0 "$qpid" 2>/dev/null; then
        kill -TERM "$qpid" 2>/dev/null || true
        for _ in 1 2 3 4 5 6 7 8 9 10; do
            kill -0 "$qpid" 2>/dev/null || break
            sleep 0.2
        done
        kill -KILL "$qpid" 2>/dev/null || true
    fi
    if [[ -n $tpid ]]; then kill "$tpid" 2>/dev/null || true; fi
}
trap 'stop_qemu' EXIT
trap 'echo "vm: interrupted; qemu stopped" >&2; exit 130' INT TERM

"$qemu" "${qemu_args[@]}" </dev/null >"$console" 2>&1 &
qpid=$!
# Echo the console as it comes: CRs and terminal escapes dropped, prefixed.
tail -n +1 -F --pid="$qpid" "$console" 2>/dev/null |
    sed -u -e 's/\r//g' -e 's/\x1b\[[0-9;?]*[A-Za-z]//g' -e 's/\x1bc//g' -e 's/^/vm| /' &
tpid=$!

timed_out=0
while kill -0 "$qpid" 2>/dev/null; do
    if (($(left) <= 0)); then
        timed_out=1
        stop_qemu
        break
    fi
    sleep 0.5
done
qrc=0
wait "$qpid" 2>/dev/null || qrc=$?
qpid=
wait "$tpid" 2>/dev/null || true
tpid=
run_s=$((SECONDS - boot_t0))

clean=$(sed -e 's/\r//g' "$console")
grep -a '^METRIC [^ ]\+ [^ ]\+' <<<"$clean" | sed 's/^METRIC //' >"$metrics" || true
summary=$(grep -a -o 'VM-TESTS: [0-9]\+ passed, [0-9]\+ failed' <<<"$clean" | tail -n 1 || true)

total_s=$((SECONDS - start))
echo
if ((timed_out)); then
    echo "vm: error: the run exceeded --timeout ${timeout}s; qemu (killed) ran ${run_s}s. Console: $console" >&2
    [[ -n $summary ]] && echo "vm: the guest had printed: $summary" >&2
    exit 124
fi
if [[ -z $summary ]]; then
    echo "vm: error: boot failure: the guest never printed its summary line (qemu exit $qrc after ${run_s}s). Console: $console" >&2
    grep -a -E 'Kernel panic|VM-SETUP|Attempted to kill init|not syncing' <<<"$clean" | sed 's/^/vm:   /' >&2 || true
    exit 3
fi
failed=${summary##*passed, }
failed=${failed%% *}
if [[ -s $metrics ]]; then
    say "metrics -> $metrics: $(tr '\n' ';' <"$metrics" | sed 's/;$//;s/;/; /g')"
fi
say "$summary (boot + tests ${run_s}s, whole run ${total_s}s)"
if ((failed != 0)); then
    grep -a -o 'VM-\(FAILED\|SETUP\): .*' <<<"$clean" | sed 's/^/vm:   /' >&2 || true
    exit 1
fi
exit 0
