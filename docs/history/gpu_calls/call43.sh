#!/usr/bin/env bash
# Twenty-fourth session: where the resident decode step goes after 8192 positions, against
# after 512 (SLUICE_CUDA_PROFILE=1: the captured graph's kernels timed alone, and its replay),
# the decode attention alone (bench_cuda --attention-decode, 32 / 4 / 128 rows), and ncu on the
# GQA attention and its merge inside the model's step after 8192. About 4 minutes. Carry
# .carry/bins.txz (sluice, bench_cuda).
set -uo pipefail
cd "$(dirname "$0")/../.."
tar xJf .carry/bins.txz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib SLUICE_SOURCE_DIR=$PWD
T0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: ${NCU:-none}"
timeout 90 .carry/bin/bench_cuda --attention-decode > $OUT/attention.txt 2>&1
grep -E "copy bandwidth|^\| 32 / 4 " $OUT/attention.txt
P=/tmp/q12
timeout 60 .carry/bin/sluice synth --like qwen3-30b-a3b --kinds q4 --layers 12 $P --force -q > /dev/null 2>&1
for n in 512 8192; do
  echo "## prefill $n, then 3 decode steps, profiled"
  SLUICE_CUDA_PROFILE=1 timeout 90 .carry/bin/bench_cuda --model $P --prefill $n --decode 3 --reps 0 > $OUT/prof_$n.txt 2>&1
  awk '/^\| kernel \(graph/{on=1; buf=""} on{buf=buf $0 "\n"} /^\| graph replay/{on=0; last=buf} END{printf "%s", last}' \
    $OUT/prof_$n.txt | head -40
  timeout 90 .carry/bin/bench_cuda --model $P --prefill $n --decode 64 --reps 1 2>&1 | grep -E "^\|" | tail -3
done
if [ -n "$NCU" ]; then
  timeout 200 $NCU --kernel-name regex:'attention_decode_(gqa|merge)' --launch-skip 24 --launch-count 2 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
    .carry/bin/bench_cuda --model $P --prefill 8192 --decode 3 --reps 0 > $OUT/ncu.txt 2>&1
  echo "ncu rc $?"
  grep -E "attention_decode|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Block Limit|Theoretical Occ|Stall|L2 Hit|Waves Per SM|Grid Size|Warp Cycles Per Issued" $OUT/ncu.txt | head -60
fi
echo "total $(( $(date +%s)-T0 )) s"
