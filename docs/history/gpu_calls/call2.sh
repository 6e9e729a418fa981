#!/usr/bin/env bash
# Issue 20's larger routing model on the GPU machine (prepared in the tenth session): about 10 min.
set -uo pipefail
cd "$(dirname "$0")/../.."
tar xJf .carry/bins.txz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib
TRAIN_SECONDS=${TRAIN_SECONDS:-240} bash tools/routing_model/gpu_call.sh .carry/bin $OUT
