#!/usr/bin/env bash
# Twenty-sixth session, first call (the lost branch one-split-scales rebuilt on main): 1) every
# GPU test, on whichever card the call gets (the issue wants them on the H200); with the new
# cases: the tensor-core decode attention with every capacity in one split, the q4 decode
# MoE kernels with the gate/up rows' scales staged in shared memory; 2) on the 12-layer
# qwen3-30b-a3b q4 synthetic, interleaved twice: SLUICE_CUDA_ATTENTION_ONE_SPLIT = 0 / 4 / 16
# stages, SLUICE_CUDA_STAGED_SCALES = 0 / 1 and SLUICE_CUDA_EARLY_DOWN = 0 / 1 (the MoE down +
# combine's experts and weights read before its wait), `sluice run` after one token (its text's
# hash) and `bench_cuda --prefill 512 --decode 128`; 3) the step after 512 profiled with each switch.
# About 6 minutes. Carry .carry/bins.txz (CARRY_FROM=build-carry scripts/carry-build sluice
# bench_cuda sluice_gpu_tests).
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -x .carry/bin/bench_cuda ] || tar xJf .carry/bins.txz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib SLUICE_SOURCE_DIR=$PWD
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
P=/tmp/q12
timeout 90 .carry/bin/sluice synth --like qwen3-30b-a3b --kinds q4 --layers 12 $P --force -q > $OUT/synth12.log 2>&1 &
synth=$!
timeout 300 .carry/bin/sluice_gpu_tests --gtest_color=no > $OUT/gpu-tests.log 2>&1
echo "GPU tests rc $? at $(( $(date +%s)-T0 )) s: passed $(grep -c '^\[       OK' $OUT/gpu-tests.log), failed $(grep -cE '^\[  FAILED  \] .*\([0-9]+ ms\)$' $OUT/gpu-tests.log), of $(grep -o 'Running [0-9]* tests' $OUT/gpu-tests.log)"
grep -E "^\[  FAILED|Failure|Expected|Which is" $OUT/gpu-tests.log | sed 's/ ([0-9]* ms)//' | sort | uniq -c | sort -rn | head -12
wait $synth; echo "synth 12: rc $? at $(( $(date +%s)-T0 )) s"
sr() { timeout 60 .carry/bin/sluice run --model $P --backend cuda --ignore-eos -n 128 --temperature 0 --tokens 1 \
    2>&1 >/tmp/out.txt | grep -o "generated [0-9]* tokens, [0-9.]* tok/s" | grep -o "[0-9.]* tok/s" | tr '\n' ' '; md5sum < /tmp/out.txt | cut -c1-8; }
bc() { timeout 90 .carry/bin/bench_cuda --model $P --prefill 512 --decode 128 --reps 1 2>/dev/null | grep -E "^\| 512 " | awk -F'|' '{print $4 "|" $9}'; }
echo "| ONE_SPLIT | STAGED_SCALES | EARLY_DOWN | round | sluice run after 1 token: decode, text | bench_cuda 512: decode | steady |"
echo "|---|---|---|---|---|---|---|"
for r in 1 2; do for v in "0 0 0" "4 0 0" "16 0 0" "0 1 0" "0 0 1" "16 1 1"; do set -- $v
  export SLUICE_CUDA_ATTENTION_ONE_SPLIT=$1 SLUICE_CUDA_STAGED_SCALES=$2 SLUICE_CUDA_EARLY_DOWN=$3
  echo "| $1 | $2 | $3 | $r | $(sr) | $(bc) |"
done; done
for v in "0 0 0" "16 0 0" "0 1 0" "0 0 1"; do set -- $v
  export SLUICE_CUDA_ATTENTION_ONE_SPLIT=$1 SLUICE_CUDA_STAGED_SCALES=$2 SLUICE_CUDA_EARLY_DOWN=$3
  echo "## profile after 512, ONE_SPLIT=$1 STAGED_SCALES=$2 EARLY_DOWN=$3"
  SLUICE_CUDA_PROFILE=1 timeout 90 .carry/bin/bench_cuda --model $P --prefill 512 --decode 3 --reps 0 > $OUT/prof_$1_$2_$3.txt 2>&1
  grep -E "attention|moe|graph replay" $OUT/prof_$1_$2_$3.txt | grep -v "^profile: node" | head -8
done
echo "total $(( $(date +%s)-T0 )) s"
