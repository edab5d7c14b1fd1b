#!/usr/bin/env bash
# Build the Soft-RoCE test guest's initramfs (newc cpio, gzip).
#
#   test/vm/build-initramfs.sh --root DIR --build-dir DIR --list FILE --out FILE
#                              [--work DIR] [--test-timeout SEC]
#
#   --root DIR          Debian packages unpacked with dpkg -x (run.sh does
#                       this): busybox-static, linux-image-*, iproute2,
#                       rdma-core libraries and the rxe provider,
#                       ibverbs-utils, perftest
#   --build-dir DIR     the project's build tree: every program in DIR/bin
#                       goes in, at the same absolute path (tests find their
#                       helpers through the compiled-in CFX_BIN_DIR)
#   --list FILE         the commands the guest runs (tests.list format)
#   --out FILE          the initramfs to write
#   --work DIR          staging folder (default: a temporary one, removed)
#   --test-timeout SEC  default per-command timeout in the guest (120)
#
# What goes in: busybox (applets under /vm/busybox), the kernel modules
# rdma_rxe and rdma_ucm need plus virtio-net and crc32_generic, in load
# order resolved from modules.dep (/vm/modules.load); ip, rdma, ibv_*,
# perftest's ib_*; the rxe provider and /etc/libibverbs.d/rxe.driver; the
# project's programs and libraries; and every shared library ldd lists for
# all of them, with the dynamic loader, at the paths ldd shows (libraries
# from the unpacked packages first, then the host's).  /init is init.sh.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

die() {
    echo "build-initramfs: error: $*" >&2
    exit 1
}

usage() {
    sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}"
    exit "${1:-2}"
}

root='' build_dir='' list='' out='' work='' test_timeout=120
while (($#)); do
    case $1 in
        --root) root=${2:?}; shift 2 ;;
        --build-dir) build_dir=${2:?}; shift 2 ;;
        --list) list=${2:?}; shift 2 ;;
        --out) out=${2:?}; shift 2 ;;
        --work) work=${2:?}; shift 2 ;;
        --test-timeout) test_timeout=${2:?}; shift 2 ;;
        -h | --help) usage 0 ;;
        *) echo "build-initramfs: unknown argument: $1" >&2; usage ;;
    esac
done
[[ -n $root && -n $build_dir && -n $list && -n $out ]] || usage
root=$(cd "$root" && pwd) || die "no such folder: $root"
build_dir=$(cd "$build_dir" && pwd) || die "no such build folder: $build_dir"
[[ -r $list ]] || die "cannot read the test list $list"
[[ $test_timeout =~ ^[0-9]+$ ]] || die "--test-timeout takes seconds, not '$test_timeout'"

busybox=$root/bin/busybox
[[ -x $busybox ]] || die "$busybox is missing (package busybox-static)"

# ---- staging folder -----------------------------------------------------------
keep_work=1
if [[ -z $work ]]; then
    work=$(mktemp -d "${TMPDIR:-/tmp}/cfx-vm-initramfs.XXXXXX")
    keep_work=0
fi
cleanup() {
    if ((keep_work == 0)); then rm -rf "$work"; fi
}
trap cleanup EXIT
rootfs=$work/rootfs
rm -rf "$rootfs"
mkdir -p "$rootfs"

# Same merged-/usr layout as the host, so that ldd's paths mean the same
# files in the guest.
for d in bin sbin lib lib64; do
    if [[ -L /$d ]]; then
        ln -s "$(readlink "/$d")" "$rootfs/$d"
    else
        mkdir -p "$rootfs/$d"
    fi
done
mkdir -p "$rootfs"/{usr/bin,usr/sbin,usr/lib,usr/lib64,etc,dev,proc,sys,tmp,run,root}
mkdir -p "$rootfs"/vm/{bin,busybox}

# put SRC GUESTPATH: copy SRC (symlinks followed) to GUESTPATH in the guest.
put() {
    local dst=$rootfs$2
    mkdir -p "$(dirname "$dst")"
    cp -L --preserve=mode "$1" "$dst"
}

# ---- busybox ------------------------------------------------------------------
put "$busybox" /vm/busybox/busybox
for applet in $("$busybox" --list); do
    [[ $applet == busybox ]] || ln -s busybox "$rootfs/vm/busybox/$applet"
done
ln -s /vm/busybox/busybox "$rootfs/bin/sh"

# ---- kernel modules -----------------------------------------------------------
mods_root=$root/lib/modules
kvers=("$mods_root"/*)
if ((${#kvers[@]} != 1)) || [[ ! -d ${kvers[0]} ]]; then
    die "expected one kernel under $mods_root, found: ${kvers[*]##*/}"
