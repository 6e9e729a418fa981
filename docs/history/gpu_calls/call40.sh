#!/usr/bin/env bash
# Twenty-third session: one down + combine after phase 2 (SLUICE_CUDA_ONE_DOWN; the phases
# compute gate/up alone). 1) every GPU test (gpu-check), failure messages kept; 2) on the
# 12-layer qwen3-30b-a3b q4 synthetic, the host-RAM row (10% device cache + preloaded host
# tier, 128 greedy tokens) off / on interleaved, then timed (the device timeline); 3) the disk
# row off / on. About 5 minutes. Carry .carry/bins.txz (sluice, sluice_gpu_tests).
set -uo pipefail
cd "$(dirname "$0")/../.."
tar xJf .carry/bins.txz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib SLUICE_SOURCE_DIR=$PWD
T0=$(date +%s); LIMIT=${LIMIT:-560}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 300 bash scripts/gpu-check .carry/bin > $OUT/check.log 2>&1
echo "gpu-check: rc $? at $(( $(date +%s)-T0 )) s"
grep -E "FAILED|Failure|Expected|Which is|differing|GPU tests" $OUT/check.log | head -30
P=/tmp/q12
timeout 30 .carry/bin/sluice synth --like qwen3-30b-a3b --kinds q4 --layers 12 $P --force -q > /dev/null 2>&1
run() { local o=$1 tier=$2 t=$3
  local host=""; [ $tier = ram ] && host="--host-cache 16G --host-cache-preload"
  SLUICE_CUDA_ONE_DOWN=$o SLUICE_CUDA_HANDSHAKE_TIMES=$t timeout 30 .carry/bin/sluice run --model $P --backend cuda \
    --ignore-eos --temperature 0 -n 128 --tokens 1 --expert-cache $(( $(stat -c %s $P/experts.q4.bin) / 10 )) $host \
    --stats /tmp/st.json > /tmp/out.txt 2> /tmp/err.log
  python3 - "$o" "$tier" "$t" <<'PY'
import json, sys
r = json.load(open("/tmp/st.json"))["run"]; d = r["phases"]["decode"]
print(f"| {sys.argv[2]} | {sys.argv[1]} | {sys.argv[3]} | {r['decode_tokens_per_second']:.1f} | {d['hit_rate']:.3f} | {d['misses']} | {d['steps']} |")
PY
  md5sum < /tmp/out.txt | cut -c1-8 >> $OUT/md5.$tier.$o
  [ $t = 1 ] && grep -E "^\| (all|5) \| (phase|combine)" /tmp/err.log; }
echo "| tier | one down | timeline | decode tok/s | hit rate | misses | layer steps |"
echo "|---|---|---|---|---|---|---|"
for r in 1 2 3; do for o in 0 1; do [ $(left) -gt 60 ] || break 2; run $o ram 0; done; done
for o in 0 1; do [ $(left) -gt 40 ] && run $o ram 1; done
for o in 0 1; do [ $(left) -gt 20 ] && run $o disk 0; done
for f in $OUT/md5.*; do echo "$(basename $f): $(sort -u $f | tr '\n' ' ')"; done
echo "total $(( $(date +%s)-T0 )) s"
