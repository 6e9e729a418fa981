#!/usr/bin/env bash
# pack-binaries.sh [BIN ...]: for a GPU machine without the build's toolchain or Debian's
# libraries: strips the named binaries of build/bin (default: sluice, sluice_gpu_tests,
# bench_cuda) and packs them with the shared libraries such a machine (Ubuntu 24.04 with the
# CUDA driver) lacks into one archive, .carry/bins.txz (git-ignored; xz -9e with a 256 MiB
# dictionary: about 10 MB for the default three, where gzip makes 27 MB).
# There: tar xJf .carry/bins.txz -C .carry and LD_LIBRARY_PATH=$PWD/.carry/lib.
set -euo pipefail
cd "$(dirname "$0")/../.."
# CARRY_FROM=DIR takes them from DIR/bin instead: a build configured with
# -DSLUICE_CUDA_ARCHITECTURES=90-real (no PTX) is a third the size, so the binaries and the
# peer's source fit a 64 MiB transfer together.
from=${CARRY_FROM:-build}
bins=("$@")
[ ${#bins[@]} -gt 0 ] || bins=(sluice sluice_gpu_tests bench_cuda)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib" .carry
for b in "${bins[@]}"; do strip -o "$stage/bin/$b" "$from/bin/$b"; done
# The shared libraries beyond Ubuntu 24.04 base.
for lib in libpcre2-8.so.0 libutf8proc.so.2 liburing.so.2 libxxhash.so.0; do
  [ -e "/lib/x86_64-linux-gnu/$lib" ] && cp -L "/lib/x86_64-linux-gnu/$lib" "$stage/lib/"
done
rm -f .carry/bins.tgz  # the old name: it would travel too if carried by folder
# A dictionary larger than one binary: the binaries share their ~65 MB of device code, which
# a 64 MiB window (xz -9e's) cannot see twice (18 MB instead of 10).
XZ_OPT="--lzma2=preset=9e,dict=256MiB -T1" tar cJf .carry/bins.txz -C "$stage" bin lib
du -h .carry/bins.txz
