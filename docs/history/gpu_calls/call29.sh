#!/usr/bin/env bash
# Twenty-first session: the phase handshake reading its list in one wave of host reads (the
# header, the first 32 descriptors, the pairs' entries of both tables: one PCIe round trip
# instead of two), the markov policy's cheaper victim search (call27), and (second run) a
# layer of hits publishing its tables before the plan (SLUICE_CUDA_EARLY_HITS). 1) the
# streaming and MoE GPU tests on C; 2) on the 12-layer qwen3-30b-a3b q4 synthetic, the
# host-RAM row (10% device cache + preloaded host tier, 128 greedy tokens), interleaved A =
# main (762c4c4), D = C with SLUICE_CUDA_EARLY_HITS=0, C = the change, with the stats; then
# the handshake timeline of each. About 4 minutes. (Its first run had the one-wave read
# alone, in a version whose thread 0 used the header before its other loads: A and C only.)
# Carry .carry/bins-c.txz (sluice, sluice_gpu_tests) and .carry/bins-main.txz (sluice).
set -uo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .carry/A .carry/C
tar xJf .carry/bins-main.txz -C .carry/A && tar xJf .carry/bins-c.txz -C .carry/C
export SLUICE_SOURCE_DIR=$PWD
T0=$(date +%s); LIMIT=${LIMIT:-290}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name --format=csv,noheader
LD_LIBRARY_PATH=$PWD/.carry/C/lib timeout 120 .carry/C/bin/sluice_gpu_tests --gtest_color=no \
  --gtest_filter='CudaStreaming.*:CudaMoe.*' > $OUT/test.log 2>&1
echo "tests: rc $? at $(( $(date +%s)-T0 )) s"; grep -E "^\[  (PASSED|FAILED) |Failure|tests ran" $OUT/test.log | head
P=/tmp/q12
LD_LIBRARY_PATH=$PWD/.carry/C/lib timeout 30 .carry/C/bin/sluice synth --like qwen3-30b-a3b --kinds q4 --layers 12 $P --force -q > /dev/null 2>&1
c10=$(( $(stat -c %s $P/experts.q4.bin) / 10 ))
run() { local v=$1 t=$2 b=$1 early=1
  [ $v = D ] && { b=C; early=0; }
  LD_LIBRARY_PATH=$PWD/.carry/$b/lib SLUICE_CUDA_EARLY_HITS=$early SLUICE_CUDA_HANDSHAKE_TIMES=$t timeout 20 .carry/$b/bin/sluice run --model $P \
    --backend cuda --ignore-eos --temperature 0 -n 128 --tokens 1 --expert-cache $c10 --host-cache 16G --host-cache-preload \
    --stats $OUT/$v.$t.json > /dev/null 2> $OUT/$v.$t.log
  python3 - "$v" "$t" "$OUT/$v.$t.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[3]))["run"]; d = r["phases"]["decode"]
s = max(d["steps"], 1)
print(f"| {sys.argv[1]} | {sys.argv[2]} | {r['decode_tokens_per_second']:.1f} | {d['hit_rate']:.3f} | {d['misses']/s:.3f} | "
      f"{d['service_wall_seconds']/s*1e6:.2f} | {d['service_cpu_seconds']/s*1e6:.2f} |")
PY
  [ $t = 1 ] && grep -E "^\| (all|0|5) " $OUT/$v.$t.log; }
echo "| binary | timeline | decode tok/s | hit rate | misses a layer step | service wall us a step | service CPU us a step |"
echo "|---|---|---|---|---|---|---|"
for r in 1 2 3; do
  for v in A D C; do [ $(left) -gt 30 ] || break 2; run $v 0; done
done
for v in A D C; do [ $(left) -gt 12 ] && run $v 1; done
echo "total $(( $(date +%s)-T0 )) s"
