#!/usr/bin/env bash
# Twenty-fourth session, the branch decode-mma (on rope-rows): the decode attention's
# tensor-core kernel (attention_decode_mma.cu; SLUICE_CUDA_ATTENTION_MMA=0: the FMA kernel).
# 1) the CUDA attention op tests; 2) bench_cuda --attention-decode with the FMA kernel and the
# tensor-core one; 3) the 12-layer synthetic: bench_cuda --prefill 512 / 8192 --decode 64 and
# sluice run after an 8192-token prompt and after one token, FMA / tensor cores interleaved
# (the rows of the new rotary tables too: call43 has the binaries before them); the step after
# 8192 profiled (call45.sh then runs every GPU test). About 5 minutes. Carry .carry/bins.txz (sluice, bench_cuda,
# sluice_gpu_tests).
set -uo pipefail
cd "$(dirname "$0")/../.."
tar xJf .carry/bins.txz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib SLUICE_SOURCE_DIR=$PWD
T0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader
timeout 120 .carry/bin/sluice_gpu_tests --gtest_color=no --gtest_filter='CudaOps.*ttention*' > $OUT/ops.log 2>&1
echo "attention op tests: rc $?"; grep -E "^\[  (PASSED|FAILED) |Failure|Expected|Which is|nse|tensor-core" $OUT/ops.log | head -20
for m in 0 1; do
  echo "## SLUICE_CUDA_ATTENTION_MMA=$m"
  SLUICE_CUDA_ATTENTION_MMA=$m timeout 90 .carry/bin/bench_cuda --attention-decode 2>&1 | grep -E "bf16" | head -16
done
P=/tmp/q12
timeout 60 .carry/bin/sluice synth --like qwen3-30b-a3b --kinds q4 --layers 12 $P --force -q > /dev/null 2>&1
echo "| kernel (MMA) | prompt | prefill tok/s | decode tok/s | first decode step ms | steady tok/s |"
echo "|---|---|---|---|---|---|"
for n in 512 8192; do for r in 1 2; do for m in 0 1; do
  row=$(SLUICE_CUDA_ATTENTION_MMA=$m timeout 90 .carry/bin/bench_cuda --model $P --prefill $n --decode 64 --reps 1 2>/dev/null | grep -E "^\| $n ")
  echo "| $m | $n | $(echo "$row" | awk -F'|' '{print $3 "|" $4 "|" $8 "|" $9}') |"
done; done; done
long=$(python3 -c "print(','.join(str(100 + i % 5000) for i in range(8192)))")
sr() { local m=$1; shift
  SLUICE_CUDA_ATTENTION_MMA=$m timeout 60 .carry/bin/sluice run --model $P --backend cuda --ignore-eos -n 128 --temperature 0 "$@" \
    2>&1 >/tmp/out.txt | grep -o "prompt [0-9]* tokens, [0-9.]* tok/s\|generated [0-9]* tokens, [0-9.]* tok/s" | grep -o "[0-9.]* tok/s" | tr '\n' ' '; md5sum < /tmp/out.txt | cut -c1-8; }
echo "| MMA | after 8192: prompt, decode, text | after 1 token: prompt, decode, text |"
echo "|---|---|---|"
for r in 1 2; do for m in 0 1; do echo "| $m | $(sr $m --tokens "$long") | $(sr $m --tokens 1) |"; done; done
for m in 0 1; do
  echo "## profile after 8192, MMA=$m"
  SLUICE_CUDA_ATTENTION_MMA=$m SLUICE_CUDA_PROFILE=1 timeout 90 .carry/bin/bench_cuda --model $P --prefill 8192 --decode 3 --reps 0 2>&1 \
    | grep -E "attention|graph replay" | grep -v "^profile: node" | head -6
done
echo "total $(( $(date +%s)-T0 )) s"
