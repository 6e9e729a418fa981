#!/usr/bin/env bash
# side_by_side.sh SLUICE_BIN_DIR PEER [LAYERS]: sluice and a llama.cpp-family peer engine
# (ik_llama.cpp) on the same checkpoint, on a machine with an NVIDIA GPU, torch and
# transformers, in one run of about 6-9 minutes; prints a markdown table.
#   SLUICE_BIN_DIR  holds sluice and bench_cuda (LD_LIBRARY_PATH set for their libraries)
#   PEER            the peer's source: a checkout directory or a .tar.xz of one (a tarball may
#                   carry the Qwen3 tokenizer files in qwen3-tok/ beside the checkout; else TOK_DIR)
#   LAYERS          the first LAYERS of Qwen3-30B-A3B's 48 layers (default 12), random bf16 weights
# Both engines get q4 experts (the peer's Q4_0, sluice's q4: the same bytes a token) and bf16
# attention, embeddings and output head. Rows (ROWS, default "resident ram same disk"):
#   resident  prefill 512 and 8192 tokens, decode 128 tokens, decode after an 8192-token prompt
#   ram       experts in host RAM: sluice's device cache of CACHE_PCT% (default 10) of the expert
#             bytes + its host tier, against the peer's `-ot exps=CPU` (experts on the CPU)
#   same      the same GPU memory: the peer with the experts of as many layers on the GPU as fit
#             sluice's device cache (the rest on the CPU), against sluice's cache of those bytes
#   disk      both from disk with RAM capped below the expert bytes (a cgroup, CAP, default 2G):
#             sluice's cache reading the pack with O_DIRECT, the peer reading its GGUF by mmap
# sluice's streamed rows run twice: with the checkpoint's own (random) routers, which send nearly
# every token to the same experts (labelled "synthetic routing"), and with the routing of a
# trained 128-expert top-8 model replayed (TRACE, default traces/routing-model-128e-code.jsonl.xz;
# `--replay-routing`): the peer's speed does not depend on routing locality, sluice's does.
# Each sluice row gives its hit rate; the disk rows the disk's O_DIRECT rate measured here and
# the IO bound (DISK_PEER_TIMEOUT, default 150 s, bounds the peer's capped run). Logs go to
# ${OUT:-/tmp/side_by_side}; LIMIT (seconds, default 560) skips the rows that would start after it.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd); ROOT=$(cd "$HERE/../.." && pwd)
BIN=$(realpath "$1"); PEER=$(realpath "$2"); LAYERS=${3:-12}
ROWS=" ${ROWS:-resident ram same disk} "; CACHE_PCT=${CACHE_PCT:-10}; CAP=${CAP:-2G}; LIMIT=${LIMIT:-560}
TRACE=${TRACE:-$ROOT/traces/routing-model-128e-code.jsonl.xz}
OUTD=${OUT:-/tmp/side_by_side}; mkdir -p "$OUTD"
W=${WORK:-/tmp/sbs}; mkdir -p "$W"
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
left() { [ "$(el)" -lt "$LIMIT" ]; }

# The peer: unpacked and built in the background while the checkpoint is made and converted.
if [ -f "$PEER" ]; then
  mkdir -p "$W/peer-src"; tar xJf "$PEER" -C "$W/peer-src"
  PSRC=$(dirname "$(find "$W/peer-src" -maxdepth 2 -name convert_hf_to_gguf.py | head -1)")
else
  PSRC=$PEER
fi
TOK_DIR=${TOK_DIR:-$(dirname "$PSRC")/qwen3-tok}
PB=$W/peer-build
if [ ! -x "$PB/bin/llama-bench" ]; then
  setsid nohup env JOBS=$(( $(nproc) - 1 )) bash "$HERE/build.sh" "$PSRC" "$PB" > "$OUTD/peer_build.log" 2>&1 < /dev/null &
fi

# The checkpoint, the peer's GGUF (converted while sluice converts its pack).
python3 "$HERE/make_model.py" "$W/hf" "$LAYERS" > "$OUTD/make_model.log" 2>&1 || { tail -5 "$OUTD/make_model.log"; exit 1; }
cp "$TOK_DIR"/tokenizer.json "$TOK_DIR"/tokenizer_config.json "$W/hf/" 2>/dev/null
python3 - "$W/hf/config.json" <<'PY'
import json, sys  # the keys a llama.cpp converter reads that transformers 5 writes elsewhere
p = sys.argv[1]; c = json.load(open(p))
c.setdefault("num_experts", c.get("num_local_experts"))
c.setdefault("rope_theta", (c.get("rope_parameters") or {}).get("rope_theta"))
json.dump(c, open(p, "w"), indent=2)
PY
( PYTHONPATH="$PSRC/gguf-py" PEER_FORCE_TOKPRE=qwen2 python3 "$PSRC/convert_hf_to_gguf.py" "$W/hf" --outtype f16 \
    --outfile "$W/model-f16.gguf" > "$OUTD/peer_convert.log" 2>&1 ) &
