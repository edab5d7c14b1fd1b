#!/usr/bin/env bash
# Install a built tree into a scratch prefix and build an outside project
# against it, four ways: CMake's find_package(conflux) with conflux::conflux
# and conflux::conflux_static, and pkg-config, shared and --static.
#
#   test/install/check-install.sh SRC_DIR BUILD_DIR
#
# Checks: every build succeeds and runs (the static ones too, with no GPU or
# driver: the CUDA runtime finds the driver only at first use); the
# installed package files name no library by the build machine's absolute
# path; libconflux.so has SONAME
# libconflux.so.0; the public headers compile on their own; the shared
# library exports only cfx_* symbols.  Exits non-zero with a message naming
# the failed check.
set -euo pipefail

if (($# != 2)); then
    echo "usage: $0 SRC_DIR BUILD_DIR" >&2
    exit 2
fi
src=$(cd "$1" && pwd)
build=$(cd "$2" && pwd)
example=$src/test/install/example

tmp=$(mktemp -d "${TMPDIR:-/tmp}/conflux-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix

fail() {
    echo "check-install: FAILED: $*" >&2
    exit 1
}
step() {
    echo "check-install: $*"
}

step "installing $build into $prefix"
cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" 2>&1 ||
    { cat "$tmp/install.log" >&2; fail "cmake --install"; }

libdir=
for d in "$prefix"/lib "$prefix"/lib64 "$prefix"/lib/*-linux-gnu; do
    if [[ -e $d/libconflux.so ]]; then
        libdir=$d
        break
    fi
done
[[ -n $libdir ]] || fail "no libconflux.so under $prefix"
[[ -f $prefix/include/conflux/conflux.h ]] || fail "conflux/conflux.h not installed"
[[ -f $prefix/include/conflux/version.h ]] || fail "generated conflux/version.h not installed"
[[ -f $libdir/pkgconfig/conflux.pc ]] || fail "conflux.pc not installed"
[[ -f $libdir/cmake/conflux/conflux-config.cmake ]] || fail "CMake package not installed"

# ---- SONAME -----------------------------------------------------------------
soname=$(readelf -d "$libdir/libconflux.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[[ $soname == libconflux.so.0 ]] || fail "SONAME is '$soname', expected libconflux.so.0"
[[ -e $libdir/libconflux.so.0 ]] || fail "$libdir/libconflux.so.0 missing"
step "SONAME $soname"

# ---- exported symbols: the public API only ------------------------------------
leaked=$(nm -D --defined-only "$libdir/libconflux.so" | awk '$2 ~ /^[TDBRVW]$/ {print $3}' |
    grep -v '^cfx_[a-z0-9]' | grep -v '^_init$\|^_fini$' || true)
[[ -z $leaked ]] || fail "libconflux.so exports non-API symbols: $(echo "$leaked" | tr "\n" " " | head -c 400)"
internal=$(nm -D --defined-only "$libdir/libconflux.so" | awk '{print $3}' | grep '^cfx__' || true)
[[ -z $internal ]] || fail "libconflux.so exports internal symbols: $(echo "$internal" | tr "\n" " " | head -c 400)"

# A sanitizer build of the library (CFX_SANITIZE=ON) needs its users built
# with the same runtime.
san_flags=()
if readelf -d "$libdir/libconflux.so" | grep -q 'NEEDED.*\[libasan'; then
    san_flags=("-fsanitize=address,undefined")
    step "sanitizer build: building the example with ${san_flags[*]}"
fi

# ---- each public header compiles alone (C11, warnings as errors) ---------------
for h in "$prefix"/include/conflux/*.h; do
    printf '#include <conflux/%s>\nint main(void) { return 0; }\n' "$(basename "$h")" >"$tmp/hdr.c"
    cc -std=c11 -Wall -Wextra -Werror -pedantic -fsyntax-only -I"$prefix/include" "$tmp/hdr.c" ||
        fail "installed header conflux/$(basename "$h") does not compile on its own"
done

# ---- 1. CMake: find_package(conflux) -> conflux::conflux --------------------------
step "building the example with find_package(conflux)"
cmake -S "$example" -B "$tmp/cmake-build" -DCMAKE_PREFIX_PATH="$prefix" \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_FLAGS="${san_flags[*]}" >"$tmp/cmake.log" 2>&1 ||
    { cat "$tmp/cmake.log" >&2; fail "configuring the example with find_package(conflux)"; }
cmake --build "$tmp/cmake-build" >>"$tmp/cmake.log" 2>&1 ||
    { cat "$tmp/cmake.log" >&2; fail "building the example with conflux::conflux"; }
LD_LIBRARY_PATH=$libdir "$tmp/cmake-build/example" ||
    fail "the example built with CMake exited with status $?"
# The README's put/get example: three ranks under the installed cfx_run.
step "running the README's put/get example under cfx_run -n 3"
LD_LIBRARY_PATH=$libdir "$prefix/bin/cfx_run" -n 3 --transport tcp --timeout 120 \
    "$tmp/cmake-build/put_get" || fail "the README's put/get example exited with status $?"

# ---- 2. pkg-config -----------------------------------------------------------------
step "building the example with pkg-config"
export PKG_CONFIG_PATH=$libdir/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
pc_flags=$(pkg-config --cflags --libs conflux) || fail "pkg-config does not find conflux"
# `cmake --install --prefix P` must give a conflux.pc that points into P.
pc_inc=$(pkg-config --variable=includedir conflux)
[[ $(realpath -m "$pc_inc") == $(realpath -m "$prefix/include") ]] ||
    fail "conflux.pc installed under $prefix says includedir=$pc_inc;" \
        "the .pc file should locate the prefix from \${pcfiledir} so that it is relocatable"
# shellcheck disable=SC2086 # the flags are meant to be split
cc -std=c11 -Wall -Wextra -Werror "${san_flags[@]}" -o "$tmp/example-pc" "$example/example.c" \
    $pc_flags ||
    fail "building the example with: cc \$(pkg-config --cflags --libs conflux)"
# shellcheck disable=SC2086 # the flags are meant to be split
cc -std=c11 -Wall -Wextra -Werror "${san_flags[@]}" -o "$tmp/put_get-pc" "$example/put_get.c" \
    $pc_flags ||
    fail "building the README's put/get example with: cc \$(pkg-config --cflags --libs conflux)"
# The binary must resolve the library through its SONAME.
readelf -d "$tmp/example-pc" | grep -q 'NEEDED.*\[libconflux.so.0\]' ||
    fail "the pkg-config build does not depend on libconflux.so.0"
LD_LIBRARY_PATH=$libdir "$tmp/example-pc" || fail "the example built with pkg-config exited with status $?"

# ---- 3. pkg-config --static: libconflux.a and everything it needs --------------------
step "building the example statically with pkg-config --static"
pc_static=$(pkg-config --static --libs conflux) || fail "pkg-config --static --libs conflux"
# -lconflux would pick the shared library: name the archive instead.
pc_static_flags=()
for f in $pc_static; do
    if [[ $f == -lconflux ]]; then
        pc_static_flags+=("$libdir/libconflux.a")
    else
        pc_static_flags+=("$f")
    fi
done
[[ -f $libdir/libconflux.a ]] || fail "libconflux.a not installed"
# shellcheck disable=SC2046 # the flags are meant to be split
cc -std=c11 -Wall -Wextra -Werror "${san_flags[@]}" -o "$tmp/example-pc-static" \
    "$example/example.c" $(pkg-config --cflags conflux) "${pc_static_flags[@]}" \
    >"$tmp/pc-static.log" 2>&1 ||
    { head -c 4000 "$tmp/pc-static.log" >&2
      fail "linking the example statically with: cc \$(pkg-config --static --libs conflux)" \
          "($(grep -c 'undefined reference' "$tmp/pc-static.log") undefined references)"; }
if readelf -d "$tmp/example-pc-static" | grep -q 'NEEDED.*\[libconflux'; then
    fail "the static pkg-config build still depends on a shared libconflux"
fi
"$tmp/example-pc-static" || fail "the example linked with pkg-config --static exited with status $?"

# ---- 4. CMake: conflux::conflux_static ------------------------------------------------
step "building the example with conflux::conflux_static"
cmake -S "$example" -B "$tmp/cmake-static" -DCMAKE_PREFIX_PATH="$prefix" -DEXAMPLE_STATIC=ON \
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_FLAGS="${san_flags[*]}" >"$tmp/cmake-static.log" 2>&1 ||
    { cat "$tmp/cmake-static.log" >&2; fail "configuring the example with conflux::conflux_static"; }
cmake --build "$tmp/cmake-static" >>"$tmp/cmake-static.log" 2>&1 ||
    { head -c 4000 "$tmp/cmake-static.log" >&2; fail "building the example with conflux::conflux_static"; }
"$tmp/cmake-static/example" || fail "the example linked with conflux::conflux_static exited with status $?"

# ---- the package files name no library by an absolute path of this machine ---------
# (the build machine's CUDA or rdma-core location is not the user's)
bad=$(grep -n -E '(^|[";[:space:]])/[^";[:space:]]*\.(a|so)([";[:space:]]|$)' \
    "$libdir"/cmake/conflux/*.cmake || true)
[[ -z $bad ]] || fail "the installed CMake package names libraries by absolute path: $bad"

step "OK"
