#!/usr/bin/env bash
# For the session after the twenty-first (the branch hits-on-device, built and not yet run on a
# GPU): a layer of hits taken on the device from the host's slot map (SLUICE_CUDA_HITS_ON_DEVICE,
# docs/streamed-step.md step 4). 1) the new test and every streaming and MoE test; 2) on the
# 12-layer qwen3-30b-a3b q4 synthetic, the host-RAM row (10% device cache + preloaded host
# tier, 128 greedy tokens), hits on the device off / on, interleaved, with the stats, then
# timed (the phase-1 wait should fall on ~60% of the layers); 3) the same at 110% (every layer
# hits). About 3 minutes. Carry .carry/bins.txz (sluice, sluice_gpu_tests).
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -x .carry/bin/sluice ] || tar xJf .carry/bins.txz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib SLUICE_SOURCE_DIR=$PWD
T0=$(date +%s); LIMIT=${LIMIT:-240}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 150 .carry/bin/sluice_gpu_tests --gtest_color=no \
  --gtest_filter='CudaStreaming.HitsOnDeviceSameBits:CudaStreaming.*:CudaMoe.*' > $OUT/test.log 2>&1
echo "tests: rc $? at $(( $(date +%s)-T0 )) s"; grep -E "^\[  (PASSED|FAILED) |Failure|tests ran" $OUT/test.log | head -20
P=/tmp/q12
timeout 30 .carry/bin/sluice synth --like qwen3-30b-a3b --kinds q4 --layers 12 $P --force -q > /dev/null 2>&1
c10=$(( $(stat -c %s $P/experts.q4.bin) / 10 )); c110=$(( $(stat -c %s $P/experts.q4.bin) * 11 / 10 ))
run() { local h=$1 c=$2 t=$3
  SLUICE_CUDA_HITS_ON_DEVICE=$h SLUICE_CUDA_HANDSHAKE_TIMES=$t timeout 20 .carry/bin/sluice run --model $P --backend cuda \
    --ignore-eos --temperature 0 -n 128 --tokens 1 --expert-cache $c --host-cache 16G --host-cache-preload \
    --stats $OUT/h$h.$c.$t.json > /dev/null 2> $OUT/h$h.$c.$t.log
  python3 - "$h" "$c" "$t" "$OUT/h$h.$c.$t.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[4]))["run"]; d = r["phases"]["decode"]
s = max(d["steps"], 1)
print(f"| {sys.argv[1]} | {sys.argv[2]} | {sys.argv[3]} | {r['decode_tokens_per_second']:.1f} | {d['hit_rate']:.3f} | "
      f"{d['misses']/s:.3f} | {d['service_wall_seconds']/s*1e6:.2f} |")
PY
  [ $t = 1 ] && grep -E "^\| (all|5) \| phase" $OUT/h$h.$c.$t.log; }
echo "| hits on device | cache bytes | timeline | decode tok/s | hit rate | misses a layer step | service wall us a step |"
echo "|---|---|---|---|---|---|---|"
for r in 1 2 3; do
  for h in 0 1; do [ $(left) -gt 40 ] || break 2; run $h $c10 0; done
done
for h in 0 1; do [ $(left) -gt 25 ] && run $h $c10 1; done
for h in 0 1; do [ $(left) -gt 12 ] && run $h $c110 0; done
echo "total $(( $(date +%s)-T0 )) s"
