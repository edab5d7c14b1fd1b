#!/bin/sh
# Soft-RoCE test guest: /init of the initramfs built by build-initramfs.sh,
# and the guest's helper commands (one script, called by several names):
#
#   /init                   boot: mounts, modules, eth0, rxe0, the test list,
#                           the summary line, power off
#   /vm/bin/vm-devices      is rxe0 there and ACTIVE? (rdmactl devices when
#                           this build's rdmactl has it, else ibv_devices)
#   /vm/bin/vm-ib-write-bw [SIZE [ITERS]]
#                           perftest ib_write_bw server + client on rxe0,
#                           prints "METRIC ib_write_bw_gbps <BW average>"
#
# Runs under busybox sh as PID 1.  Lines the host harness (run.sh) reads:
#   VM-SETUP: FAILED (<step>)           setup failed; no test was run
#   VM-TEST: [i/n] PASS|FAIL ...        one per command of the list
#   VM-TESTS: <N> passed, <M> failed    the summary, always printed last
#   VM-FAILED: <command> (<why>)        one per failed command
#   METRIC <name> <value>               collected into vm-metrics.txt
#
# /vm/config (written by build-initramfs.sh) sets CFX_VM_BUILD_DIR and
# CFX_VM_TEST_TIMEOUT; the kernel command line may carry cfx_budget=SECONDS
# (time left for the whole guest run, counted from boot).

PATH=/vm/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/vm/busybox
export PATH

RXE_DEV=rxe0
NETDEV=eth0
GUEST_ADDR=10.0.2.15
GUEST_PREFIX=24
GUEST_GW=10.0.2.2

# now_cs: seconds since boot, in hundredths (integer), from /proc/uptime.
now_cs() {
    read -r up _ </proc/uptime
    echo "${up%.*}${up#*.}" | sed 's/^0*//;s/^$/0/'
}

# fmt_cs CENTISECONDS: "12.34"
fmt_cs() {
    printf '%d.%02d' $(($1 / 100)) $(($1 % 100))
}

# ---- helper: vm-devices -------------------------------------------------------
vm_devices() {
    rc=0
    if command -v rdmactl >/dev/null 2>&1 &&
        rdmactl --help 2>&1 | grep -qw devices; then
        echo "vm-devices: rdmactl devices"
        rdmactl devices || rc=$?
    else
        echo "vm-devices: this build's rdmactl has no 'devices' command; using ibv_devices"
        ibv_devices || rc=$?
        ibv_devices 2>/dev/null | grep -qw "$RXE_DEV" || {
            echo "vm-devices: $RXE_DEV is not in ibv_devices' list"
            rc=1
        }
    fi
    # The port must be usable, whatever listed it.
    if ! ibv_devinfo -d "$RXE_DEV" | grep -q 'state:.*PORT_ACTIVE'; then
        ibv_devinfo -d "$RXE_DEV"
        echo "vm-devices: port 1 of $RXE_DEV is not PORT_ACTIVE"
        rc=1
    fi
    return "$rc"
}

# ---- helper: vm-ib-write-bw ---------------------------------------------------
# Server and client of perftest's ib_write_bw on the same device, talking
# over 127.0.0.1 for the out-of-band exchange.  Sizes stay small: TCG moves
# some 0.1-0.2 Gbit/s.
vm_ib_write_bw() {
    size=${1:-65536}
    iters=${2:-300}
    port=18515
    gid=${CFX_VM_GID_INDEX:-1}
    set -- -d "$RXE_DEV" -i 1 -x "$gid" -s "$size" -n "$iters" -p "$port" -F --report_gbits

    ib_write_bw "$@" >/tmp/ib_write_bw.server 2>&1 &
    spid=$!
    # Wait (at most 10 s) for the server's TCP listener before connecting.
    i=0
    while ! netstat -ltn 2>/dev/null | grep -q ":$port "; do
        i=$((i + 1))
        if [ "$i" -gt 100 ] || ! kill -0 "$spid" 2>/dev/null; then
            echo "vm-ib-write-bw: the server never listened on port $port:"
            cat /tmp/ib_write_bw.server
            kill -9 "$spid" 2>/dev/null
            return 1
        fi
        sleep 0.1
    done

    rc=0
    ib_write_bw "$@" 127.0.0.1 >/tmp/ib_write_bw.client 2>&1 || rc=$?
    # The server ends on its own once the client is done; give it 10 s.
    i=0
    while kill -0 "$spid" 2>/dev/null && [ "$i" -lt 100 ]; do
        i=$((i + 1))
        sleep 0.1
    done
    if kill -0 "$spid" 2>/dev/null; then
        echo "vm-ib-write-bw: the server did not exit; killing it"
        kill -9 "$spid" 2>/dev/null
        rc=1
    fi
    wait "$spid" || rc=$?

    echo "---- ib_write_bw client ----"
    cat /tmp/ib_write_bw.client
    if [ "$rc" -ne 0 ]; then
        echo "---- ib_write_bw server ----"
        cat /tmp/ib_write_bw.server
        echo "vm-ib-write-bw: failed (exit $rc)"
        return "$rc"
    fi
    # The results row follows the "#bytes #iterations BW peak[Gb/sec]
    # BW average[Gb/sec] MsgRate[Mpps]" header: BW average is field 4.
    bw=$(awk '/#bytes/ { hdr = 1; next } hdr && $1 ~ /^[0-9]+$/ { print $4; exit }' \
        /tmp/ib_write_bw.client)
    if [ -z "$bw" ]; then
        echo "vm-ib-write-bw: no results row in the client's output"
        return 1
    fi
    echo "METRIC ib_write_bw_gbps $bw"
    echo "METRIC ib_write_bw_msg_bytes $size"
}

