# Sourced by the call scripts (callNN.sh, from call54 on) after they cd to the repository root
# on the GPU machine: the carried binaries (.carry/bins.txz) unpacked and on the library path,
# and what every call repeats. $OUT is the device tool's output folder.
[ -x .carry/bin/bench_cuda ] || tar xJf .carry/bins.txz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib SLUICE_SOURCE_DIR=$PWD
T0=$(date +%s)
P=/tmp/q12  # the 12-layer qwen3-30b-a3b q4 synthetic
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader

elapsed() { echo $(( $(date +%s) - T0 )); }

# Every GPU test within $1 seconds (default 300): a line of counts, then each failure's lines.
gpu_tests() {
  timeout "${1:-300}" .carry/bin/sluice_gpu_tests --gtest_color=no > $OUT/gpu-tests.log 2>&1
  echo "GPU tests rc $? at $(elapsed) s: passed $(grep -c '^\[       OK' $OUT/gpu-tests.log), failed $(grep -cE '^\[  FAILED  \] .*\([0-9]+ ms\)$' $OUT/gpu-tests.log), of $(grep -o 'Running [0-9]* tests' $OUT/gpu-tests.log)"
  grep -E "^\[  FAILED|Failure|Expected|Which is" $OUT/gpu-tests.log | sed 's/ ([0-9]* ms)//' | sort | uniq -c | sort -rn | head -12
}

# gpu_tests ($1 seconds) while $P is written beside them.
synth12_and_gpu_tests() {
  timeout 90 .carry/bin/sluice synth --like qwen3-30b-a3b --kinds q4 --layers 12 $P --force -q > $OUT/synth12.log 2>&1 &
  local synth=$!
  gpu_tests "$1"
  wait $synth; echo "synth 12: rc $? at $(elapsed) s"
}

# An 8192-token prompt for `sr`.
long_prompt() { python3 -c "print(','.join(str(100 + i % 5000) for i in range(8192)))"; }

# `sluice run` of $P, 128 greedy tokens after the prompt $1 (token ids): "N tok/s" and the
# first 8 hex digits of the text's md5.
sr() { timeout 60 .carry/bin/sluice run --model $P --backend cuda --ignore-eos -n 128 --temperature 0 --tokens "$1" \
    2>&1 >/tmp/out.txt | grep -o "generated [0-9]* tokens, [0-9.]* tok/s" | grep -o "[0-9.]* tok/s" | tr '\n' ' '; md5sum < /tmp/out.txt | cut -c1-8; }

# `bench_cuda --prefill 512 --decode 128` of $P: "decode ± sd | steady decode".
bc() { timeout 90 .carry/bin/bench_cuda --model $P --prefill 512 --decode 128 --reps 1 2>/dev/null | grep -E "^\| 512 " | awk -F'|' '{print $4 "|" $9}'; }
