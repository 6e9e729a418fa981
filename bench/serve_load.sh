#!/usr/bin/env bash
# serve_load.sh MODEL BIN_DIR: `sluice serve` under concurrent streaming clients
# (bench/serve_load.py), resident and with a device expert cache of 10% of the pack's expert
# bytes; prints a markdown table for each.
#   MODEL: a pack (manifest.json), an HF checkpoint (config.json; converted to a q4 pack with
#          bf16 dense weights, as the peer comparison does), or `peer`: the side by side's
#          LAYERS-layer Qwen3-30B-A3B-shaped checkpoint (bench/peer/make_model.py: random bf16
#          weights, needs torch and a GPU) with the Qwen3 tokenizer files of TOK_DIR.
#   BIN_DIR: holds sluice (LD_LIBRARY_PATH set for its libraries).
# Environment (defaults): TOK_DIR (a folder with the Qwen3 tokenizer.json and
#   tokenizer_config.json), LAYERS (12), BACKEND (cuda), PORT (18080),
#   CLIENTS (1,8,32,64), REQUESTS (2 per client), PROMPT_TOKENS (128), MAX_TOKENS (128),
#   PARALLEL (64 sequences), CTX (1024 tokens each), HOST_CACHE (16G: the cached run's misses
#   come from a preloaded host tier, as side_by_side.sh's "experts in host RAM" row;
#   0: from the pack on disk), WORK (/tmp/serve_load: checkpoint and pack; a finished pack is
#   reused), OUT (/tmp/serve_load/out: logs and JSON), ENDPOINT (completions; chat goes through
#   the chat template), FORMATS (text; a list of serve_load.py's --response-format values, e.g.
#   text,json_schema: each run loads the server once per format), RUNS (resident,cache10),
#   DEADLINE (570 s: every step runs under
#   `timeout` of at most what is left of it, so that a hang cannot outlast the deadline).
# The server is stopped (SIGTERM, then SIGKILL) after each run.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
[ $# -eq 2 ] || { echo "usage: serve_load.sh MODEL|peer BIN_DIR" >&2; exit 2; }
MODEL=$1; BIN=$(realpath "$2")
LAYERS=${LAYERS:-12}; BACKEND=${BACKEND:-cuda}; PORT=${PORT:-18080}
CLIENTS=${CLIENTS:-1,8,32,64}; REQUESTS=${REQUESTS:-2}; PROMPT_TOKENS=${PROMPT_TOKENS:-128}
ENDPOINT=${ENDPOINT:-completions}; FORMATS=${FORMATS:-text}; RUNS=${RUNS:-resident,cache10}
MAX_TOKENS=${MAX_TOKENS:-128}; PARALLEL=${PARALLEL:-64}; CTX=${CTX:-1024}; HOST_CACHE=${HOST_CACHE:-16G}
W=${WORK:-/tmp/serve_load}; OUTD=${OUT:-$W/out}; mkdir -p "$W" "$OUTD"
DEADLINE=${DEADLINE:-570}; NAME=serve_load.sh
source "$HERE/common.sh"
[ -x "$BIN/sluice" ] || die "$BIN/sluice: not an executable"

# The pack.
convert() {  # HF_DIR: a q4 pack with bf16 dense weights at $W/pack
  say "converting $1"
  rm -rf "$W/pack" "$W/pack.done"
  timeout "$(tmo 300)" "$BIN/sluice" convert "$1" "$W/pack" --kinds q4 --dense bf16 -q --force > "$OUTD/convert.log" 2>&1 \
    || { tail -5 "$OUTD/convert.log" >&2; die "sluice convert failed (log: $OUTD/convert.log)"; }
  touch "$W/pack.done"
}
if [ "$MODEL" = peer ]; then
  PACK=$W/pack
  if [ -f "$W/pack.done" ] && [ "$(cat "$W/layers" 2>/dev/null)" = "$LAYERS" ]; then
    say "reusing the $LAYERS-layer pack at $PACK"
  else
    [ -f "${TOK_DIR:-}/tokenizer.json" ] || die "set TOK_DIR to a folder with the Qwen3 tokenizer files"
    rm -rf "$W/hf"
    say "making the $LAYERS-layer peer checkpoint"
    timeout "$(tmo 300)" python3 "$HERE/peer/make_model.py" "$W/hf" "$LAYERS" > "$OUTD/make_model.log" 2>&1 \
      || { tail -5 "$OUTD/make_model.log" >&2; die "make_model.py failed (log: $OUTD/make_model.log)"; }
    cp "$TOK_DIR"/tokenizer.json "$TOK_DIR"/tokenizer_config.json "$W/hf/"
    convert "$W/hf"
    echo "$LAYERS" > "$W/layers"
    rm -rf "$W/hf"  # 16 GB for 12 layers; the pack is what runs
  fi
elif [ -f "$MODEL/manifest.json" ]; then
  PACK=$MODEL
elif [ -f "$MODEL/config.json" ]; then
  convert "$MODEL"; PACK=$W/pack; rm -f "$W/layers"
else
  die "$MODEL: neither a pack (manifest.json), an HF checkpoint (config.json) nor 'peer'"
fi
EXPERTS=""  # the kind serve picks by default: the first of q4, int8, bf16, q2 the pack holds
for k in q4 int8 bf16 q2; do [ -f "$PACK/experts.$k.bin" ] && { EXPERTS=$PACK/experts.$k.bin; break; }; done
[ -n "$EXPERTS" ] || die "$PACK holds no experts.*.bin"
CACHE=$(( $(stat -c %s "$EXPERTS") / 10 ))  # 10% of the expert bytes, as side_by_side.sh

# One run: start the server, wait until /health answers, load it, stop it.
trap serve_down EXIT
bench() {  # NAME TITLE SERVE_OPTIONS...
  local name=$1 title=$2; shift 2
  say "$name: sluice serve --model $PACK $*"
  serve_up "$BIN" "$OUTD/serve_$name.log" "$PORT" --model "$PACK" --backend "$BACKEND" --parallel "$PARALLEL" \
    --ctx "$CTX" --max-queue 256 "$@" || { say "$name: the server did not come up"; return 1; }
  local rc=0 f
  for f in ${FORMATS//,/ }; do
    say "$name: up; loading it with $CLIENTS clients, response_format $f"
    timeout "$(tmo 300)" python3 "$HERE/serve_load.py" --url "http://127.0.0.1:$PORT" --clients "$CLIENTS" --requests "$REQUESTS" \
      --prompt-tokens "$PROMPT_TOKENS" --max-tokens "$MAX_TOKENS" --endpoint "$ENDPOINT" --response-format "$f" \
      --title "$title, response_format $f" --json "$OUTD/$name-$f.json" > "$OUTD/$name-$f.md" 2> "$OUTD/load_$name-$f.log" || rc=$?
    cat "$OUTD/load_$name-$f.log" >&2
    cat "$OUTD/$name-$f.md"; echo
  done
  serve_down
  tail -1 "$OUTD/serve_$name.log" >&2
  return $rc
}

KINDS=""; [ "$PACK" = "$W/pack" ] && KINDS="q4 experts, bf16 dense; "
LABEL=$(basename "$(realpath "$MODEL")"); [ "$MODEL" = peer ] && LABEL="${LAYERS}-layer peer checkpoint (Qwen3-30B-A3B shape, random weights)"
SHAPE="$KINDS$BACKEND; --parallel $PARALLEL; $ENDPOINT endpoint; prompt $PROMPT_TOKENS tokens, max_tokens $MAX_TOKENS, greedy; $REQUESTS requests per client"
status=0
if [[ ",$RUNS," == *,resident,* ]]; then bench resident "**$LABEL, experts resident** ($SHAPE)" || status=1; fi
if [[ ",$RUNS," == *,cache10,* ]]; then
  if [ "$HOST_CACHE" = 0 ]; then
    bench cache10 "**$LABEL, expert cache of 10% ($CACHE bytes), misses read from the pack** ($SHAPE)" \
      --expert-cache "$CACHE" || status=1
  else
    bench cache10 "**$LABEL, expert cache of 10% ($CACHE bytes) + $HOST_CACHE host tier, preloaded** ($SHAPE)" \
      --expert-cache "$CACHE" --host-cache "$HOST_CACHE" --host-cache-preload || status=1
  fi
fi
say "done (status $status; logs and JSON in $OUTD)"
exit $status
