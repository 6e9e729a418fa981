#!/usr/bin/env bash
# streamed.sh BIN_DIR: the streamed rows with replayed real routing, on the GPU machine, from
# the repository root (BIN_DIR holds `sluice`, built with CUDA). Synthesizes the 48-layer
# qwen3-30b-a3b pack (q4 experts, q2 beside them) and a 12-layer gpt-oss-120b (mxfp4), then for
# each: `sluice bench` decode rows with --replay-routing (the trained 128-expert top-8 model's
# trace, traces/routing-model-128e-code.jsonl.xz: its ids on qwen3's 128 experts, the first 4
# of each row on gpt-oss's top-4), at device caches of CACHES percent of the expert bytes,
# experts from the disk (page cache dropped before each row; the engine reads O_DIRECT either
# way) and from a preloaded host tier, `--profile exact` and `fast`, `--lookahead off`
# and `on`. One markdown row each: hit rate, MB read a token, decode tok/s, the IO bound (the
# disk's O_DIRECT rate, measured by the same bench at the engine's queue depth, over the bytes a
# token), the compute bound (the same steps with --fake-experts) and the row's ratio to the
# tighter bound; then `sluice run --profile fast --kl-check` from disk at each model's middle
# cache (KL(exact || fast), the fast profile's speed beside the exact one's).
#
# Rows run most important first (every model's exact rows without lookahead, then fast, then
# lookahead on, then both), so a run cut short by LIMIT still has the rows that matter.
# Environment (defaults): LIMIT (480 s: no row starts that would end past it; about 8 minutes
#   of GPU-machine time with the synthesis), WORK (/tmp/streamed: packs and logs), TRACE
#   (traces/routing-model-128e-code.jsonl.xz), REPLAY_MAP (auto), CACHES (10,25,5), TIERS
#   (disk,host), MODELS (qwen,gptoss), DISK_DECODE (12 tokens a disk row, after as many of
#   warm-up), HOST_DECODE (48), KL_STEPS (8), QWEN_KINDS (q4,q2), QWEN_LAYERS (48), GPT_LAYERS
#   (12), BACKEND (cuda; cpu with a few layers checks the script anywhere), KEEP (1: keep the
#   packs for the next run; 0: remove them at the end).
# Output: the table on stdout (also $WORK/streamed.md); each row's bench JSON in $WORK/rows/.
set -uo pipefail
[ $# -eq 1 ] || { echo "usage: bench/gpu-suite/streamed.sh BIN_DIR" >&2; exit 2; }
BIN=$(realpath "$1")
NAME=streamed.sh
DEADLINE=${LIMIT:-480}
. "$(dirname "$0")/../common.sh"
W=${WORK:-/tmp/streamed}
TRACE=$(realpath "${TRACE:-traces/routing-model-128e-code.jsonl.xz}")
REPLAY_MAP=${REPLAY_MAP:-auto}; CACHES=${CACHES:-10,25,5}; TIERS=${TIERS:-disk,host}; MODELS=${MODELS:-qwen,gptoss}
DISK_DECODE=${DISK_DECODE:-12}; HOST_DECODE=${HOST_DECODE:-48}; KL_STEPS=${KL_STEPS:-8}
QWEN_KINDS=${QWEN_KINDS:-q4,q2}; QWEN_LAYERS=${QWEN_LAYERS:-48}; GPT_LAYERS=${GPT_LAYERS:-12}
BACKEND=${BACKEND:-cuda}; KEEP=${KEEP:-1}
mkdir -p "$W/rows"
[ -x "$BIN/sluice" ] || die "$BIN/sluice: not an executable"
[ -f "$TRACE" ] || die "$TRACE: no such trace"
MD=$W/streamed.md
: > "$MD"
out() { echo "$*" | tee -a "$MD"; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /' >&2

# The packs: written in parallel (each is CPU-bound on its records), reused while their manifest is there.
declare -A PACK KIND
PACK[qwen]=$W/qwen3-30b-a3b-$QWEN_LAYERS; KIND[qwen]=q4
PACK[gptoss]=$W/gpt-oss-120b-$GPT_LAYERS; KIND[gptoss]=mxfp4
pids=()
for m in ${MODELS//,/ }; do
  [ -f "${PACK[$m]}/manifest.json" ] && continue
  case $m in
    qwen) synth_pack "$BIN" qwen3-30b-a3b "$QWEN_KINDS" "$QWEN_LAYERS" "${PACK[$m]}" & ;;
    gptoss) synth_pack "$BIN" gpt-oss-120b mxfp4 "$GPT_LAYERS" "${PACK[$m]}" & ;;
    *) die "MODELS: unknown model '$m' (qwen, gptoss)" ;;
  esac
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p" || die "synth failed"; done
[ "$KEEP" = 1 ] || trap 'for m in ${MODELS//,/ }; do rm -rf "${PACK[$m]}"; done' EXIT
say "packs ready"

