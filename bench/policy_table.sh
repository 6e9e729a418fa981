#!/usr/bin/env bash
# policy_table.sh BIN_DIR [MIXTRAL_TRACE]: the cache-policy table of bench/RESULTS.md. Replays
# each routing trace of traces/ (and the external Mixtral-8x7B HumanEval trace when given:
# docs/trace-format.md) through `sluice simulate` in one pool shared by the layers with step
# pins (the engine's shape), at 12.5% and 25% of the trace's experts (Mixtral: 25% and 50%,
# its smallest pool being 25%), and prints one markdown row per trace and size: the demand hit
# rate of lru, lrfu and markov (the default), markov with lookahead's reads replayed
# (`--lookahead on`; in brackets the records read a demand access), Belady's (the offline
# optimum), and markov's share of Belady's.
#   BIN_DIR: holds sluice. Runs on the CPU in about a minute; needs nothing but the repository.
set -euo pipefail
[ $# -ge 1 ] && [ $# -le 2 ] || { echo "usage: policy_table.sh BIN_DIR [MIXTRAL_TRACE]" >&2; exit 2; }
S=$(realpath "$1")/sluice
[ -x "$S" ] || { echo "policy_table.sh: error: $S: not an executable" >&2; exit 1; }
cd "$(dirname "$0")/.."

# row NAME SHAPE TRACE SLOTS SHARE PREFETCH(0|1)
row() {
  local all markov_pf lru lrfu markov belady pf="-"
  all=$("$S" simulate --trace "$3" --expert-slots "$4" --pin step --policy all 2>/dev/null)
  lru=$(awk '$1 == "lru" {print $2}' <<< "$all"); lrfu=$(awk '$1 == "lrfu" {print $2}' <<< "$all")
  markov=$(awk '$1 == "markov" {print $2}' <<< "$all"); belady=$(awk '$1 == "belady" {print $2}' <<< "$all")
  if [ "$6" = 1 ]; then
    markov_pf=$("$S" simulate --trace "$3" --expert-slots "$4" --pin step --policy markov --lookahead on 2>/dev/null)
    pf=$(awk '{printf "%s (%s)", $2, $3}' <<< "$markov_pf")
  fi
  echo "| $1 | $2 | $4 ($5) | $lru | $lrfu | $markov | $pf | $belady | $(awk -v m="$markov" -v b="$belady" 'BEGIN {printf "%.2f", m / b}') |"
}

echo "| trace | layers x experts, top-k | shared slots (of the experts) | lru | lrfu | markov (default) | markov + lookahead's reads (reads a demand access) | Belady | markov / Belady |"
echo "|---|---|---|---|---|---|---|---|---|"
for n in 48 96; do row "routing model, Python (10.3M)" "6 x 64, top-8" traces/routing-model-code.jsonl.xz $n $([ $n = 48 ] && echo 12.5% || echo 25%) 1; done
for n in 96 192; do row "routing model, Python, 128 experts" "6 x 128, top-8" traces/routing-model-128e-code.jsonl.xz $n $([ $n = 96 ] && echo 12.5% || echo 25%) 1; done
for n in 48 96; do row "routing model, C headers, top-4" "6 x 64, top-4" traces/routing-model-top4-c-headers.jsonl.xz $n $([ $n = 48 ] && echo 12.5% || echo 25%) 1; done
for n in 96 192; do row "routing model, Python (314M)" "12 x 64, top-8" traces/routing-model-gpu-code.jsonl.xz $n $([ $n = 96 ] && echo 12.5% || echo 25%) 1; done
if [ $# -eq 2 ]; then
  for n in 64 128; do row "Mixtral-8x7B, HumanEval (external)" "32 x 8, top-2" "$2" $n $([ $n = 64 ] && echo 25% || echo 50%) 0; done
fi
