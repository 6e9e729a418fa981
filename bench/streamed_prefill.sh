#!/usr/bin/env bash
# streamed_prefill.sh BIN_DIR [PACK]: the streamed prefill against its bounds. A prompt of
# TOKENS random ids through `sluice run -n 1`, resident and streamed with device caches of
# CACHES percent of the pack's expert bytes, experts from the disk and from a preloaded
# host tier; prints a markdown table: prefill tok/s, sub-batches a layer, GB moved, the
# IO bound (bytes read / the disk's O_DIRECT bandwidth measured here; host tier: bytes copied /
# H2D_GBPS), the compute bound (the resident prefill's time) and the run's time over the larger.
#   BIN_DIR: holds sluice (LD_LIBRARY_PATH set for its libraries).
#   PACK: a pack; default: `sluice synth --like $LIKE --kinds $KIND --layers $LAYERS` in $WORK
#         (reused when its manifest is there).
# Environment (defaults): BACKEND (cuda), LIKE (qwen3-30b-a3b), LAYERS (48), KIND (q4), TOKENS
#   (2048), CACHES (10,25), TIERS (disk,host), H2D_GBPS (55: an H100's or H200's pinned copy),
#   WORK (/tmp/streamed_prefill), DEADLINE (570 s: every run under `timeout` of what is left),
#   LOOKAHEAD (off: the streamed runs' --lookahead; on prefetches each sub-batch's prediction of
#   the next layer).
# Runs as root to drop the page cache before each disk run (else the disk rows read from RAM
# and say so).
set -uo pipefail
[ $# -ge 1 ] && [ $# -le 2 ] || { echo "usage: streamed_prefill.sh BIN_DIR [PACK]" >&2; exit 2; }
BIN=$(realpath "$1")
BACKEND=${BACKEND:-cuda}; LIKE=${LIKE:-qwen3-30b-a3b}; LAYERS=${LAYERS:-48}; KIND=${KIND:-q4}
TOKENS=${TOKENS:-2048}; CACHES=${CACHES:-10,25}; TIERS=${TIERS:-disk,host}; H2D_GBPS=${H2D_GBPS:-55}
W=${WORK:-/tmp/streamed_prefill}; DEADLINE=${DEADLINE:-570}; LOOKAHEAD=${LOOKAHEAD:-off}
mkdir -p "$W"
NAME=streamed_prefill.sh
. "$(dirname "$0")/common.sh"
[ -x "$BIN/sluice" ] || die "$BIN/sluice: not an executable"

PACK=${2:-$W/pack}
if [ ! -f "$PACK/manifest.json" ]; then
  [ $# -eq 2 ] && die "$PACK: not a pack (no manifest.json)"
  synth_pack "$BIN" "$LIKE" "$KIND" "$LAYERS" "$PACK"
fi
EXPERTS="$PACK/experts.$KIND.bin"
[ -f "$EXPERTS" ] || die "$PACK has no $KIND experts"
EXPERT_BYTES=$(stat -c %s "$EXPERTS")
MOE_LAYERS=$(python3 -c "import json,sys; print(len(json.load(open(sys.argv[1]))['experts']['layers']))" "$PACK/manifest.json")
VOCAB=$(python3 -c "import json,sys; c=json.load(open(sys.argv[1]))['config']; print(c.get('vocab_size') or c['text_config']['vocab_size'])" "$PACK/manifest.json")
IDS=$(random_ids "$VOCAB" "$TOKENS")

DROPS=yes; drop_caches || DROPS=no
DISK_GBPS=$(disk_gbps "$EXPERTS")
say "experts $((EXPERT_BYTES / 1000000)) MB, disk O_DIRECT $DISK_GBPS GB/s, page cache dropped: $DROPS"

run() {  # NAME ARGS...: one prefill; stats in $W/NAME.json
  local name=$1; shift
  drop_caches
  timeout "$(tmo 240)" "$BIN/sluice" run --model "$PACK" --expert-kind "$KIND" --backend "$BACKEND" --tokens "$IDS" -n 1 \
    --temperature 0 --ignore-eos "$@" > "$W/$name.log" 2>&1 || { tail -3 "$W/$name.log" >&2; say "$name failed"; return 1; }
}
# The resident prefill: the compute bound. Its time comes from the run's summary line.
run resident || die "the resident run failed"
RES_TPS=$(python3 -c "import re,sys; m=re.search(r'prompt (\d+) tokens, ([0-9.]+) tok/s', open(sys.argv[1]).read()); print(m.group(2))" "$W/resident.log")

echo "| cache | experts from | prefill tok/s | sub-batches a layer | GB moved | IO bound s | compute bound s | time s | time / max(bounds) |"
echo "|---|---|---|---|---|---|---|---|---|"
echo "| all (resident) | - | $RES_TPS | - | - | - | $(python3 -c "print(round($TOKENS/$RES_TPS, 3))") | $(python3 -c "print(round($TOKENS/$RES_TPS, 3))") | 1 |"
for pct in ${CACHES//,/ }; do
  cache=$(( EXPERT_BYTES * pct / 100 ))
  for tier in ${TIERS//,/ }; do
    name="c${pct}_$tier"
    extra=()
    [ "$tier" = host ] && extra=(--host-cache "$EXPERT_BYTES" --host-cache-preload)
    run "$name" --expert-cache "$cache" --lookahead "$LOOKAHEAD" --stats "$W/$name.json" "${extra[@]}" || continue
    python3 - "$W/$name.json" "$pct" "$tier" "$DISK_GBPS" "$H2D_GBPS" "$TOKENS" "$RES_TPS" "$MOE_LAYERS" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))["run"]
pct, tier, disk, h2d, tokens, res_tps = sys.argv[2], sys.argv[3], float(sys.argv[4]), float(sys.argv[5]), int(sys.argv[6]), float(sys.argv[7])
moe_layers = int(sys.argv[8])
p = d["phases"]["prefill"]
secs = d["prefill_seconds"]
moved = d["io"]["h2d_bytes"] if tier == "host" else d["io"]["bytes"]
io = moved / (h2d if tier == "host" else disk) / 1e9 if (h2d if tier == "host" else disk) > 0 else float("nan")
compute = tokens / res_tps
sub = p["steps"] / moe_layers
print(f"| {pct}% | {tier} | {tokens / secs:.1f} | {sub:.1f} | {moved / 1e9:.2f} | {io:.3f} | {compute:.3f} | {secs:.3f} | {secs / max(io, compute):.2f}x |")
PY
  done
done
say "done; logs and stats in $W"
