#!/usr/bin/env bash
# Twenty-fifth session: call49 (the branch decode-mma-merge: attention op + batch graph tests,
# the merge in the kernel against the merge launch, the batch rows FMA / tensor cores), then
# where the MoE decode kernels' 20 us a layer go: SLUICE_CUDA_PROFILE=1 on the 12-layer
# synthetic after 512, and ncu (real clocks) on moe_decode_gate_up / down_combine inside the
# step. About 5 minutes. Carry .carry/bins.txz (sluice, bench_cuda, sluice_gpu_tests).
set -uo pipefail
cd "$(dirname "$0")/../.."
bash bench/gpu_calls/call49.sh
export LD_LIBRARY_PATH=$PWD/.carry/lib SLUICE_SOURCE_DIR=$PWD
T0=$(date +%s)
P=/tmp/q12
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
SLUICE_CUDA_PROFILE=1 timeout 90 .carry/bin/bench_cuda --model $P --prefill 512 --decode 3 --reps 0 > $OUT/prof_512.txt 2>&1
awk '/^\| kernel \(graph/{on=1; buf=""} on{buf=buf $0 "\n"} /^\| graph replay/{on=0; last=buf} END{printf "%s", last}' \
  $OUT/prof_512.txt | head -40
if [ -n "$NCU" ]; then
  timeout 200 $NCU --clock-control none --kernel-name regex:'moe_decode_(gate_up|down_combine)' --launch-skip 24 --launch-count 4 \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section MemoryWorkloadAnalysis --section SchedulerStats --section InstructionStats --section SourceCounters \
    .carry/bin/bench_cuda --model $P --prefill 512 --decode 3 --reps 0 > $OUT/ncu_moe.txt 2>&1
  echo "ncu rc $?"
  grep -E "moe_decode|Duration|DRAM Throughput|Memory Throughput|Compute \(SM\)|Achieved Occupancy|Registers Per|Theoretical Occ|L2 Hit|Grid Size|Warp Cycles Per Issued|Issue Slots Busy|Executed Ipc A|No Eligible|Stall|Executed Instructions  " $OUT/ncu_moe.txt | head -90
fi
echo "total $(( $(date +%s)-T0 )) s"
