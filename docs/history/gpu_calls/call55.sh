#!/usr/bin/env bash
# Twenty-sixth session, second call: the side by side (../shared/peer, 12 layers) with main's
# binaries, then the 48-layer roofline (`sluice synth --like qwen3-30b-a3b --kinds q4`, 19 GB;
# bench_cuda --prefill 512 --decode 128, batch 1 / 8 / 32) in the time left. About 9 minutes.
# Carry .carry/bins.txz (sluice, bench_cuda, sluice_gpu_tests, no PTX) and .carry/peer.
set -uo pipefail
cd "$(dirname "$0")/../.."
source bench/gpu_calls/common.sh
LIMIT=${LIMIT:-585}
left() { echo $(( LIMIT - $(elapsed) )); }
OUT=$OUT/sbs bash .carry/peer/side_by_side.sh .carry/bin 12
echo "side by side done at $(elapsed) s"
rm -rf /tmp/sbs
if [ $(left) -gt 150 ]; then
  timeout 150 .carry/bin/sluice synth --like qwen3-30b-a3b --kinds q4 /tmp/q48 --force -q > $OUT/synth48.log 2>&1 || tail -3 $OUT/synth48.log
  echo "synth 48 at $(elapsed) s: $(du -sh /tmp/q48 | cut -f1)"
  timeout $(( $(left) - 5 )) .carry/bin/bench_cuda --model /tmp/q48 --prefill 512 --decode 128 --reps 2 --batch 1,8,32 2>&1 | tee $OUT/bench48.log | tail -24
fi
echo "total $(elapsed) s"
