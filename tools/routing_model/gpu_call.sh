#!/usr/bin/env bash
# gpu_call.sh BIN_DIR OUT_DIR: the larger routing model on a GPU machine within ten minutes
# (everything kept is written to OUT_DIR, each file under 16 MiB): the Python
# sources installed there as text, `sluice tokenize`, train.py on the GPU for TRAIN_SECONDS,
# the held-out perplexity from torch and from `sluice perplexity` (CPU backend, the exact
# reference), the routing trace with the lookahead's predictions (xz), and the fast profile's
# speed and KL on it (exact and fast decode from the disk through a 10% cache, --kl-check 32).
#   BIN_DIR: holds sluice (LD_LIBRARY_PATH set for its libraries).
# Environment (defaults): TRAIN_SECONDS (300), HIDDEN (512), LAYERS (12), EXPERTS (64), TOP_K (8),
#   EXPERT_WIDTH (256): about 310M parameters; CTX (512), BATCH (32), LR (1e-3), WINDOWS (24
#   held-out windows in the trace), WORK (/tmp/routing_model), DEVICE (cuda; cpu to try the
#   script on a small model elsewhere), PYTHON (python3), FAST_BACKEND (cuda: the profile runs').
set -uo pipefail
[ $# -eq 2 ] || { echo "usage: gpu_call.sh BIN_DIR OUT_DIR" >&2; exit 2; }
BIN=$(realpath "$1"); OUTD=$2; mkdir -p "$OUTD"
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../.." && pwd)
W=${WORK:-/tmp/routing_model}; mkdir -p "$W"
T0=$(date +%s); say() { echo "gpu_call.sh: [$(( $(date +%s) - T0 )) s] $*" >&2; }

LIBS=$("${PYTHON:-python3}" -c "import site, sys; print(' '.join(p for p in site.getsitepackages() + [sys.prefix + '/lib/python%d.%d' % sys.version_info[:2]]))")
say "corpus from: $LIBS"
"${PYTHON:-python3}" "$HERE/prepare_code_corpus.py" $LIBS "$W/corpus" | tee "$OUTD/corpus.txt"
"${PYTHON:-python3}" - "$W/corpus" <<'PY'
import sys
d = sys.argv[1]
s = open(d + "/heldout.txt", "rb").read()[:240000]
i = max(j for j in range(len(s) - 1) if s[j] == 10 and 33 <= s[j + 1] < 127)
open(d + "/heldout_eval.txt", "wb").write(s[:i + 1])
PY
for f in train heldout heldout_eval; do
  "$BIN/sluice" tokenize --model "$ROOT/models/demo" --file "$W/corpus/$f.txt" --format u32 --out "$W/corpus/$f.u32" || exit 1
done
say "training for ${TRAIN_SECONDS:-300} s"
"${PYTHON:-python3}" "$HERE/train.py" "$W/corpus" "$ROOT/models/demo" "$W/m" --device "${DEVICE:-cuda}" --seconds "${TRAIN_SECONDS:-300}" \
  --hidden "${HIDDEN:-512}" --layers "${LAYERS:-12}" --experts "${EXPERTS:-64}" --top-k "${TOP_K:-8}" \
  --expert-width "${EXPERT_WIDTH:-256}" --ctx "${CTX:-512}" --batch "${BATCH:-32}" --lr "${LR:-1e-3}" --eval-every 100 \
  2>&1 | tee "$OUTD/train.log" | tail -5
cp "$W/m/reference.json" "$OUTD/" 2>/dev/null || { say "no model"; exit 1; }
say "sluice perplexity (CPU backend)"
"$BIN/sluice" perplexity --model "$W/m/model" --backend cpu --file "$W/corpus/heldout_eval.txt" --ctx "${CTX:-512}" \
  2>&1 | tee "$OUTD/sluice_perplexity.txt"
say "trace"
"${PYTHON:-python3}" "$HERE/make_trace.py" "$BIN/sluice" "$W/m/model" "$W/corpus/heldout_eval.txt" "$W/trace.jsonl" \
  --windows "${WINDOWS:-24}" --ctx "${CTX:-512}" | tee "$OUTD/trace.txt"
xz -9 -T0 -c "$W/trace.jsonl" > "$OUTD/routing-model-gpu.jsonl.xz"
# The fast profile on a trained model: decode from the disk through a 10% device
# cache, exact and fast, the fast one checked against exact steps (--kl-check).
say "fast profile"
"$BIN/sluice" convert "$W/m/model" "$W/pack" --kinds q4,q2 --force -q 2>&1 | tail -1
EB=$(stat -c %s "$W/pack/experts.q4.bin"); PROMPT=$(head -c 1500 "$W/corpus/heldout_eval.txt")
# Then both with --lookahead on (whether the lookahead pays on trained routing: its default).
for run in exact fast exact-lookahead fast-lookahead; do
  [ $(( $(date +%s) - T0 )) -lt 500 ] || { say "no time left for $run"; continue; }
  sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null
  prof=${run%%-*}; extra=()
  [ "$prof" = fast ] && extra+=(--kl-check 32)
  [ "$run" != "$prof" ] && extra+=(--lookahead on)
  timeout 100 "$BIN/sluice" run --model "$W/pack" --expert-kind q4 --backend "${FAST_BACKEND:-cuda}" \
    --expert-cache $(( EB / 10 )) --profile $prof --prompt "$PROMPT" -n 128 --temperature 0 --ignore-eos \
    --stats "$OUTD/profile_$run.json" "${extra[@]}" 2>&1 >/dev/null | grep -E "^sluice: " | tee "$OUTD/profile_$run.txt"
done
ls -la "$OUTD"
say "done"
