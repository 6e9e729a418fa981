#!/usr/bin/env bash
# Twenty-first session: where the service thread's ~5 us a MoE layer goes (call27), if the
# GPU machine has perf: the host-RAM row of call27 (binary B) under `perf record`, the
# symbols by thread. About 1 minute. Carry .carry/bins-b.txz.
set -uo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .carry/B && tar xJf .carry/bins-b.txz -C .carry/B
export LD_LIBRARY_PATH=$PWD/.carry/B/lib
command -v perf || { echo "no perf"; ls /usr/bin | grep -iE "perf|gdb|valgrind|bpf" | head; exit 0; }
P=/tmp/q12
timeout 30 .carry/B/bin/sluice synth --like qwen3-30b-a3b --kinds q4 --layers 12 $P --force -q > /dev/null 2>&1
c10=$(( $(stat -c %s $P/experts.q4.bin) / 10 ))
perf record -q -F 20000 -o /tmp/p.data -- .carry/B/bin/sluice run --model $P --backend cuda --ignore-eos --temperature 0 \
  -n 512 --tokens 1 --expert-cache $c10 --host-cache 16G --host-cache-preload > /dev/null 2>/tmp/err.log || tail -3 /tmp/err.log
perf report -i /tmp/p.data --no-children --sort tid 2>/dev/null | grep -E "^ +[0-9]" | head -8
for t in $(perf report -i /tmp/p.data --no-children --sort tid 2>/dev/null | grep -E "^ +[0-9]" | head -3 | awk '{print $2}' | cut -d: -f1); do
  echo "== thread $t"
  perf report -i /tmp/p.data --no-children --tid $t --sort sym 2>/dev/null | grep -E "^ +[0-9]" | head -25 | cut -c1-150
done
