#!/usr/bin/env bash
# family_decode.sh BIN_DIR: decode speed of one family's synthetic pack on one backend, resident
# and streamed. `sluice synth --like $LIKE --kinds $KIND --layers $LAYERS` in $WORK (reused
# while its manifest is there; or PACK, a pack of KIND experts to use as it is), then
# `sluice run` of PROMPT random ids and DECODE greedy tokens:
#   - resident (every expert on the device): decode tok/s, and the bytes one decode token
#     touches (the dense tensors but the input embedding table, which is read a row a token,
#     plus top-k expert records in every MoE layer; the KV cache of a short prompt is left out)
#     over HBM_GBPS: the roofline, and the share of it reached;
#   - streamed with device caches of CACHES percent of the expert bytes, experts from the disk
#     (page cache dropped; bytes read / the disk's O_DIRECT bandwidth measured here) and from a
#     preloaded host tier (bytes copied / H2D_GBPS): decode tok/s, hit rate, GB moved in
#     the decode, the IO bound and the run's decode time over it.
# Prints a markdown table. Environment (defaults): LIKE (gpt-oss-120b), KIND (mxfp4), LAYERS
#   (12), BACKEND (cuda), PROMPT (16), DECODE (64; DISK_DECODE 24 for the disk rows), CACHES
#   (10,25), TIERS (disk,host), HBM_GBPS (4000: an H200's copy bandwidth, rounded),
#   H2D_GBPS (55), WORK (/tmp/family_decode), DEADLINE (s, 570), KEEP (0: a pack synthesized here
#   is removed at the end, for the next family's room on the 64 GiB disk), RESIDENT (1: 0 skips
#   the resident row), EXTRA (options added to every streamed run, e.g. "--profile fast" or
#   "--fake-experts"; named in the table).
set -uo pipefail
[ $# -eq 1 ] || { echo "usage: family_decode.sh BIN_DIR" >&2; exit 2; }
BIN=$(realpath "$1")
LIKE=${LIKE:-gpt-oss-120b}; KIND=${KIND:-mxfp4}; LAYERS=${LAYERS:-12}; BACKEND=${BACKEND:-cuda}
PROMPT=${PROMPT:-16}; DECODE=${DECODE:-64}; DISK_DECODE=${DISK_DECODE:-24}; CACHES=${CACHES:-10,25}
TIERS=${TIERS:-disk,host}; HBM_GBPS=${HBM_GBPS:-4000}; H2D_GBPS=${H2D_GBPS:-55}
W=${WORK:-/tmp/family_decode}; DEADLINE=${DEADLINE:-570}; KEEP=${KEEP:-0}; RESIDENT=${RESIDENT:-1}
read -r -a EXTRA_ARGS <<< "${EXTRA:-}"
mkdir -p "$W"
NAME=family_decode.sh
. "$(dirname "$0")/common.sh"
[ -x "$BIN/sluice" ] || die "$BIN/sluice: not an executable"

if [ -n "${PACK:-}" ]; then
  [ -f "$PACK/manifest.json" ] || die "$PACK: not a pack (no manifest.json)"
else
  PACK=$W/pack-$LIKE-$KIND-$LAYERS
  if [ ! -f "$PACK/manifest.json" ]; then
    synth_pack "$BIN" "$LIKE" "$KIND" "$LAYERS" "$PACK"
  fi
  [ "$KEEP" = 1 ] || trap 'rm -rf "$PACK"' EXIT
fi
EXPERTS="$PACK/experts.$KIND.bin"
[ -f "$EXPERTS" ] || die "$PACK has no $KIND experts"
EXPERT_BYTES=$(stat -c %s "$EXPERTS")
# vocab, MoE layers, top-k, the record stride and the bytes a decode token touches (see above).
read -r VOCAB MOE_LAYERS TOPK TOUCHED < <(python3 - "$PACK/manifest.json" "$KIND" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
c = m["config"]; t = c.get("text_config", c)
k = t.get("num_experts_per_tok") or t.get("top_k_experts") or t.get("experts_per_token")
layers = len(m["experts"]["layers"])
stride = m["kinds"][sys.argv[2]]["record_stride"]
tied = bool(t.get("tie_word_embeddings", c.get("tie_word_embeddings", False)))
dense = 0
for x in m["dense"]["tensors"]:
    n = x["name"]
    if ("embed_tokens" in n and not tied) or "per_layer" in n and "embed" in n: continue
    dense += x["bytes"]
print(t["vocab_size"], layers, k, dense + layers * k * stride)
PY
) || die "cannot read $PACK/manifest.json"
IDS=$(random_ids "$VOCAB" "$PROMPT")

DROPS=yes; drop_caches || DROPS=no
DISK_GBPS=$(disk_gbps "$EXPERTS")
say "$(basename "$PACK"): experts $((EXPERT_BYTES / 1000000)) MB, top-$TOPK, $((TOUCHED / 1000000)) MB a decode token; disk O_DIRECT $DISK_GBPS GB/s, page cache dropped: $DROPS"

run() {  # NAME N ARGS...: one run, its output in $W/NAME.log
  local name=$1 n=$2; shift 2
  timeout "$(tmo 240)" "$BIN/sluice" run --model "$PACK" --expert-kind "$KIND" --backend "$BACKEND" --tokens "$IDS" -n "$n" \
    --temperature 0 --ignore-eos "$@" > "$W/$name.log" 2>&1 ||
    { tail -3 "$W/$name.log" >&2; say "$name failed"; return 1; }
}
echo "| $(basename "$PACK") ($KIND)${EXTRA:+, $EXTRA} | experts from | decode tok/s | hit rate | GB moved (decode) | bound s | decode s | decode / bound |"
echo "|---|---|---|---|---|---|---|---|"
if [ "$RESIDENT" = 1 ] && run resident "$DECODE"; then
  python3 - "$W/resident.log" "$TOUCHED" "$HBM_GBPS" <<'PY'
import re, sys
m = re.search(r"generated (\d+) tokens, ([0-9.]+) tok/s", open(sys.argv[1]).read())
tps, touched, hbm = float(m.group(2)), int(sys.argv[2]), float(sys.argv[3])
roof = hbm * 1e9 / touched
print(f"| resident | - | {tps:.1f} | 1 | - | roofline {roof:.0f} tok/s ({touched / 1e6:.0f} MB a token at {hbm:.0f} GB/s) | - | {tps / roof:.0%} of the roofline |")
PY
fi
for pct in ${CACHES//,/ }; do
  cache=$(( EXPERT_BYTES * pct / 100 ))
  for tier in ${TIERS//,/ }; do
    name="c${pct}_$tier"; n=$DECODE; extra=()
    if [ "$tier" = host ]; then extra=(--host-cache "$EXPERT_BYTES" --host-cache-preload); else n=$DISK_DECODE; drop_caches; fi
    run "$name" "$n" --expert-cache "$cache" --stats "$W/$name.json" "${extra[@]}" "${EXTRA_ARGS[@]}" || continue
    python3 - "$W/$name.json" "$pct" "$tier" "$DISK_GBPS" "$H2D_GBPS" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))["run"]
pct, tier, disk, h2d = sys.argv[2], sys.argv[3], float(sys.argv[4]), float(sys.argv[5])
p = d["phases"]["decode"]
moved = p["bytes_read_demand"] + p["bytes_read_prefetch"]
bw = h2d if tier == "host" else disk
bound = moved / bw / 1e9 if bw > 0 else float("nan")
secs = d["decode_seconds"]
print(f"| {pct}% | {tier} | {d['decode_tokens_per_second']:.1f} | {p['hit_rate']:.3f} | {moved / 1e9:.2f} | {bound:.3f} | {secs:.3f} | {secs / bound:.2f}x |")
PY
  done
done
say "done; logs and stats in $W"
