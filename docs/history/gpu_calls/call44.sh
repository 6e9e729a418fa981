#!/usr/bin/env bash
# Twenty-fourth session: the rotary tables of a decoder state filled once, as the sequence
# reaches them (the first decode step after an 8192-token prompt recomputed all 8320
# positions on the host, ~10 ms, and the prompt's own rows went through a synchronous copy),
# and rope_tables over the thread pool. Binaries of main before (old) and after (new),
# interleaved on one 12-layer synthetic: sluice run after an 8192-token prompt (the side by
# side's row) and after one token; bench_cuda --prefill 8192 (prefill tok/s, first decode
# step ms) with the new binaries (call43 has the old ones' row). About 2 minutes. Carry
# .carry/bins-old.txz (sluice) and .carry/bins-new-run.txz (sluice, bench_cuda): the 64 MiB
# carry holds no more; call45.sh runs every GPU test with the new binaries.
set -uo pipefail
cd "$(dirname "$0")/../.."
for v in old new; do mkdir -p .carry/$v; done
tar xJf .carry/bins-old.txz -C .carry/old; tar xJf .carry/bins-new-run.txz -C .carry/new
export SLUICE_SOURCE_DIR=$PWD
T0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader
P=/tmp/q12
LD_LIBRARY_PATH=.carry/new/lib timeout 60 .carry/new/bin/sluice synth --like qwen3-30b-a3b --kinds q4 --layers 12 $P --force -q > /dev/null 2>&1
long=$(python3 -c "print(','.join(str(100 + i % 5000) for i in range(8192)))")
sr() { local v=$1; shift
  LD_LIBRARY_PATH=.carry/$v/lib timeout 60 .carry/$v/bin/sluice run --model $P --backend cuda --ignore-eos -n 128 --temperature 0 "$@" \
    2>&1 >/tmp/out.txt | grep -o "prompt [0-9]* tokens, [0-9.]* tok/s\|generated [0-9]* tokens, [0-9.]* tok/s" | grep -o "[0-9.]* tok/s" | tr '\n' ' '; md5sum < /tmp/out.txt | cut -c1-8; }
echo "| binaries | after 8192: prompt tok/s, decode tok/s, text | after 1 token: prompt, decode, text |"
echo "|---|---|---|"
for r in 1 2 3; do for v in old new; do
  echo "| $v | $(sr $v --tokens "$long") | $(sr $v --tokens 1) |"
done; done
echo "| binaries | prefill 8192: prefill tok/s | decode tok/s | first decode step ms | steady tok/s |"
echo "|---|---|---|---|---|"
for r in 1 2; do for v in new; do
  row=$(LD_LIBRARY_PATH=.carry/$v/lib timeout 90 .carry/$v/bin/bench_cuda --model $P --prefill 8192 --decode 64 --reps 2 2>/dev/null | grep -E "^\| 8192 ")
  echo "| $v | $(echo "$row" | awk -F'|' '{print $3 "|" $4 "|" $8 "|" $9}') |"
done; done
echo "total $(( $(date +%s)-T0 )) s"
