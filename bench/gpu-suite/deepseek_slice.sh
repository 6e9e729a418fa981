#!/usr/bin/env bash
# deepseek_slice.sh BIN_DIR: the DeepSeek-V3-shaped slice (the 3 dense layers and the first 8
# MoE layers: `sluice synth --like deepseek-v3 --layers 11`, 256 experts of [2048, 7168] in 8
# groups, multi-head latent attention with its latent KV cache) on the GPU, through
# bench/family_decode.sh:
#   - resident decode tok/s against the slice's memory roofline (the dense tensors and top-8
#     expert records of every MoE layer a token, over HBM_GBPS);
#   - streamed with device caches of 5% and 10% of the expert bytes, experts from the disk
#     (page cache dropped) and from a preloaded host tier: tok/s, hit rate, GB moved, the
#     IO bound and the run's time over it;
# then the latent KV cache's bytes a token (from -v), and the full-depth projection: the 58 MoE
# layers' reads at the streamed rows' measured bytes a MoE layer, over this machine's disk and
# NVMe drives of 7 and 14 GB/s (IO bound only; the compute of the full depth is the resident
# row's time a layer times 61).
# The synthetic routers send nearly every token to the same experts, so the streamed rows
# measure a cache that mostly hits; replayed routing (DESIGN.md) gives realistic locality.
# Disk (sluice synth --dry-run): the slice is 61.7 GB with q4 experts (50.7 GB of experts,
# 10.9 GB of bf16 dense weights), 56.0 GB with q2, 58.9 GB with mxfp4; DENSE=int8 halves the
# dense part. A 64 GiB disk takes KIND=q2 DENSE=int8 (about 51 GB); the 128 GiB of the
# two-GPU machines take the q4 slice.
# Environment: KIND (q4), DENSE (bf16), CACHES (5,10), TIERS (disk,host), LAYERS (11), WORK
# (/tmp/deepseek_slice), KEEP_SLICE (0: the pack is removed at the end), DEADLINE (s, 570), and
# family_decode.sh's own.
set -uo pipefail
[ $# -eq 1 ] || { echo "usage: deepseek_slice.sh BIN_DIR" >&2; exit 2; }
BIN=$(realpath "$1")
HERE=$(cd "$(dirname "$0")/.." && pwd)
export LIKE=deepseek-v3 KIND=${KIND:-q4} LAYERS=${LAYERS:-11} CACHES=${CACHES:-5,10} TIERS=${TIERS:-disk,host}
export WORK=${WORK:-/tmp/deepseek_slice} DEADLINE=${DEADLINE:-570} KEEP=1
DENSE=${DENSE:-bf16}
mkdir -p "$WORK"
export PACK=$WORK/pack-$LIKE-$KIND-$DENSE-$LAYERS
if [ ! -f "$PACK/manifest.json" ]; then
  need=$("$BIN/sluice" synth --like "$LIKE" --layers "$LAYERS" --kinds "$KIND" --dense "$DENSE" --dry-run "$PACK" 2>&1 |
         awk '/^ *total/ {print int($2 / 1e9) + 1}')
  free_gb=$(df -BG --output=avail "$WORK" | tail -1 | tr -dc '0-9')
  echo "deepseek_slice.sh: the slice needs ${need:-?} GB, $free_gb GB free under $WORK" >&2
  [ -n "$need" ] && [ "$free_gb" -lt "$need" ] && { echo "deepseek_slice.sh: not enough disk (KIND=q2 DENSE=int8, or WORK elsewhere)" >&2; exit 1; }
  timeout 900 "$BIN/sluice" synth --like "$LIKE" --layers "$LAYERS" --kinds "$KIND" --dense "$DENSE" "$PACK" --force -q ||
    { echo "deepseek_slice.sh: synth failed" >&2; exit 1; }
fi
ROWS=$WORK/rows.md
"$HERE/family_decode.sh" "$BIN" | tee "$ROWS"
# The latent cache's bytes a token, as -v reports it.
if [ -f "$PACK/manifest.json" ]; then
  timeout 120 "$BIN/sluice" logits --model "$PACK" --expert-kind "$KIND" --tokens 1,2,3 --out "$WORK/x.npy" -v 2>&1 |
    grep -m1 "latent KV cache" || echo "deepseek_slice.sh: no latent KV cache line from -v" >&2
fi
# Full-depth projection from the streamed rows (IO only): bytes a MoE layer and token, times 58.
# (EXTRA="--replay-routing traces/..." gives the streamed rows a trained model's locality.)
python3 - "$ROWS" "$WORK" "$(( LAYERS - 3 ))" <<'PY'
import glob, json, os, sys
rows, work, moe_layers = sys.argv[1], sys.argv[2], int(sys.argv[3])  # the slice's MoE layers (3 dense first)
print("| streamed run | GB a MoE layer a token | full depth (58 MoE layers) GB a token | tok/s bound at 7 GB/s | at 14 GB/s |")
print("|---|---|---|---|---|")
for f in sorted(glob.glob(os.path.join(work, "c*_*.json"))):
    d = json.load(open(f))["run"]
    p = d["phases"]["decode"]
    moved = p["bytes_read_demand"] + p["bytes_read_prefetch"]
    toks = max(1, d.get("decode_tokens", 0) or p.get("steps", 1))
    per_layer = moved / toks / moe_layers
    full = per_layer * 58
    name = os.path.basename(f)[:-5]
    t7 = 7e9 / full if full else float("inf")
    t14 = 14e9 / full if full else float("inf")
    print(f"| {name} | {per_layer / 1e9:.3f} | {full / 1e9:.2f} | {t7:.2f} | {t14:.2f} |")
PY
[ "${KEEP_SLICE:-0}" = 1 ] || rm -rf "$PACK"
