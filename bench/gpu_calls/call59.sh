#!/usr/bin/env bash
# Twenty-seventh session, second call: every GPU test with SLUICE_CUDA_MOE_BULK removed, then
# the side by side (../shared/peer, 12 layers) with main's binaries, then the 48-layer roofline
# in the time left (as call55). About 8 minutes. Carry .carry/bins.txz (no PTX) and .carry/peer.
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -x .carry/bin/bench_cuda ] || tar xJf .carry/bins.txz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib SLUICE_SOURCE_DIR=$PWD
T0=$(date +%s)
LIMIT=${LIMIT:-585}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
timeout 240 .carry/bin/sluice_gpu_tests --gtest_color=no > $OUT/gpu-tests.log 2>&1
echo "GPU tests rc $? at $(( $(date +%s)-T0 )) s: passed $(grep -c '^\[       OK' $OUT/gpu-tests.log), failed $(grep -cE '^\[  FAILED  \] .*\([0-9]+ ms\)$' $OUT/gpu-tests.log), of $(grep -o 'Running [0-9]* tests' $OUT/gpu-tests.log)"
grep -E "^\[  FAILED|Failure|Expected|Which is" $OUT/gpu-tests.log | sed 's/ ([0-9]* ms)//' | sort | uniq -c | sort -rn | head -12
OUT=$OUT/sbs bash .carry/peer/side_by_side.sh .carry/bin 12
echo "side by side done at $(( $(date +%s)-T0 )) s"
rm -rf /tmp/sbs
if [ $(left) -gt 150 ]; then
  timeout 150 .carry/bin/sluice synth --like qwen3-30b-a3b --kinds q4 /tmp/q48 --force -q > $OUT/synth48.log 2>&1 || tail -3 $OUT/synth48.log
  echo "synth 48 at $(( $(date +%s)-T0 )) s: $(du -sh /tmp/q48 | cut -f1)"
  timeout $(( $(left) - 5 )) .carry/bin/bench_cuda --model /tmp/q48 --prefill 512 --decode 128 --reps 2 --batch 1,8,32 2>&1 | tee $OUT/bench48.log | tail -24
fi
echo "total $(( $(date +%s)-T0 )) s"
