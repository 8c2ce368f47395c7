#!/bin/sh
# install_check.sh — installs a built tree into a scratch prefix and builds a small consumer
# program against the installed library the two ways users do: pkg-config, and CMake's
# find_package(ferry CONFIG). Runs both, and checks the shared library's versioned soname, that it
# exports only ferry_* symbols, and that the installed header compiles on its own.
#
#   install_check.sh BUILD_DIR WORK_DIR [CC] [CMAKE] [SANITIZE]
#
# SANITIZE is the build's FERRY_SANITIZE ("address,undefined", "thread" or empty): an instrumented
# library needs an instrumented consumer. Exit status 0 when every check passes.
set -eu

build=$1
work=$2
cc=${3:-cc}
cmake=${4:-cmake}
san=${5:-}

fail() {
    echo "install_check: FAIL: $*" >&2
    exit 1
}

rm -rf "$work"
mkdir -p "$work"
prefix=$work/prefix
"$cmake" --install "$build" --prefix "$prefix" >"$work/install.log" 2>&1 ||
    { cat "$work/install.log" >&2; fail "cmake --install $build --prefix $prefix"; }

# ---- what was installed --------------------------------------------------------------------
[ -f "$prefix/include/ferry.h" ] || fail "no include/ferry.h under $prefix"
[ -f "$prefix/include/ferry_device.h" ] || fail "no include/ferry_device.h under $prefix"
[ -x "$prefix/bin/ferry" ] || fail "no bin/ferry under $prefix"
# the library directory is the one holding libferry.a (the Python package keeps a copy of
# libferry.so.0 of its own, under lib/python3*/)
static=$(find "$prefix" -name 'libferry.a' | head -n 1)
[ -n "$static" ] || fail "no libferry.a under $prefix"
libdir=$(dirname "$static")
so=$libdir/libferry.so.0
[ -f "$so" ] || fail "no libferry.so.0 beside $static (the shared library needs a versioned soname)"
[ -L "$libdir/libferry.so" ] || fail "$libdir/libferry.so is not a link to the versioned library"
[ -f "$libdir/pkgconfig/ferry.pc" ] || fail "no $libdir/pkgconfig/ferry.pc"
[ -f "$libdir/cmake/ferry/ferryConfig.cmake" ] || fail "no $libdir/cmake/ferry/ferryConfig.cmake"
soname=$(readelf -d "$libdir/libferry.so" | sed -n 's/.*Library soname: \[\(.*\)\].*/\1/p')
[ "$soname" = "libferry.so.0" ] || fail "soname is '$soname', expected libferry.so.0"

# Only the public API leaves the shared library: internal ferry__ functions stay hidden.
leaked=$(nm -D --defined-only "$libdir/libferry.so" | awk '$2 ~ /^[TDBRVW]$/ {print $3}' |
    grep -v '^ferry_' | grep -v '^_' | head -n 5 || true)
[ -z "$leaked" ] || fail "libferry.so exports non-API symbols: $leaked"
internal=$(nm -D --defined-only "$libdir/libferry.so" | awk '{print $3}' | grep '^ferry__' |
    head -n 5 || true)
[ -z "$internal" ] || fail "libferry.so exports internal symbols: $internal"

# ---- the consumer --------------------------------------------------------------------------
flags=""
if [ -n "$san" ]; then
    flags="-fsanitize=$san -fno-omit-frame-pointer"
fi
cat >"$work/consumer.c" <<'EOF'
#include <ferry.h>
#include <stdio.h>
#include <string.h>
int main(void) {
    ferry *f = ferry_create(NULL);
    int id = -1, rc = f ? ferry_add_device(f, "sim:64MiB", &id) : FERRY_ENOMEM;
    printf("ferry %s: %d devices, %s\n", ferry_version(), ferry_device_count(f),
           ferry_strerror(rc));
    ferry_destroy(f);
    return rc != 0 || id != 1 || strcmp(ferry_version(), FERRY_VERSION_STRING) != 0;
}
EOF

# The installed header alone, strictly.
"$cc" -std=c11 -Wall -Wextra -Wpedantic -Werror -fsyntax-only -I"$prefix/include" \
    "$work/consumer.c" || fail "the installed ferry.h does not compile cleanly as C11"