conv=$!
"$BIN/sluice" convert "$W/hf" "$W/pack" --kinds q4 --dense bf16 -q --force > "$OUTD/sluice_convert.log" 2>&1
wait $conv
while [ ! -x "$PB/bin/llama-quantize" ] && [ "$(el)" -lt 480 ]; do sleep 5; done
[ -x "$PB/bin/llama-quantize" ] || { echo "peer build not done after $(el) s"; tail -5 "$OUTD/peer_build.log"; exit 1; }
"$PB/bin/llama-quantize" --pure --output-tensor-type bf16 --token-embedding-type bf16 --attn-q-type bf16 \
  --attn-k-type bf16 --attn-v-type bf16 --attn-output-type bf16 "$W/model-f16.gguf" "$W/q4.gguf" Q4_0 "$(nproc)" \
  > "$OUTD/quantize.log" 2>&1
rm -f "$W/model-f16.gguf"

# Helpers: a peer figure (llama-bench's t/s column, in order), a sluice run's decode tok/s and hit
# rate, a ratio.
lb() { timeout "${LB_TIMEOUT:-200}" "$PB/bin/llama-bench" -m "$W/q4.gguf" -ngl 99 -fa 1 -o md "$@" 2>>"$OUTD/peer.err" \
         | grep -E "^\| .*(pp|tg)[0-9]" | awk -F'|' '{print $(NF-1)}' | sed 's/ //g' | grep -o "^[0-9.]*" | tr '\n' ' '; }
sr() { timeout "${SR_TIMEOUT:-200}" "$BIN/sluice" run --model "$W/pack" --backend cuda --ignore-eos -n 128 --temperature 0 "$@" \
         > /dev/null 2> "$OUTD/sr.err"; local rc=$?
       local tps hit; tps=$(grep -o "generated [0-9]* tokens, [0-9.]* tok/s" "$OUTD/sr.err" | grep -o "[0-9.]* tok/s" | grep -o "^[0-9.]*")
       hit=$(grep -o "hit rate [0-9.]*" "$OUTD/sr.err" | head -1 | grep -o "[0-9.]*$")
       gb=$(grep -o "read [0-9.]* GB" "$OUTD/sr.err" | head -1 | grep -o "[0-9.]*")
       cat "$OUTD/sr.err" >> "$OUTD/sluice.err"; [ $rc -eq 0 ] && echo "${tps:--} ${hit:--} ${gb:-0}" || echo "- - -"; }
f() { echo "$1" | cut -d' ' -f"$2"; }  # field N of a sluice result "tok/s hit-rate GB-read"
# The IO bound of a disk row: the disk's rate over the bytes a token read (128 tokens).
bound() { python3 -c "import sys; r,g=float(sys.argv[1]),float(sys.argv[2]); print(f'{g*1e3/128:.0f} MB a token, IO bound {r/(g/128):.1f} tok/s' if g>0 else 'nothing read')" "$1" "$2" 2>/dev/null || echo "-"; }
ratio() { python3 -c "import sys; print(f'{float(sys.argv[1])/float(sys.argv[2]):.2f}x')" "$1" "$2" 2>/dev/null || echo "-"; }
row() { echo "| $1 | $2 | $3 | $(ratio "$2" "$3") |"; }
streamed_rows() {  # label, peer figure, sluice options...: the synthetic and the replayed row
  local label=$1 peer=$2; shift 2
  local a b; a=$(sr "$@"); b=$(sr "$@" --replay-routing "$TRACE")
  row "$label, synthetic routing (hit rate $(f "$a" 2))" "$(f "$a" 1)" "$peer"
  row "$label, replayed routing $(basename "$TRACE") (hit rate $(f "$b" 2))" "$(f "$b" 1)" "$peer"
}
expert_bytes=$(stat -c %s "$W/pack/experts.q4.bin")
cache=$(( expert_bytes * CACHE_PCT / 100 ))
long=$(python3 -c "print(','.join(str(100 + i % 5000) for i in range(8192)))")