declare -A EXPERT_BYTES
for m in ${MODELS//,/ }; do
  EXPERT_BYTES[$m]=$(stat -c %s "${PACK[$m]}/experts.${KIND[$m]}.bin") || die "${PACK[$m]}: no ${KIND[$m]} experts"
done

out "routing replayed from $(basename "$TRACE") (--replay-map $REPLAY_MAP); decode rows of \`sluice bench -p 0 -r 1\` after a warm-up run of as many tokens; disk rows $DISK_DECODE tokens (page cache dropped: $(drop_caches && echo yes || echo no)), host rows $HOST_DECODE"
out ""
out "| model | experts from | cache | profile | lookahead | hit rate | MB/token | decode tok/s | disk GB/s | IO bound tok/s | compute bound tok/s | of bound |"
out "|---|---|---|---|---|---|---|---|---|---|---|---|"

# row MODEL TIER PCT PROFILE LOOKAHEAD: one bench process, one table row.
row() {
  local m=$1 tier=$2 pct=$3 profile=$4 look=$5
  local pack=${PACK[$m]} bytes=${EXPERT_BYTES[$m]}
  local cache=$(( bytes * pct / 100 )) n=$DISK_DECODE extra=()
  local name="$m-$tier-$pct-$profile-$look"
  # A row's time: load, the disk probe and the warm-up, timed and bound runs; no row starts that
  # would end past LIMIT (a disk row of qwen at 5% takes about 20 s, a host row about 15 s).
  local need=25
  [ "$m" = qwen ] && [ "$tier" = disk ] && [ "$pct" -le 5 ] && need=35
  if [ $(( DEADLINE - $(el) )) -lt "$need" ]; then say "$name: skipped (LIMIT)"; return 1; fi
  if [ "$tier" = host ]; then
    # Every record in the tier before the run (read through the page cache: --io buffered, so a
    # second preload of the same pack reads RAM); no disk read after it.
    extra=(--host-cache "$bytes" --host-cache-preload --io buffered); n=$HOST_DECODE
  else
    drop_caches
  fi
  timeout "$(tmo 120)" "$BIN/sluice" bench --model "$pack" --expert-kind "${KIND[$m]}" --backend "$BACKEND" -p 0 -n "$n" -r 1 \
    -o json --expert-cache "$cache" --replay-routing "$TRACE" --replay-map "$REPLAY_MAP" --profile "$profile" \
    --lookahead "$look" --wait-timeout 20 "${extra[@]}" > "$W/rows/$name.json" 2> "$W/rows/$name.log" ||
    { tail -2 "$W/rows/$name.log" >&2; say "$name failed"; return 1; }
  python3 - "$W/rows/$name.json" "$m" "$tier" "$pct" "$profile" "$look" <<'PY' | tee -a "$MD"
import json, sys
r = json.load(open(sys.argv[1]))[0]
m, tier, pct, profile, look = sys.argv[2:]
io = r.get("io_bound_ts")
cells = [m, tier, f"{pct}%", profile, look, f"{r['hit_rate']:.3f}", f"{r['bytes_read_per_token'] / 1e6:.1f}",
         f"{r['avg_ts']:.2f}", f"{r['disk_read_bytes_per_second'] / 1e9:.2f}", "-" if io is None else f"{io:.2f}",
         f"{r['compute_bound_ts']:.2f}", f"{r['of_bound']:.2f}x"]
print("| " + " | ".join(cells) + " |")
PY
}

# kl MODEL PCT: `sluice run --profile fast --kl-check` from disk, and the exact run's speed beside
# (a row of $W/kl.md, printed as a table of its own at the end).
kl() {
  local m=$1 pct=$2 pack=${PACK[$m]}
  local cache=$(( ${EXPERT_BYTES[$m]} * pct / 100 )) name="$m-kl-$pct"
  if [ $(( DEADLINE - $(el) )) -lt 45 ]; then say "$name: skipped (LIMIT)"; return 1; fi
  local n=$(( 3 * DISK_DECODE ))
  for profile in exact fast; do
    drop_caches
    local args=(--profile "$profile")
    [ "$profile" = fast ] && args+=(--kl-check "$KL_STEPS")
    timeout "$(tmo 90)" "$BIN/sluice" run --model "$pack" --expert-kind "${KIND[$m]}" --backend "$BACKEND" --tokens 1 -n "$n" \
      --temperature 0 --ignore-eos --expert-cache "$cache" --replay-routing "$TRACE" --replay-map "$REPLAY_MAP" \
      --wait-timeout 20 --stats "$W/rows/$name-$profile.stats.json" "${args[@]}" > /dev/null 2> "$W/rows/$name-$profile.log" ||
      { tail -2 "$W/rows/$name-$profile.log" >&2; say "$name $profile failed"; return 1; }
  done
  python3 - "$W/rows/$name-exact.stats.json" "$W/rows/$name-fast.stats.json" "$m" "$pct" <<'PY' >> "$W/kl.md"
import json, sys
e, f = (json.load(open(p))["run"] for p in sys.argv[1:3])
m, pct = sys.argv[3:]
kl = f["kl_check"] or {}
fe, ee = f["decode_tokens_per_second"], e["decode_tokens_per_second"]
cells = [m, f"{pct}%", f"{fe:.2f}", f"{ee:.2f}", f"{fe / ee:.2f}x" if ee > 0 else "-", f"{f['hit_rate']:.3f}",
         f"{e['hit_rate']:.3f}", str(f["totals"]["cut"]), f"{kl.get('mean_nats', float('nan')):.4f}",
         f"{kl.get('max_nats', float('nan')):.4f}", str(kl.get("steps", 0))]
print("| " + " | ".join(cells) + " |")
PY
}

: > "$W/kl.md"
IFS=, read -r -a caches <<< "$CACHES"
IFS=, read -r -a tiers <<< "$TIERS"
IFS=, read -r -a models <<< "$MODELS"
for phase in exact:off fast:off exact:on fast:on; do
  profile=${phase%:*}; look=${phase#*:}
  for m in "${models[@]}"; do
    for pct in "${caches[@]}"; do
      for tier in "${tiers[@]}"; do
        # fast with lookahead: its disk rows only (the host tier has no late miss to cut)
        [ "$phase" = fast:on ] && [ "$tier" = host ] && continue
        row "$m" "$tier" "$pct" "$profile" "$look"
      done
    done
    [ "$phase" = fast:off ] && kl "$m" "${caches[0]}"
  done
done
if [ -s "$W/kl.md" ]; then
  out ""
  out "\`sluice run --tokens 1 -n $(( 3 * DISK_DECODE )) --profile fast --kl-check $KL_STEPS\` from disk against the same run with \`--profile exact\` (decode phase; KL(exact || fast) in nats a token):"
  out ""
  out "| model | cache | fast tok/s | exact tok/s | fast / exact | fast hit rate | exact hit rate | cut | KL mean | KL max | steps checked |"
  out "|---|---|---|---|---|---|---|---|---|---|---|"
  cat "$W/kl.md" | tee -a "$MD"
fi
say "done; $MD and $W/rows"
