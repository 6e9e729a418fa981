#!/usr/bin/env bash
# Twenty-second session: the streamed greedy step enqueued ahead (models/decoder.cpp,
# forward_sample_eager; SLUICE_DECODE_AHEAD=0 to compare). 1) the new test and the sample-step,
# streaming and MoE tests; 2) on the 12-layer qwen3-30b-a3b q4 synthetic, the host-RAM row
# (10% device cache + preloaded host tier, 128 greedy tokens) ahead off / on interleaved, then
# timed (layer 0's segments hold the token boundary); 3) the disk row (10%, no host tier) off
# / on; 4) the side by side's checkpoint (no peer) host-RAM row off / on, as time allows.
# About 3 minutes. (As first run the filter read 'CudaSampleStep.*', which misses the
# parameterized tests' 'Fixtures/' prefix: they ran apart right after, on the same machine.) Carry .carry/bins.txz (sluice, sluice_gpu_tests) and .carry/peer.
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -x .carry/bin/sluice ] || tar xJf .carry/bins.txz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib SLUICE_SOURCE_DIR=$PWD
T0=$(date +%s); LIMIT=${LIMIT:-540}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 200 .carry/bin/sluice_gpu_tests --gtest_color=no \
  --gtest_filter='*CudaSampleStep*:CudaStreaming.*:CudaMoe.*' > $OUT/test.log 2>&1
echo "tests: rc $? at $(( $(date +%s)-T0 )) s"; grep -E "^\[  (PASSED|FAILED) |Failure|tests ran|^\[  FAILED" $OUT/test.log | head -30
P=/tmp/q12
timeout 30 .carry/bin/sluice synth --like qwen3-30b-a3b --kinds q4 --layers 12 $P --force -q > /dev/null 2>&1
c10=$(( $(stat -c %s $P/experts.q4.bin) / 10 ))
run() { local a=$1 tier=$2 t=$3 p=$4 tag=$5
  local host=""; [ $tier = ram ] && host="--host-cache 16G --host-cache-preload"
  SLUICE_DECODE_AHEAD=$a SLUICE_CUDA_HANDSHAKE_TIMES=$t timeout 30 .carry/bin/sluice run --model $p --backend cuda \
    --ignore-eos --temperature 0 -n 128 --tokens 1 --expert-cache $(( $(stat -c %s $p/experts.q4.bin) / 10 )) $host \
    --stats /tmp/st.json > /tmp/out.txt 2> /tmp/err.log
  python3 - "$a" "$tier" "$t" "$tag" <<'PY'
import json, sys
r = json.load(open("/tmp/st.json"))["run"]; d = r["phases"]["decode"]
s = max(d["steps"], 1)
print(f"| {sys.argv[4]} | {sys.argv[2]} | {sys.argv[1]} | {sys.argv[3]} | {r['decode_tokens_per_second']:.1f} | {d['hit_rate']:.3f} | {d['misses']} | {d['steps']} |")
PY
  md5sum < /tmp/out.txt | cut -c1-8 >> $OUT/md5.$tag.$tier.$a
  [ $t = 1 ] && grep -E "^\| (all|0|5) \| (phase|combine)" /tmp/err.log; }
echo "| pack | tier | ahead | timeline | decode tok/s | hit rate | misses | layer steps |"
echo "|---|---|---|---|---|---|---|---|"
for r in 1 2 3; do for a in 0 1; do [ $(left) -gt 200 ] || break 2; run $a ram 0 $P q12; done; done
for a in 0 1; do [ $(left) -gt 180 ] && run $a ram 1 $P q12; done
for a in 0 1; do [ $(left) -gt 160 ] && run $a disk 0 $P q12; done
echo "synthetic done at $(( $(date +%s)-T0 )) s"
W=/tmp/sbs; mkdir -p $W
if [ $(left) -gt 150 ]; then
  python3 .carry/peer/make_model.py $W/hf 12 > /tmp/mk.log 2>&1 || { tail -5 /tmp/mk.log; exit 1; }
  tar xJf .carry/peer/ik_llama-trimmed.tar.xz -C $W qwen3-tok && cp $W/qwen3-tok/* $W/hf/
  .carry/bin/sluice convert $W/hf $W/pack --kinds q4 --dense bf16 -q --force || exit 1
  echo "pack at $(( $(date +%s)-T0 )) s"
  for r in 1 2 3; do for a in 0 1; do [ $(left) -gt 15 ] || break 2; run $a ram 0 $W/pack sbs; done; done
fi
for f in $OUT/md5.*; do echo "$(basename $f): $(sort -u $f | tr '\n' ' ')"; done
echo "total $(( $(date +%s)-T0 )) s"