run() { # NAME BINARY: runs it against the installed library and checks which one it loaded
    out=$(LD_LIBRARY_PATH="$libdir" "$2") || fail "$1: the consumer failed: $out"
    echo "$1: $out"
    case $out in
    "ferry "*": 2 devices, "*) ;;
    *) fail "$1: unexpected output '$out'" ;;
    esac
    loaded=$(LD_LIBRARY_PATH="$libdir" ldd "$2" | grep 'libferry\.so' || true)
    case $loaded in
    *"$libdir/libferry.so.0"*) ;;
    *) fail "$1: does not load the installed libferry.so.0: '$loaded'" ;;
    esac
}

# 1. pkg-config (pkgconf answers to the same name).
pc=$(command -v pkg-config || command -v pkgconf || true)
if [ -n "$pc" ]; then
    pcflags=$(PKG_CONFIG_PATH="$libdir/pkgconfig" "$pc" --cflags --libs ferry) ||
        fail "pkg-config does not find ferry in $libdir/pkgconfig"
    echo "pkg-config: $pcflags"
    # shellcheck disable=SC2086
    "$cc" -std=c11 $flags "$work/consumer.c" -o "$work/consumer_pc" $pcflags ||
        fail "building with the flags pkg-config gives ($pcflags)"
    readelf -d "$work/consumer_pc" | grep -q 'NEEDED.*\[libferry\.so\.0\]' ||
        fail "consumer_pc does not record the versioned soname libferry.so.0"
    run pkg-config "$work/consumer_pc"
    # A static link with what Libs.private lists (optional dependencies such as liburing included).
    private=$(PKG_CONFIG_PATH="$libdir/pkgconfig" "$pc" --libs-only-l --static ferry |
        sed 's/-lferry//')
    # the flags as docs/guide.md writes them: -L from pkg-config, not added here
    pccflags=$(PKG_CONFIG_PATH="$libdir/pkgconfig" "$pc" --cflags --libs-only-L ferry)
    # shellcheck disable=SC2086
    "$cc" -std=c11 $flags "$work/consumer.c" -o "$work/consumer_pc_static" $pccflags \
        -Wl,-Bstatic -lferry -Wl,-Bdynamic $private ||
        fail "linking libferry.a statically with Libs.private ($private)"
    out=$("$work/consumer_pc_static") || fail "pkg-config static: the consumer failed: $out"
    echo "pkg-config static: $out"
else
    echo "pkg-config: not installed, skipped"
fi

# 2. CMake: find_package(ferry CONFIG REQUIRED) and the ferry::ferry target; also the static
#    library through ferry::ferry_static, which must carry its own link dependencies.
mkdir -p "$work/cmake-src"
cp "$work/consumer.c" "$work/cmake-src/main.c"
cat >"$work/cmake-src/CMakeLists.txt" <<'EOF'
cmake_minimum_required(VERSION 3.20)
project(ferry_consumer C)
find_package(ferry 0.1 CONFIG REQUIRED)
add_executable(x main.c)
target_link_libraries(x ferry::ferry)
add_executable(x_static main.c)
target_link_libraries(x_static ferry::ferry_static)
EOF
"$cmake" -S "$work/cmake-src" -B "$work/cmake-build" -DCMAKE_PREFIX_PATH="$prefix" \
    -DCMAKE_C_COMPILER="$cc" -DCMAKE_C_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="$flags" \
    >"$work/cmake-configure.log" 2>&1 ||
    {
        cat "$work/cmake-configure.log" >&2
        fail "configuring a project that uses find_package(ferry)"
    }
"$cmake" --build "$work/cmake-build" >"$work/cmake-build.log" 2>&1 ||
    { cat "$work/cmake-build.log" >&2; fail "building against ferry::ferry / ferry::ferry_static"; }
run cmake "$work/cmake-build/x"
out=$("$work/cmake-build/x_static") || fail "cmake static: the consumer failed: $out"
echo "cmake static: $out"
if readelf -d "$work/cmake-build/x_static" | grep -q 'NEEDED.*libferry'; then
    fail "x_static links libferry dynamically"
fi

echo "install_check: all checks passed ($prefix)"
