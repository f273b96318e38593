#!/usr/bin/env bash
# Install what pagekv needs to build on Debian/Ubuntu, when we may (root or
# passwordless sudo); otherwise print the command and say what is missing.
#   required: cmake (>= 3.25), make, a C11 compiler (gcc), pkgconf (install test)
#   optional: libvulkan-dev + glslc (Vulkan backend), mesa-vulkan-drivers
#             (lavapipe: a CPU Vulkan driver, so Vulkan tests run without a GPU)
#             vulkan-validationlayers (the Khronos validation layer: the tests
#             and pagekv check run Vulkan under it and fail on any message)
#             libmicrohttpd-dev (HTTP) + libjansson-dev (JSON): pagekv serve
#             curl, nodejs, npm: the server tests (curl; the official openai npm client)
#             tmux: test-run-chat (pagekv run -cnv at a terminal)
#             libsndfile1-dev (WAV, FLAC audio), libvorbis-dev (Ogg/Vorbis), libsoxr-dev (resampling),
#             libspng-dev (PNG), libjpeg62-turbo-dev (JPEG): media decoding
#             (without one, that format is refused with an error naming it)
#             libhiredis-dev + redis-server: the Redis KV tier (serve --kv-remote)
#             and its tests, which start their own redis-server on loopback
#             libopenmpi-dev + openmpi-bin: a model split over MPI ranks (mpirun)
#             chromium: test-server-web (the web page, headless, via playwright-core)
#             python3-pytest, python3-numpy, python3-pip: the Python
#             bindings' tests (python/tests)
#             g++ where the CUDA toolkit is installed (nvcc's host compiler)
#   for `make fuzz` only (`scripts/deps.sh fuzz`): clang (>= 14) and
#             libclang-rt-14-dev (libFuzzer and the sanitizer runtimes)
#   for `make test-arm` only (`scripts/deps.sh arm`): gcc-aarch64-linux-gnu (the
#             cross compiler, with the arm64 C library it links) and qemu-user
#             (qemu-aarch64, which runs the arm64 test binaries here)
set -u
pkgs=(cmake make gcc libc6-dev pkgconf libvulkan-dev glslc mesa-vulkan-drivers vulkan-validationlayers)
if [ -x /usr/local/cuda/bin/nvcc ] || command -v nvcc >/dev/null 2>&1; then pkgs+=(g++); fi
pkgs+=(libmicrohttpd-dev libjansson-dev curl nodejs npm tmux)
pkgs+=(libhiredis-dev redis-server libopenmpi-dev openmpi-bin)
pkgs+=(libsndfile1-dev libvorbis-dev libsoxr-dev libspng-dev)
# libjpeg-turbo's development package is named differently on Ubuntu
if apt-cache show libjpeg62-turbo-dev >/dev/null 2>&1; then pkgs+=(libjpeg62-turbo-dev); else pkgs+=(libjpeg-turbo8-dev); fi
# chromium: test-server-web drives it headless; Debian has the package, Ubuntu
# only a snap (no apt package of that name: then the test is skipped)
if apt-cache show chromium >/dev/null 2>&1; then pkgs+=(chromium); fi
pkgs+=(python3-pytest python3-numpy python3-pip)
if [ "${1:-}" = fuzz ]; then pkgs+=(clang libclang-rt-14-dev); fi
# libc6-dev-arm64-cross is only recommended by the cross compiler, and installs
# here skip recommends: without it the cross build cannot link (no crt1.o)
if [ "${1:-}" = arm ]; then pkgs+=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user); fi
missing=()
for p in "${pkgs[@]}"; do
  # node and npm may come from elsewhere (nodesource bundles npm and conflicts with Debian's)
  case "$p" in nodejs) command -v node >/dev/null 2>&1 && continue ;; npm) command -v npm >/dev/null 2>&1 && continue ;; esac
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then exit 0; fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "pagekv: not a Debian/Ubuntu machine; please install: ${missing[*]}" >&2
  command -v cmake >/dev/null && command -v cc >/dev/null && exit 0
  exit 1
fi
if [ "$(id -u)" -eq 0 ]; then SUDO=""
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then SUDO="sudo"
else
  echo "pagekv: missing packages: ${missing[*]}" >&2
  echo "pagekv: install them with: sudo apt-get install -y ${missing[*]}" >&2
  command -v cmake >/dev/null && command -v cc >/dev/null && { echo "pagekv: building without them" >&2; exit 0; }
  exit 1
fi
echo "pagekv: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