fi
kver=${kvers[0]##*/}
moddir=$mods_root/$kver
if [[ ! -s $moddir/modules.dep ]]; then
    echo "build-initramfs: generating modules.dep for $kver"
    "$busybox" depmod -b "$root" "$kver" || die "depmod failed for $kver"
fi

declare -A mod_path=() mod_deps=() mod_seen=()
while IFS= read -r line; do
    rel=${line%%:*}
    name=${rel##*/}
    name=${name%%.ko*}
    name=${name//-/_}
    mod_path[$name]=$rel
    mod_deps[$name]=${line#*:}
done <"$moddir/modules.dep"

mod_order=()
# add_module NAME: NAME after everything it depends on (depth first).
add_module() {
    local name=${1//-/_} dep
    [[ -n ${mod_seen[$name]:-} ]] && return 0
    mod_seen[$name]=1
    if [[ -z ${mod_path[$name]:-} ]]; then
        if grep -Eq "/${name//_/[-_]}\.ko" "$moddir/modules.builtin"; then
            return 0 # built into this kernel
        fi
        die "kernel $kver has no module $name"
    fi
    for dep in ${mod_deps[$name]}; do
        dep=${dep##*/}
        add_module "${dep%%.ko*}"
    done
    mod_order+=("$name")
}
# crc32_generic first: rxe asks the crypto API for "crc32" by name, which no
# modules.dep entry records; without it `rdma link add` fails with ENOENT.
for m in crc32_generic virtio_pci virtio_net rdma_rxe rdma_ucm; do
    add_module "$m"
done

: >"$rootfs/vm/modules.load"
for name in "${mod_order[@]}"; do
    rel=${mod_path[$name]}
    src=$moddir/$rel
    dst=/lib/modules/$kver/${rel%.ko*}.ko
    mkdir -p "$(dirname "$rootfs$dst")"
    case $rel in
        *.ko) cp "$src" "$rootfs$dst" ;;
        *.ko.xz) xz -dc "$src" >"$rootfs$dst" ;;
        *.ko.zst) zstd -qdc "$src" >"$rootfs$dst" ;;
        *.ko.gz) gzip -dc "$src" >"$rootfs$dst" ;;
        *) die "unknown module format: $rel" ;;
    esac
    echo "$dst" >>"$rootfs/vm/modules.load"
done
echo "build-initramfs: kernel $kver, modules: ${mod_order[*]}"

# ---- programs and their libraries ---------------------------------------------
stage_libpath=$root/lib/x86_64-linux-gnu:$root/usr/lib/x86_64-linux-gnu
declare -A lib_done=()
elves=() # host paths of ELF files whose libraries must come along

is_elf() {
    [[ -f $1 ]] && [[ $(head -c 4 "$1" | od -An -c | tr -d ' ') == '177ELF' ]]
}

# guest_path HOSTPATH: where a file from the unpacked packages or the host
# lives in the guest.
guest_path() {
    case $1 in
        "$root"/*) echo "${1#"$root"}" ;;
        *) echo "$1" ;;
    esac
}

# add_libs ELF: copy every library ldd resolves for ELF (staged packages'
# libraries first) plus the loader; fail on "not found".
add_libs() {
    local f=$1 out line path missing=()
    out=$(LD_LIBRARY_PATH=$stage_libpath ldd "$f" 2>&1) || {
        [[ $out == *"not a dynamic executable"* || $out == *"statically linked"* ]] && return 0
        die "ldd $f failed: $out"
    }
    while IFS= read -r line; do
        path=
        case $line in
            *"=> not found"*) missing+=("${line%% =>*}") ;;
            *"=> /"*) path=${line#*=> }; path=${path%% (*} ;;
            [[:space:]]/*) path=${line#"${line%%[![:space:]]*}"}; path=${path%% (*} ;;
        esac
        path=${path//[[:space:]]/}
        [[ -n $path && -z ${lib_done[$path]:-} ]] || continue
        lib_done[$path]=1
        put "$path" "$(guest_path "$path")"
    done <<<"$out"
    ((${#missing[@]} == 0)) ||
        die "$f needs ${missing[*]// /}, found neither on this host nor in the unpacked packages"
}

# Programs from the packages: required ones, then useful ones if present.
find_prog() {
    local d
    for d in usr/bin usr/sbin bin sbin; do
        if [[ -x $root/$d/$1 ]]; then
            echo "$root/$d/$1"
            return 0
        fi
    done
    return 1
}
for p in ip rdma ibv_devices ibv_devinfo ib_write_bw; do
    f=$(find_prog "$p") || die "$p is missing from the unpacked packages under $root"
    put "$f" "$(guest_path "$f")"
    elves+=("$f")
done
for p in ibv_rc_pingpong ibv_ud_pingpong ib_write_lat ib_read_bw ib_read_lat ib_send_bw ib_send_lat; do
    if f=$(find_prog "$p"); then
        put "$f" "$(guest_path "$f")"
        elves+=("$f")
    fi
done

# The rxe provider: libibverbs dlopens it from its compiled-in directory,
# found through /etc/libibverbs.d/rxe.driver.
providers=("$root"/usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav*.so)
[[ -f ${providers[0]} ]] || die "no librxe-rdmav*.so under $root (package ibverbs-providers)"
[[ -f $root/etc/libibverbs.d/rxe.driver ]] ||
    die "no /etc/libibverbs.d/rxe.driver under $root (package ibverbs-providers)"
for f in "${providers[@]}"; do
    put "$f" "$(guest_path "$f")"
    elves+=("$f")
done
put "$root/etc/libibverbs.d/rxe.driver" /etc/libibverbs.d/rxe.driver

# The project: every program in bin/ (Criterion tests, tools, helpers) and
# every library in lib/, at their own absolute paths.
nbin=0
for f in "$build_dir"/bin/*; do
    [[ -f $f && -x $f ]] || continue
    put "$f" "$f"
    nbin=$((nbin + 1))
    is_elf "$f" && elves+=("$f")
done
((nbin > 0)) || die "no programs in $build_dir/bin: build the project first (cmake --build $build_dir)"
for f in "$build_dir"/lib/*.so*; do
    [[ -e $f ]] || continue
    if [[ -L $f ]]; then
        mkdir -p "$rootfs$(dirname "$f")"
        cp -P "$f" "$rootfs$f"
    else
        put "$f" "$f"
        elves+=("$f")
    fi
done

for f in "${elves[@]}"; do
    add_libs "$f"
done
# glibc dlopens libgcc_s for pthread_cancel and unwinding.
for f in /lib/x86_64-linux-gnu/libgcc_s.so.1 /usr/lib/x86_64-linux-gnu/libgcc_s.so.1; do
    if [[ -f $f && -z ${lib_done[$f]:-} ]]; then
        put "$f" "$f"
        break
    fi
done
echo "build-initramfs: $nbin project programs, ${#elves[@]} ELF files, ${#lib_done[@]} libraries"

# A loader cache, so the guest's loader needs no search (harmless if absent).
printf '%s\n' /lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu "$build_dir/lib" \
    >"$rootfs/etc/ld.so.conf"
if command -v ldconfig >/dev/null 2>&1 || [[ -x /sbin/ldconfig ]]; then
    PATH=$PATH:/sbin:/usr/sbin ldconfig -r "$rootfs" 2>/dev/null || true
fi

# ---- /etc, /init, configuration -------------------------------------------------
cat >"$rootfs/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
EOF
cat >"$rootfs/etc/group" <<'EOF'
root:x:0:
nogroup:x:65534:
EOF
cat >"$rootfs/etc/hosts" <<'EOF'
127.0.0.1 localhost
10.0.2.15 cfx-vm
EOF
echo cfx-vm >"$rootfs/etc/hostname"
printf 'hosts: files dns\npasswd: files\ngroup: files\n' >"$rootfs/etc/nsswitch.conf"

install -m 0755 "$here/init.sh" "$rootfs/init"
ln -s /init "$rootfs/vm/bin/vm-devices"
ln -s /init "$rootfs/vm/bin/vm-ib-write-bw"
install -m 0644 "$list" "$rootfs/vm/tests.list"
{
    printf 'CFX_VM_BUILD_DIR=%q\n' "$build_dir"
    printf 'CFX_VM_TEST_TIMEOUT=%q\n' "$test_timeout"
    # The project's programs come first on PATH.
    printf 'PATH=%q\n' "$build_dir/bin:/vm/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/vm/busybox"
    echo 'export CFX_VM_BUILD_DIR CFX_VM_TEST_TIMEOUT PATH'
} >"$rootfs/vm/config"
# An initial console for the kernel to hand to /init (init.sh copes without).
mknod -m 0600 "$rootfs/dev/console" c 5 1 2>/dev/null || true

# ---- archive --------------------------------------------------------------------
mkdir -p "$(dirname "$out")"
(cd "$rootfs" && find . | LC_ALL=C sort | "$busybox" cpio -o -H newc -R 0:0 2>/dev/null) |
    gzip -1 >"$out.tmp"
mv "$out.tmp" "$out"
echo "build-initramfs: wrote $out ($(du -h "$out" | cut -f1), $(du -sh "$rootfs" | cut -f1) unpacked)"
