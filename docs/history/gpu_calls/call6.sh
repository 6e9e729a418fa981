#!/usr/bin/env bash
# Issue 13, fifteenth session, after call5: the side by side with early launches on
# (SLUICE_CUDA_EARLY=1), then on the same pack sluice's decode rows with it off and on,
# alternating, for the in-call ratio. About 7 minutes.
set -uo pipefail
cd "$(dirname "$0")/../.."
tar xJf .carry/bins.txz -C .carry
export LD_LIBRARY_PATH=$PWD/.carry/lib
T0=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader
SLUICE_CUDA_EARLY=1 OUT=$OUT/sbs bash .carry/peer/side_by_side.sh .carry/bin 12
echo "side by side done at $(( $(date +%s)-T0 )) s"
long=$(python3 -c "print(','.join(str(100 + i % 5000) for i in range(8192)))")
sr() { timeout 100 .carry/bin/sluice run --model /tmp/sbs/pack --backend cuda --ignore-eos --temperature 0 -n 128 "$@" 2>&1 >/dev/null | grep -o "generated [0-9]* tokens, [0-9.]* tok/s" | grep -o "[0-9.]* tok/s"; }
echo "| early | decode 128 tok/s | after 8192 tok/s |"
echo "|---|---|---|"
for e in 0 1 0 1; do
  [ $(( $(date +%s)-T0 )) -lt 540 ] || break
  echo "| $e | $(SLUICE_CUDA_EARLY=$e sr --tokens 1) | $(SLUICE_CUDA_EARLY=$e sr --tokens "$long") |"
done
# Where the streamed step's time goes (issue 13's host-RAM row): decode from a 10% device cache
# and the preloaded host tier, the stats' decode phase (spin waits, then block).
cache=$(( $(stat -c %s /tmp/sbs/pack/experts.q4.bin) / 10 ))
for w in spin block; do
  [ $(( $(date +%s)-T0 )) -lt 560 ] || break
  echo "## host tier, --wait $w: $(timeout 60 .carry/bin/sluice run --model /tmp/sbs/pack --backend cuda --ignore-eos --temperature 0 -n 128 --tokens 1 \
    --expert-cache $cache --host-cache 16G --host-cache-preload --wait $w --stats $OUT/hostram_$w.json 2>&1 >/dev/null | grep -o "generated [0-9]* tokens, [0-9.]* tok/s")"
  python3 - $OUT/hostram_$w.json <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))["run"]
d = r["phases"]["decode"]
n = max(r.get("decode_tokens", 1), 1)
print("decode %.3f s for %d tokens; per token: service wall %.1f us, demand wait %.1f us, misses %.2f, hits %.2f, host hits %.2f" % (
    r["decode_seconds"], n, 1e6 * d["service_wall_seconds"] / n, 1e6 * d["demand_wait_seconds"] / n,
    d["misses"] / n, d["hits"] / n, d["host_hits"] / n))
PY
done
echo "total $(( $(date +%s)-T0 )) s"
