#!/usr/bin/env bash
# build.sh SRC BUILD [cmake args...]: configures and builds a llama.cpp-family checkout (the
# peer engine of the side by side, e.g. ik_llama.cpp) with CUDA for sm_90, static libraries,
# only the targets the side by side runs (llama-bench, llama-quantize).
#   env: JOBS (default: nproc), CUDA_ARCH (default 90), PEER_TARGETS (default
#        "llama-bench llama-quantize"), PEER_CUDA=OFF for a CPU-only build.
set -euo pipefail
SRC=$(realpath "$1"); BUILD=$2; shift 2
JOBS=${JOBS:-$(nproc)}
PEER_CUDA=${PEER_CUDA:-ON}
if [ "$PEER_CUDA" = ON ] && ! command -v nvcc >/dev/null; then
  for d in /usr/local/cuda/bin /usr/local/cuda-13.0/bin; do [ -x $d/nvcc ] && export PATH=$d:$PATH && break; done
fi
mkdir -p "$BUILD"
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
configure() {
  cmake -S "$SRC" -B "$BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DGGML_CUDA=$PEER_CUDA -DCMAKE_CUDA_ARCHITECTURES=${CUDA_ARCH:-90} -DGGML_NATIVE=ON \
    -DGGML_CUDA_FA_ALL_QUANTS=OFF -DGGML_CCACHE=OFF -DGGML_RPC=OFF -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_EXAMPLES=ON "$@" 2>&1 | tee "$BUILD/configure.log"
  return "${PIPESTATUS[0]}"
}
# CMake before 3.26 gives nvcc no C++20 dialect; the peer's CUDA code builds as C++17.
configure "$@" || { grep -q 'dialect "CUDA20"' "$BUILD/configure.log" && configure -DCMAKE_CUDA_STANDARD=17 "$@"; }
cmake --build "$BUILD" --target ${PEER_TARGETS:-llama-bench llama-quantize} -j "$JOBS"