# ---- boot ---------------------------------------------------------------------
setup_failed() {
    echo "VM-SETUP: FAILED ($*)"
    echo "VM-TESTS: 0 passed, 1 failed"
    echo "VM-FAILED: setup: $*"
    power_off
}

power_off() {
    sync
    poweroff -f
    sleep 2
    reboot -f # with qemu -no-reboot this ends qemu too
}

# kill_leftovers: SIGKILL every user process but PID 1 (a test's background
# children, or what its timeout left).  Kernel threads are PID 2 and its
# children.
kill_leftovers() {
    killed=
    for d in /proc/[0-9]*; do
        pid=${d#/proc/}
        [ "$pid" -le 2 ] && continue
        stat=
        read -r stat <"$d/stat" 2>/dev/null || continue
        rest=${stat##*) }
        # shellcheck disable=SC2086 # split the stat fields on purpose
        set -- $rest
        [ "${2:-2}" = 2 ] && continue
        comm=${stat#*(}
        comm=${comm%%)*}
        kill -9 "$pid" 2>/dev/null || continue
        # busybox timeout's watcher outlives a command that ended in time.
        [ "$comm" = timeout ] || killed="$killed $pid($comm)"
    done
    [ -n "$killed" ] && echo "VM: killed leftover processes:$killed"
    return 0
}

# wait_for SECONDS CMD...: poll CMD every 0.1 s until it succeeds.
wait_for() {
    n=$(($1 * 10))
    shift
    while ! "$@" >/dev/null 2>&1; do
        n=$((n - 1))
        [ "$n" -le 0 ] && return 1
        sleep 0.1
    done
}

port_active() {
    grep -q ACTIVE "/sys/class/infiniband/$RXE_DEV/ports/1/state"
}

boot() {
    # Console first: without /dev/console in the archive the kernel started
    # us with no stdout.
    mount -t devtmpfs devtmpfs /dev 2>/dev/null
    exec </dev/console >/dev/console 2>&1
    mount -t proc proc /proc
    mount -t sysfs sysfs /sys
    mkdir -p /dev/pts /dev/shm /tmp /run /root
    mount -t devpts devpts /dev/pts
    mount -t tmpfs -o mode=1777 tmpfs /dev/shm
    # The initramfs root is already writable memory.  A tmpfs over /tmp
    # would hide a build tree that lives under /tmp (the project's files sit
    # at their host paths), so /tmp gets one only when it is empty.
    if [ -z "$(ls -A /tmp 2>/dev/null)" ]; then
        mount -t tmpfs -o mode=1777 tmpfs /tmp
    else
        chmod 1777 /tmp
    fi
    mount -t tmpfs tmpfs /run
    hostname cfx-vm
    # shellcheck source=/dev/null
    . /vm/config
    export HOME=/root TMPDIR=/tmp CFX_VM=1 CFX_VM_RDMA_DEV=$RXE_DEV

    boot_cs=$(now_cs)
    echo "VM: userspace up at $(fmt_cs "$boot_cs") s ($(uname -r), $(nproc) CPUs)"
    echo "METRIC vm_boot_s $(fmt_cs "$boot_cs")"

    budget=
    read -r cmdline </proc/cmdline
    for arg in $cmdline; do
        case $arg in cfx_budget=*) budget=${arg#cfx_budget=} ;; esac
    done
    deadline_cs=
    [ -n "$budget" ] && deadline_cs=$((budget * 100))

    # Modules, in the order build-initramfs.sh resolved from modules.dep.
    while read -r ko; do
        [ -n "$ko" ] || continue
        insmod "$ko" || setup_failed "insmod $ko"
    done </vm/modules.load

    # Network: user-mode networking's guest address, set by hand (no DHCP).
    wait_for 5 ip link show "$NETDEV" || setup_failed "no $NETDEV after loading virtio_net"
    ip link set lo up
    ip link set "$NETDEV" up || setup_failed "ip link set $NETDEV up"
    ip addr add "$GUEST_ADDR/$GUEST_PREFIX" dev "$NETDEV" || setup_failed "ip addr add"
    ip route add default via "$GUEST_GW" 2>/dev/null

    # Soft-RoCE on eth0 (needs crc32_generic loaded, else ENOENT).
    rdma link add "$RXE_DEV" type rxe netdev "$NETDEV" ||
        setup_failed "rdma link add $RXE_DEV type rxe netdev $NETDEV"
    wait_for 10 port_active || setup_failed "$RXE_DEV port 1 never became ACTIVE"
    wait_for 5 test -c /dev/infiniband/uverbs0 || setup_failed "no /dev/infiniband/uverbs0"
    # shellcheck disable=SC3045 # busybox sh has ulimit -l
    ulimit -l unlimited || setup_failed "ulimit -l unlimited"
    # The RoCEv2 GID of the IPv4 address (::ffff:10.0.2.15).
    gid_want=0000:0000:0000:0000:0000:ffff:0a00:020f
    CFX_VM_GID_INDEX=
    for g in "/sys/class/infiniband/$RXE_DEV/ports/1/gids"/*; do
        read -r v <"$g" 2>/dev/null || continue
        if [ "$v" = "$gid_want" ]; then
            CFX_VM_GID_INDEX=${g##*/}
            break
        fi
    done
    [ -n "$CFX_VM_GID_INDEX" ] || setup_failed "no RoCEv2 GID for $GUEST_ADDR on $RXE_DEV"
    export CFX_VM_GID_INDEX
    rdma link show
    echo "VM: $RXE_DEV ACTIVE on $NETDEV $GUEST_ADDR, GID index $CFX_VM_GID_INDEX, ready at $(fmt_cs "$(now_cs)") s"

    run_list /vm/tests.list
    power_off
}

# run_list FILE: one command per line, '#' comments and blank lines skipped;
# a line may start with timeout=SECONDS.  Each runs under sh -c in the build
# directory, its output straight to the console.
run_list() {
    total=$(grep -cvE '^[[:space:]]*(#|$)' "$1")
    i=0 passed=0 failed=0 failures=
    cd "$CFX_VM_BUILD_DIR" 2>/dev/null || cd /
    while IFS= read -r line <&3; do
        line=$(echo "$line" | sed 's/^[[:space:]]*//;s/[[:space:]]*$//')
        case $line in '' | '#'*) continue ;; esac
        i=$((i + 1))
        t=$CFX_VM_TEST_TIMEOUT
        case $line in
            timeout=*)
                t=${line%%[[:space:]]*}
                t=${t#timeout=}
                line=${line#timeout=*[[:space:]]}
                line=$(echo "$line" | sed 's/^[[:space:]]*//')
                ;;
        esac
        # Never let one command eat the time kept for the summary.
        if [ -n "$deadline_cs" ]; then
            left=$(((deadline_cs - $(now_cs)) / 100))
            if [ "$left" -lt 5 ]; then
                echo "VM-TEST: [$i/$total] FAIL (not run: out of time) $line"
                failed=$((failed + 1))
                failures="$failures
VM-FAILED: $line (not run: out of time)"
                continue
            fi
            [ "$t" -gt "$left" ] && t=$left
        fi
        echo "VM-TEST: [$i/$total] RUN (timeout ${t}s) $line"
        t0=$(now_cs)
        rc=0
        timeout -s TERM -k 5 "$t" sh -c "$line" </dev/null || rc=$?
        dt_cs=$(($(now_cs) - t0))
        dt=$(fmt_cs "$dt_cs")
        kill_leftovers
        if [ "$rc" -eq 0 ]; then
            echo "VM-TEST: [$i/$total] PASS (${dt} s) $line"
            passed=$((passed + 1))
        else
            why="exit $rc"
            if [ "$rc" -eq 143 ] || [ "$rc" -eq 137 ]; then
                [ "$dt_cs" -ge $((t * 100 - 50)) ] && why="timed out after ${t}s"
            fi
            echo "VM-TEST: [$i/$total] FAIL ($why, ${dt} s) $line"
            failed=$((failed + 1))
            failures="$failures
VM-FAILED: $line ($why)"
        fi
    done 3<"$1"
    echo "VM-TESTS: $passed passed, $failed failed"
    [ -n "$failures" ] && echo "${failures#?}"
    echo "VM: done at $(fmt_cs "$(now_cs)") s"
}

case ${0##*/} in
    vm-devices) vm_devices "$@" ;;
    vm-ib-write-bw) vm_ib_write_bw "$@" ;;
    *)
        if [ "$$" -ne 1 ]; then
            echo "usage: this is the test guest's /init (or call it as vm-devices or vm-ib-write-bw)" >&2
            exit 2
        fi
        boot
        ;;
esac
