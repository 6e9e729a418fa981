#!/usr/bin/env bash
# prompt_cache.sh BIN_DIR: time to first token of turn 10 of a chat whose every turn resends
# the history (~8k tokens of it by turn 10), `sluice serve` with and without the prompt cache
# (--prompt-cache 0), experts resident and with a device expert cache of 10% of the pack's
# expert bytes whose misses come from a preloaded host tier. Prints a markdown table.
#   The model: MODEL (a pack with a tokenizer.json, or a checkpoint, converted to a q4 pack
#   first), else a synthetic pack
#   (`sluice synth --like LIKE --kinds q4 --layers LAYERS`) with models/demo's tokenizer copied
#   in (a synthetic pack has none; its prompts are the demo tokenizer's English text, its
#   replies random text, resent as they come back, as an agent resends its history).
#   The chat: turns 1-9 send USER_TOKENS new tokens each and take REPLY_TOKENS back; turn 10
#   sends LAST_USER_TOKENS new ones and asks for one token: its request's wall time and the
#   server's own time to first token (/metrics) are the measure. Turns 1-9 are the same text in
#   every run (greedy; a streamed run's tokens equal the resident run's).
# Run from the repository root, or anywhere: the script finds models/demo beside itself.
# Environment (defaults): LIKE (qwen3-30b-a3b), LAYERS (12), BACKEND (cuda), PORT (18090),
#   USER_TOKENS (850), REPLY_TOKENS (64), LAST_USER_TOKENS (200), CTX (10240), UBATCH (512),
#   PROMPT_CACHE (the size for the cached runs: 4G), HOST_CACHE (16G; 0: misses read from the
#   pack, no preload; the CPU backend has no preload), MODES (resident,cache10),
#   WORK (/tmp/prompt_cache: the synthetic pack, reused), OUT (WORK/out: logs), LIMIT (560 s:
#   every step runs under `timeout` of what is left of it).
# CPU example (the demo model, whose context is 1024 tokens):
#   MODEL=models/demo BACKEND=cpu USER_TOKENS=60 REPLY_TOKENS=24 LAST_USER_TOKENS=16 CTX=1024 \
#     UBATCH=128 HOST_CACHE=0 bench/gpu-suite/prompt_cache.sh build/bin
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../.." && pwd)
[ $# -eq 1 ] || { echo "usage: prompt_cache.sh BIN_DIR" >&2; exit 2; }
BIN=$(realpath "$1")
LIKE=${LIKE:-qwen3-30b-a3b}; LAYERS=${LAYERS:-12}; BACKEND=${BACKEND:-cuda}; PORT=${PORT:-18090}
USER_TOKENS=${USER_TOKENS:-850}; REPLY_TOKENS=${REPLY_TOKENS:-64}; LAST_USER_TOKENS=${LAST_USER_TOKENS:-200}
CTX=${CTX:-10240}; UBATCH=${UBATCH:-512}; PROMPT_CACHE=${PROMPT_CACHE:-4G}; HOST_CACHE=${HOST_CACHE:-16G}
MODES=${MODES:-resident,cache10}
W=${WORK:-/tmp/prompt_cache}; OUTD=${OUT:-$W/out}; mkdir -p "$W" "$OUTD"
DEADLINE=${LIMIT:-560}; NAME=prompt_cache.sh
source "$ROOT/bench/common.sh"
[ -x "$BIN/sluice" ] || die "$BIN/sluice: not an executable"

# The model.
if [ -n "${MODEL:-}" ] && [ -f "$MODEL/manifest.json" ]; then
  PACK=$(realpath "$MODEL")
  [ -f "$PACK/tokenizer.json" ] || die "$MODEL has no tokenizer.json"
elif [ -n "${MODEL:-}" ]; then  # a checkpoint: a q4 pack of it (its experts can then be streamed)
  [ -f "$MODEL/config.json" ] && [ -f "$MODEL/tokenizer.json" ] || die "$MODEL: neither a pack nor a checkpoint with a tokenizer"
  PACK=$W/$(basename "$(realpath "$MODEL")")-q4
  say "sluice convert $MODEL --kinds q4"
  timeout "$(tmo 300)" "$BIN/sluice" convert "$MODEL" "$PACK" --kinds q4 --force -q > "$OUTD/convert.log" 2>&1 \
    || { tail -3 "$OUTD/convert.log" >&2; die "convert failed"; }
  cp "$MODEL/tokenizer.json" "$MODEL/tokenizer_config.json" "$PACK/" 2>/dev/null
else
  PACK=$W/$LIKE-$LAYERS
  if [ ! -f "$PACK/manifest.json" ]; then
    say "sluice synth --like $LIKE --kinds q4 --layers $LAYERS"
    timeout "$(tmo 300)" "$BIN/sluice" synth --like "$LIKE" --kinds q4 --layers "$LAYERS" "$PACK" --force -q \
      > "$OUTD/synth.log" 2>&1 || { tail -3 "$OUTD/synth.log" >&2; die "synth failed"; }
  fi
  cp "$ROOT/models/demo/tokenizer.json" "$ROOT/models/demo/tokenizer_config.json" "$PACK/"
fi
EXPERTS=""
for k in q4 mxfp4 int8 bf16 q2; do [ -f "$PACK/experts.$k.bin" ] && { EXPERTS=$PACK/experts.$k.bin; break; }; done
if [ -n "$EXPERTS" ]; then CACHE=$(( $(stat -c %s "$EXPERTS") / 10 )); else CACHE=0; fi

trap serve_down EXIT

# The chat against a running server: one JSON line with turn 10's figures.
CHAT_PY='
import json, sys, time, urllib.request
url, user, reply, last = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
WORDS = ("the river ran slowly past the old mill where the children sat on the stone wall and counted "
         "the boats that came up from the harbour in the morning and went back down in the evening heavy "
         "with grain and wool until their mother called them in for supper").split()
def post(path, body):
    req = urllib.request.Request(url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    t = time.perf_counter()
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read()), time.perf_counter() - t
def metric(name):
    with urllib.request.urlopen(url + "/metrics", timeout=60) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return 0.0
# Tokens per word of this tokenizer, from one request, so that a turn has about the tokens asked.
probe = " ".join(WORDS[i % len(WORDS)] for i in range(200))
per_word = post("/v1/completions", {"prompt": probe, "max_tokens": 0})[0]["usage"]["prompt_tokens"] / 200.0
def text(turn, tokens):
    n = max(1, int(tokens / per_word))
    return " turn %d: " % turn + " ".join(WORDS[(turn * 7 + i) % len(WORDS)] for i in range(n))
history = ""
for turn in range(1, 10):
    history += text(turn, user)
    out, _ = post("/v1/completions", {"prompt": history, "max_tokens": reply, "temperature": 0})
    history += out["choices"][0]["text"]
history += text(10, last)
ttft0, n0 = metric("sluice_time_to_first_token_seconds_sum"), metric("sluice_time_to_first_token_seconds_count")
out, wall = post("/v1/completions", {"prompt": history, "max_tokens": 1, "temperature": 0})
ttft = (metric("sluice_time_to_first_token_seconds_sum") - ttft0) / max(1.0, metric("sluice_time_to_first_token_seconds_count") - n0)
u = out["usage"]
print(json.dumps({"prompt_tokens": u["prompt_tokens"], "cached_tokens": u.get("prompt_tokens_details", {}).get("cached_tokens", 0),
                  "wall_s": wall, "ttft_s": ttft}))
'

run() {  # NAME PROMPT_CACHE SERVE_OPTIONS...: one server, one chat; prints "prompt cached wall ttft"
  local name=$1 pc=$2; shift 2
  say "$name: sluice serve --model $PACK --prompt-cache $pc $*"
  serve_up "$BIN" "$OUTD/serve_$name.log" "$PORT" --model "$PACK" --backend "$BACKEND" --parallel 2 --ctx "$CTX" \
    --ubatch "$UBATCH" --prompt-cache "$pc" "$@" || { say "$name: the server did not come up"; return 1; }
  local rc=0
  timeout "$(tmo 500)" python3 -c "$CHAT_PY" "http://127.0.0.1:$PORT" "$USER_TOKENS" "$REPLY_TOKENS" "$LAST_USER_TOKENS" \
    > "$OUTD/$name.json" 2> "$OUTD/chat_$name.log" || rc=$?
  serve_down
  [ $rc = 0 ] || { tail -5 "$OUTD/chat_$name.log" >&2; say "$name: the chat failed"; return 1; }
  python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print(j['prompt_tokens'], j['cached_tokens'], '%.4f' % j['wall_s'], '%.4f' % j['ttft_s'])" \
    "$OUTD/$name.json"
}

echo "**Time to first token of turn 10, $(basename "$PACK") ($BACKEND, --ubatch $UBATCH; turns of $USER_TOKENS tokens and $REPLY_TOKENS-token replies, turn 10 adds $LAST_USER_TOKENS)**"
echo
echo "| experts | prompt cache | turn 10 prompt | cached | TTFT (request) | TTFT (server) | speed-up |"
echo "|---|---|---:|---:|---:|---:|---:|"
status=0
IFS=, read -ra modes <<< "$MODES"
for mode in "${modes[@]}"; do
  case $mode in
    resident) opts=(); label="resident" ;;
    cache10)
      [ "$CACHE" -gt 0 ] || { say "cache10: no expert file in $PACK"; continue; }
      if [ "$HOST_CACHE" = 0 ]; then opts=(--expert-cache "$CACHE"); label="10% cache, misses from the pack"
      else opts=(--expert-cache "$CACHE" --host-cache "$HOST_CACHE" --host-cache-preload); label="10% cache + $HOST_CACHE host tier"; fi ;;
    *) die "unknown mode '$mode' (resident, cache10)" ;;
  esac
  off=$(run "${mode}_off" 0 "${opts[@]}") || { status=1; continue; }
  on=$(run "${mode}_on" "$PROMPT_CACHE" "${opts[@]}") || { status=1; continue; }
  read -r p0 c0 w0 t0 <<< "$off"; read -r p1 c1 w1 t1 <<< "$on"
  echo "| $label | off | $p0 | $c0 | ${w0} s | ${t0} s | |"
  echo "| $label | $PROMPT_CACHE | $p1 | $c1 | ${w1} s | ${t1} s | $(python3 -c "print('%.1fx' % ($t0 / max($t1, 1e-9)))") |"
done
say "done (status $status; logs in $OUTD)"
exit $status
