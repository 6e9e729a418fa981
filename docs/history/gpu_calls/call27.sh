#!/usr/bin/env bash
# Twenty-first session: the service thread's host work a MoE layer, main (762c4c4) against the
# markov policy's cheaper victim search (rank without divisions, chance row by row: the same
# victims, bench_plan). On the 12-layer qwen3-30b-a3b q4 synthetic, the host-RAM row (10%
# device cache + preloaded host tier, 128 greedy tokens), interleaved A = main, B = the change,
# with the stats (the service thread's wall and CPU time a decode step) and then the handshake
# timeline of each. About 2.5 minutes. Carry .carry/bins-b.txz (B) and .carry/bins-main.txz (A), sluice alone.
set -uo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .carry/A .carry/B
tar xJf .carry/bins-main.txz -C .carry/A && tar xJf .carry/bins-b.txz -C .carry/B
export SLUICE_SOURCE_DIR=$PWD
T0=$(date +%s); LIMIT=${LIMIT:-200}
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
nvidia-smi --query-gpu=name --format=csv,noheader
P=/tmp/q12
LD_LIBRARY_PATH=$PWD/.carry/B/lib timeout 30 .carry/B/bin/sluice synth --like qwen3-30b-a3b --kinds q4 --layers 12 $P --force -q > /dev/null 2>&1
c10=$(( $(stat -c %s $P/experts.q4.bin) / 10 ))
run() { local v=$1 t=$2
  LD_LIBRARY_PATH=$PWD/.carry/$v/lib SLUICE_CUDA_HANDSHAKE_TIMES=$t timeout 20 .carry/$v/bin/sluice run --model $P \
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
for r in 1 2 3 4; do
  for v in A B; do [ $(left) -gt 30 ] || break 2; run $v 0; done
done
for v in A B; do [ $(left) -gt 12 ] && run $v 1; done
echo "total $(( $(date +%s)-T0 )) s"