echo "| measure ($LAYERS-layer qwen3-30b-a3b shape, q4 experts, bf16 dense; cache $CACHE_PCT% of $(( expert_bytes >> 20 )) MiB of experts) | sluice | peer | ratio |"
echo "|---|---|---|---|"
if [[ $ROWS == *" resident "* ]] && left; then
  bc() { timeout 200 "$BIN/bench_cuda" --model "$W/pack" --prefill "$1" --decode 8 --reps "$2" 2>/dev/null \
           | grep -E "^\| $1 " | awk -F'|' '{print $3}' | tr -d ' ' | grep -o "^[0-9.]*"; }
  s_pp=$(bc 512 2); s_pp8k=$(bc 8192 1)
  s_tg=$(sr --tokens 1); s_long=$(sr --tokens "$long")
  p=($(lb -p 512 -n 128 -r 3)); p8k=($(lb -p 8192 -n 0 -r 2)); pl=($(lb -p 0 -n 0 -gp 8192,128 -r 2))
  row "prefill 512 tokens, tok/s" "$s_pp" "${p[0]:--}"
  row "prefill 8192 tokens, tok/s" "$s_pp8k" "${p8k[0]:--}"
  row "decode 128 tokens, tok/s" "$(f "$s_tg" 1)" "${p[1]:--}"
  row "decode after an 8192-token prompt, tok/s" "$(f "$s_long" 1)" "${pl[0]:--}"
fi
if [[ $ROWS == *" ram "* ]] && left; then
  p=($(lb -p 512 -n 128 -r 3 -ot exps=CPU))
  streamed_rows "decode, experts in host RAM (peer: -ot exps=CPU), tok/s" "${p[1]:--}" \
    --tokens 1 --expert-cache "$cache" --host-cache 16G --host-cache-preload
fi
if [[ $ROWS == *" same "* ]] && left; then
  per_layer=$(( expert_bytes / LAYERS )); n_gpu=$(( cache / per_layer ))
  same=$(( n_gpu * per_layer ))
  if [ "$n_gpu" -ge 1 ]; then  # the peer: layers 0..n_gpu-1 keep their experts on the GPU
    cpu_layers=$(seq -s'|' "$n_gpu" $(( LAYERS - 1 )))
    p=($(lb -p 512 -n 128 -r 3 -ot "blk\.($cpu_layers)\.ffn_.*_exps=CPU"))
    streamed_rows "decode at the same GPU memory ($n_gpu of $LAYERS layers' experts, $(( same >> 20 )) MiB; the rest in host RAM), tok/s" \
      "${p[1]:--}" --tokens 1 --expert-cache "$same" --host-cache 16G --host-cache-preload
  else
    echo "| same GPU memory: the cache holds less than one layer's experts | - | - | - |"
  fi
fi
if [[ $ROWS == *" disk "* ]] && left; then
  disk=$(sync; echo 3 > /proc/sys/vm/drop_caches; dd if="$W/pack/experts.q4.bin" of=/dev/null bs=2654208 count=600 \
         iflag=direct 2>&1 | grep -o "[0-9.]* [GM]B/s")
  rate=$(echo "$disk" | awk '{print ($2 == "MB/s") ? $1 / 1000 : $1}')  # GB/s
  cg=/sys/fs/cgroup/sluice_sbs
  echo +memory > /sys/fs/cgroup/cgroup.subtree_control 2>/dev/null; mkdir -p "$cg" && echo "$CAP" > "$cg/memory.max"
  # A subshell joins the cgroup (its children with it), then drops the page cache and runs.
  capped() { ( echo $BASHPID > "$cg/cgroup.procs"; sync; echo 3 > /proc/sys/vm/drop_caches; "$@" ); }
  a=$(capped sr --tokens 1 --expert-cache "$cache"); b=$(capped sr --tokens 1 --expert-cache "$cache" --replay-routing "$TRACE")
  p=$(LB_TIMEOUT=${DISK_PEER_TIMEOUT:-150} capped lb -p 0 -n 16 -r 1 -ot exps=CPU)
  echo "| disk: O_DIRECT reads of expert records (dd, 2.65 MB each, page cache dropped) | $disk | - | - |"
  row "decode from disk, RAM capped at $CAP, synthetic routing (hit rate $(f "$a" 2); $(bound "$rate" "$(f "$a" 3)")) (peer: mmap, -ot exps=CPU, 16 tokens; '-' if not done in ${DISK_PEER_TIMEOUT:-150} s)" "$(f "$a" 1)" "${p%% *}"
  row "decode from disk, RAM capped at $CAP, replayed routing $(basename "$TRACE") (hit rate $(f "$b" 2); $(bound "$rate" "$(f "$b" 3)"))" "$(f "$b" 1)" "${p%% *}"
fi
echo "elapsed $(el) s; peer $(cat "$PSRC/PEER_COMMIT" 2>/dev/null | cut -c1-12); $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
