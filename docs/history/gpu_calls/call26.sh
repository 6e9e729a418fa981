#!/usr/bin/env bash
# Twenty-first session: is the next layer predictable on the side by side's checkpoint? The
# host-RAM row (10% device cache + preloaded host tier, 128 greedy tokens) with --lookahead
# off / on, interleaved, with the stats (hit rate, misses, prefetches and their hits, H2D
# bytes). Builds only the checkpoint and the pack (no peer). About 4 minutes.
# Carry .carry/bins.txz and .carry/peer.
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -x .carry/bin/bench_cuda ] || tar xJf .carry/bins.txz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib
T0=$(date +%s); LIMIT=${LIMIT:-540}
nvidia-smi --query-gpu=name --format=csv,noheader
W=/tmp/sbs; mkdir -p $W
python3 .carry/peer/make_model.py $W/hf 12 > /tmp/mk.log 2>&1 || { tail -5 /tmp/mk.log; exit 1; }
tar xJf .carry/peer/ik_llama-trimmed.tar.xz -C $W qwen3-tok && cp $W/qwen3-tok/* $W/hf/
.carry/bin/sluice convert $W/hf $W/pack --kinds q4 --dense bf16 -q --force || exit 1
echo "pack at $(( $(date +%s)-T0 )) s"
P=$W/pack
cache=$(( $(stat -c %s $P/experts.q4.bin) / 10 ))
row() {  # lookahead temperature
  .carry/bin/sluice run --model $P --backend cuda --ignore-eos --temperature $2 --seed 1 -n 128 --tokens 1 \
    --expert-cache $cache --host-cache 16G --host-cache-preload --lookahead $1 --stats /tmp/st.json >/dev/null 2>/tmp/err.log
  python3 - "$1" "$2" <<'PY'
import json, sys
r = json.load(open("/tmp/st.json"))["run"]; d = r["phases"]["decode"]
print(f"| {sys.argv[1]} | {sys.argv[2]} | {r['decode_tokens_per_second']:.1f} | {d['hit_rate']:.3f} | {d['misses']} | {d['prefetch_requests']} | {d['prefetch_hits']} | {r['io']['h2d_bytes']/1e9:.2f} | {r['cache']['speculative_slots']} |")
PY
}
echo "| lookahead | temperature | decode tok/s | decode hit rate | decode misses | prefetches | prefetch hits | H2D GB (run) | speculative slots |"
echo "|---|---|---|---|---|---|---|---|---|"
for r in 1 2 3; do
  for la in off on; do
    [ $(( $(date +%s)-T0 )) -lt $LIMIT ] || break 2
    row $la 0 || tail -3 /tmp/err.log
  done
done
for la in off on; do
  [ $(( $(date +%s)-T0 )) -lt $LIMIT ] || break
  row $la 1 || tail -3 /tmp/err.log
done
echo "total $(( $(date +%s)-T0 )) s"
