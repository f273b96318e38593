#!/usr/bin/env bash
# pagekv as a library used by another project: `cmake --install` into a scratch
# prefix, then build outside programs against it three ways:
#   1. the README's C API block, with pkg-config (shared library), run on a model;
#   2. a CMake project with find_package(pagekv) (static library), run;
#   3. a parent project that add_subdirectory()s pagekv: pagekv's tests must not
#      join the parent's ctest.
# usage: install-check.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/pkv-install.XXXXXX")
trap '[ -n "${PKV_KEEP:-}" ] || rm -rf "$work"' EXIT
fail() { echo "install-check: FAIL: $*" >&2; exit 1; }

cmake --install "$build" --prefix "$work/prefix" >"$work/install.log" || { cat "$work/install.log"; fail "cmake --install"; }
libdir=$(dirname "$(find "$work/prefix" -name libpagekv.a | head -1)")
for f in include/pagekv.h bin/pagekv; do [ -e "$work/prefix/$f" ] || fail "$f not installed"; done
for f in libpagekv.a libpagekv.so pkgconfig/pagekv.pc cmake/pagekv/pagekvConfig.cmake; do
  [ -e "$libdir/$f" ] || fail "$libdir/$f not installed"
done
export PKG_CONFIG_PATH="$libdir/pkgconfig"
[ "$(pkg-config --modversion pagekv)" = "$("$work/prefix/bin/pagekv" --version | cut -d' ' -f2)" ] ||
  fail "pkg-config version differs from pagekv --version"

# the Python package, installed next to the library: importable from the prefix's
# site folder, and loading the installed libpagekv.so (not the build's)
pyinit=$(find "$work/prefix" -path '*/pagekv/__init__.py' | head -1)
[ -n "$pyinit" ] || fail "the Python package (python/pagekv) was not installed"
py=""
for cand in /usr/bin/python3 python3; do command -v "$cand" >/dev/null 2>&1 && { py=$cand; break; }; done
if [ -n "$py" ]; then
  got=$(cd "$work" && env -u PAGEKV_LIBRARY -u LD_LIBRARY_PATH PYTHONPATH="$(dirname "$(dirname "$pyinit")")" \
        "$py" -c 'import pagekv; print(pagekv.library_path); print(pagekv.version())') ||
    fail "the installed Python package does not import"
  [ "$(realpath "$(echo "$got" | head -1)")" = "$(realpath "$libdir/libpagekv.so")" ] ||
    fail "the installed Python package loads $(echo "$got" | head -1), not $libdir/libpagekv.so"
  echo "install-check: python package in $(dirname "$(dirname "$pyinit")") loads the installed library"
else
  echo "install-check: no python3: the installed Python package is not imported"
fi

# 1. the README's block, compiled as shown
awk '/^## The C API/{on=1} on && /^```c$/{grab=1; next} grab && /^```$/{exit} grab{print}' "$src/README.md" >"$work/readme.c"
[ -s "$work/readme.c" ] || fail "no C block under '## The C API' in README.md"
cc -std=c11 -Wall -Wextra -Werror $(pkg-config --cflags pagekv) "$work/readme.c" -o "$work/readme" \
  $(pkg-config --libs pagekv) || fail "the README's C API block does not compile"
"$work/prefix/bin/pagekv" mkmodel -o "$work/m.gguf" 2>/dev/null
# run as a user would: no LD_LIBRARY_PATH (pagekv.pc's rpath finds the library)
env -u LD_LIBRARY_PATH "$work/readme" "$work/m.gguf" >"$work/readme.out" || { cat "$work/readme.out"; fail "README program failed (run without LD_LIBRARY_PATH)"; }
tail -1 "$work/readme.out" | grep -qx ok || fail "README program did not print ok"
[ "$(wc -l <"$work/readme.out")" -ge 2 ] || fail "README program generated nothing"
# (ldd into a file: grep -q closing the pipe early would fail the pipeline under pipefail)
env -u LD_LIBRARY_PATH ldd "$work/readme" >"$work/ldd.txt"
got=$(awk '/libpagekv\.so/ {print $3}' "$work/ldd.txt")
[ -n "$got" ] && [ "$(realpath "$got")" = "$(realpath "$libdir/libpagekv.so")" ] ||
  { cat "$work/ldd.txt"; fail "README program is not linked to the installed shared library"; }

# 2. find_package(pagekv) with the static library
mkdir -p "$work/cm"
cat >"$work/cm/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.25)
project(consumer C)
find_package(pagekv 0.3 REQUIRED)
add_executable(consumer main.c)
target_link_libraries(consumer PRIVATE pagekv::pagekv)
CM
cat >"$work/cm/main.c" <<'C'
#include <stdio.h>
#include <string.h>
#include "pagekv.h"
int main(void) {
    pkv_model_params p = pkv_model_default_params();
    p.n_threads = 1;
    pkv_model *m = pkv_model_builtin(p);
    if (!m) return 1;
    pkv_model_info info;
    if (pkv_model_get_info(m, &info)) return 1;
    printf("%s %s %d\n", pkv_version(), info.arch, info.n_layer);
    pkv_model_free(m);
    return 0;
}
C
cmake -S "$work/cm" -B "$work/cm/build" -DCMAKE_PREFIX_PATH="$work/prefix" >"$work/cm.log" 2>&1 || { cat "$work/cm.log"; fail "find_package(pagekv)"; }
cmake --build "$work/cm/build" >>"$work/cm.log" 2>&1 || { cat "$work/cm.log"; fail "building against pagekv::pagekv"; }
out=$("$work/cm/build/consumer")
[ "$out" = "$(pkg-config --modversion pagekv) llama 2" ] || fail "consumer printed '$out'"
ldd "$work/cm/build/consumer" >"$work/ldd2.txt"
grep -q libpagekv "$work/ldd2.txt" && fail "consumer should link the static library"

# 3. add_subdirectory: the parent's ctest holds only the parent's test
mkdir -p "$work/parent"
cat >"$work/parent/CMakeLists.txt" <<CM
cmake_minimum_required(VERSION 3.25)
project(parent C)
enable_testing()
add_subdirectory("$src" pagekv)
add_test(NAME parent-only COMMAND true)
CM
cmake -S "$work/parent" -B "$work/parent/build" -DPKV_VULKAN=OFF >"$work/parent.log" 2>&1 || { cat "$work/parent.log"; fail "add_subdirectory(pagekv)"; }
n=$(cd "$work/parent/build" && ctest -N | sed -n 's/^Total Tests: //p')
[ "$n" = 1 ] || fail "the parent's ctest lists $n tests (pagekv's tests joined it)"
echo "install-check: all good (install layout, README block via pkg-config, find_package, add_subdirectory)"
