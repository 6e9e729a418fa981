#!/usr/bin/env bash
# Twenty-sixth session, fourth call: 1) every GPU test (main's defaults; the new
# RoutedExperts cases); 2) on the 12-layer qwen3-30b-a3b q4 synthetic, interleaved twice:
# SLUICE_CUDA_ROUTED_EXPERTS = 0 / 1 (the router's top-k inside the two expert kernels, no
# top-k launch), `sluice run` after one token (its text's hash), `bench_cuda --prefill 512
# --decode 128`, and once `sluice run` after 8192 tokens; 3) the step after 512 profiled with
# each. About 5 minutes. Carry .carry/bins.txz.
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
long=$(python3 -c "print(','.join(str(100 + i % 5000) for i in range(8192)))")
sr() { timeout 60 .carry/bin/sluice run --model $P --backend cuda --ignore-eos -n 128 --temperature 0 --tokens "$1" \
    2>&1 >/tmp/out.txt | grep -o "generated [0-9]* tokens, [0-9.]* tok/s" | grep -o "[0-9.]* tok/s" | tr '\n' ' '; md5sum < /tmp/out.txt | cut -c1-8; }
bc() { timeout 90 .carry/bin/bench_cuda --model $P --prefill 512 --decode 128 --reps 1 2>/dev/null | grep -E "^\| 512 " | awk -F'|' '{print $4 "|" $9}'; }
echo "| SLUICE_CUDA_ROUTED_EXPERTS | round | sluice run after 1 token: decode, text | bench_cuda 512: decode | steady |"
echo "|---|---|---|---|---|"
for r in 1 2; do for e in 0 1; do
  echo "| $e | $r | $(SLUICE_CUDA_ROUTED_EXPERTS=$e sr 1) | $(SLUICE_CUDA_ROUTED_EXPERTS=$e bc) |"
done; done
echo "| SLUICE_CUDA_ROUTED_EXPERTS | sluice run after 8192 tokens: decode, text |"
echo "|---|---|"
for e in 0 1; do echo "| $e | $(SLUICE_CUDA_ROUTED_EXPERTS=$e sr "$long") |"; done
for e in 0 1; do
  echo "## profile after 512, SLUICE_CUDA_ROUTED_EXPERTS=$e"
  SLUICE_CUDA_ROUTED_EXPERTS=$e SLUICE_CUDA_PROFILE=1 timeout 90 .carry/bin/bench_cuda --model $P --prefill 512 --decode 3 --reps 0 > $OUT/prof_$e.txt 2>&1
  grep -E "moe|topk|graph replay" $OUT/prof_$e.txt | grep -v "^profile: node" | head -6
done
echo "total $(( $(date +%s)-T0 )) s"
