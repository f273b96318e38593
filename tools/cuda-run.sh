#!/usr/bin/env bash
# Build pagekv for CUDA alone (no Vulkan, no server, no media libraries: what a
# bare GPU machine with the CUDA toolkit and CMake has) and run what needs a GPU:
# `pagekv check` on every CUDA device, the CUDA tests, and demo on cuda:0.
#   tools/cuda-run.sh [BUILD_DIR] [OUT_DIR]
# Logs go to OUT_DIR (default BUILD_DIR/cuda-run); the exit status is the number of
# steps that failed. CUDA_ARCH (default 90, Hopper) picks the SASS to build;
# T_CHECK, T_DEMO, T_TEST bound those steps' seconds.
set -u
B=${1:-build-cuda}
O=${2:-$B/cuda-run}
mkdir -p "$O"
fails=0
step() { # name, timeout, command...
    local name=$1 t=$2
    shift 2
    local t0=$SECONDS
    timeout "$t" "$@" >"$O/$name.log" 2>&1
    local rc=$?
    echo "== $name: rc $rc, $((SECONDS - t0)) s"
    tail -n 25 "$O/$name.log"
    [ $rc -eq 0 ] || fails=$((fails + 1))
}
nvidia-smi -L || true
step configure 120 cmake -S . -B "$B" -DCMAKE_BUILD_TYPE=Release -DPKV_VULKAN=OFF -DPKV_CUDA=ON \
    -DPKV_MEDIA_LIBS=OFF -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90}"
step build 420 cmake --build "$B" -j"$(nproc)" --target pagekv-cli test-cuda test-multi-cuda test-kv-random-cuda \
    test-cuda-plan
P="$B/bin/pagekv"
step devices 60 "$P" devices
step check-cuda0 ${T_CHECK:-120} "$P" check --device cuda:0
step demo-cuda0 ${T_DEMO:-120} "$P" demo --device cuda:0
step test-cuda-plan 60 "$B/bin/test-cuda-plan"
step test-cuda ${T_TEST:-240} "$B/bin/test-cuda"
step test-kv-random-cuda ${T_TEST:-240} "$B/bin/test-kv-random-cuda"
step test-multi-cuda ${T_TEST:-240} "$B/bin/test-multi-cuda"
echo "cuda-run: $fails step(s) failed"
exit $fails
