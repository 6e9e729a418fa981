#!/usr/bin/env bash
# run.sh BIN_DIR [PART ...]: the GPU suite, from the repository root of a checkout on a machine
# with an NVIDIA GPU (sm_90). BIN_DIR holds sluice, bench_cuda and sluice_gpu_tests (a build
# here, or binaries made elsewhere by pack-binaries.sh, with LD_LIBRARY_PATH set). Parts, run
# in the order given (default: tests roofline streamed):
#   tests      every GPU test (tests.sh): kernels against the CPU reference, parity with
#              transformers on every fixture, the CUDA streamer against the CPU's
#   sbs        side by side with the peer engine (bench/peer/side_by_side.sh; PEER=its source,
#              a checkout or a .tar.xz; LAYERS, default 12)
#   roofline   the full 48-layer qwen3-30b-a3b (q4 experts, synthetic) resident: prefill 512,
#              decode against the memory roofline, batch 8 and 32
#   streamed   streamed decode with replayed routing at several caches, from disk and from the
#              host tier, against the IO bound (streamed.sh)
#   families   one family's synthetic pack each (gpt-oss-120b, llama4-scout, gemma4-26b-a4b;
#              12 layers): resident against the bytes a token reads, streamed at 10% and 25%
#   deepseek   the DeepSeek-V3 slice (deepseek_slice.sh)
#   prompt     time to first token of turn 10 of a chat (~8k tokens of history) with and
#              without the prompt cache, resident and from a 10% expert cache (prompt_cache.sh)
#   json       `sluice serve` under 1, 8 and 32 clients, plain against JSON-schema requests
#              (bench/serve_load.sh FORMATS=text,json_schema on a 12-layer synthetic
#              qwen3-30b-a3b pack with models/demo's tokenizer)
# Output goes to stdout as markdown rows, logs to ${OUT:-/tmp/gpu-suite}. LIMIT (seconds,
# default 560) is the whole run's budget: a part that would start after it is skipped and said so.
set -uo pipefail
cd "$(dirname "$0")/../.."
BIN=$(realpath "$1"); shift
PARTS=("$@"); [ ${#PARTS[@]} -gt 0 ] || PARTS=(tests roofline streamed)
export OUT=${OUT:-/tmp/gpu-suite} SLUICE_SOURCE_DIR=$PWD
mkdir -p "$OUT"
LIMIT=${LIMIT:-560}; T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
echo "sluice $("$BIN/sluice" --version 2>/dev/null | head -1), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
for part in "${PARTS[@]}"; do
  if [ "$(el)" -ge "$LIMIT" ]; then echo "== $part: skipped (LIMIT $LIMIT s reached at $(el) s)"; continue; fi
  left=$(( LIMIT - $(el) ))
  echo "== $part (at $(el) s, $left s left)"
  case $part in
    tests) timeout "$left" bench/gpu-suite/tests.sh "$BIN" | tail -40 ;;
    sbs) LIMIT=$left timeout "$left" bench/peer/side_by_side.sh "$BIN" "${PEER:?sbs needs PEER, the peer source}" "${LAYERS:-12}" ;;
    roofline)
      P=/tmp/q48
      [ -e $P/manifest.json ] || timeout 200 "$BIN/sluice" synth --like qwen3-30b-a3b --kinds q4 $P -q --force
      timeout "$left" "$BIN/bench_cuda" --model $P --prefill 512 --decode 128 --reps 2 --batch 1,8,32 2>"$OUT/roofline.err" ;;
    streamed) LIMIT=$left timeout "$left" bench/gpu-suite/streamed.sh "$BIN" ;;
    families)
      for like in gpt-oss-120b:mxfp4 llama4-scout:q4 gemma4-26b-a4b:q4; do
        [ "$(el)" -lt "$LIMIT" ] || break
        LIKE=${like%%:*} KIND=${like#*:} LAYERS=12 timeout $(( LIMIT - $(el) )) bench/family_decode.sh "$BIN"
      done ;;
    deepseek) LIMIT=$left timeout "$left" bench/gpu-suite/deepseek_slice.sh "$BIN" ;;
    prompt) LIMIT=$left timeout "$left" bench/gpu-suite/prompt_cache.sh "$BIN" ;;
    json)
      P=/tmp/json-q12
      [ -e $P/manifest.json ] || timeout 100 "$BIN/sluice" synth --like qwen3-30b-a3b --kinds q4 --layers 12 $P -q --force
      cp models/demo/tokenizer.json models/demo/tokenizer_config.json $P/
      DEADLINE=$left RUNS=resident FORMATS=text,json_schema CLIENTS=1,8,32 PARALLEL=32 OUT="$OUT/json" \
        timeout "$left" bench/serve_load.sh $P "$BIN" ;;
    *) echo "unknown part '$part' (tests sbs roofline streamed families deepseek prompt json)"; exit 2 ;;
  esac
done
echo "== done at $(el) s"
