# bench/common.sh: what the bench scripts share (streamed_prefill.sh, family_decode.sh,
# serve_load.sh, gpu-suite/prompt_cache.sh); sourced after the script sets NAME (its name, for messages) and DEADLINE
# (seconds for the whole script; every command runs under `timeout` of what is left).
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
# tmo S: S seconds, or what is left of DEADLINE if less (at least 1).
tmo() { local c=$1 l=$(( DEADLINE - $(el) )); [ "$l" -lt "$c" ] && c=$l; [ "$c" -lt 1 ] && c=1; echo "$c"; }
say() { echo "$NAME: [$(el) s] $*" >&2; }
die() { echo "$NAME: error: $*" >&2; exit 1; }
# Drops the page cache (root only; fails otherwise), so that disk runs read the disk.
drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null; }
# disk_gbps FILE: the disk's O_DIRECT read bandwidth over (up to) 4 GiB of FILE, GB/s (0 when
# dd could not measure it). Drop the page cache first.
disk_gbps() {
  { dd if="$1" of=/dev/null bs=6M count=$(( 4096 / 6 )) iflag=direct 2>&1 >/dev/null; } |
    python3 -c "import re,sys; t=sys.stdin.read(); m=re.search(r'(\d+) bytes.*copied, ([0-9.]+) s', t); print(round(int(m.group(1))/float(m.group(2))/1e9, 3) if m else 0)"
}
# random_ids VOCAB N: N pseudo-random token ids in [1, VOCAB), comma-separated, the same every run.
random_ids() {
  python3 -c "import random,sys; r=random.Random(7); print(','.join(str(r.randrange(1, int(sys.argv[1]))) for _ in range(int(sys.argv[2]))))" "$1" "$2"
}
# synth_pack BIN LIKE KINDS LAYERS DIR: `sluice synth` into DIR (its log DIR.synth.log), or die.
synth_pack() {
  say "sluice synth --like $2 --kinds $3 --layers $4"
  timeout "$(tmo 300)" "$1/sluice" synth --like "$2" --kinds "$3" --layers "$4" "$5" --force -q > "$5.synth.log" 2>&1 ||
    { tail -3 "$5.synth.log" >&2; die "synth failed"; }
}
# serve_up BIN LOG PORT SERVE_ARGS...: starts `sluice serve --port PORT SERVE_ARGS` in the
# background (SERVER: its pid; stdout and stderr to LOG) and waits up to 240 s (or what is
# left) until /health answers; 1 when it did not (the log's tail shown, the server stopped).
SERVER=""
serve_up() {
  local bin=$1 log=$2 port=$3; shift 3
  if python3 -c "import socket; socket.create_connection(('127.0.0.1', $port), timeout=2)" 2>/dev/null; then
    say "something already listens on port $port (set PORT)"; return 1
  fi
  timeout "$(tmo 500)" "$bin/sluice" serve --port "$port" "$@" > "$log" 2>&1 &
  SERVER=$!
  local until=$(( $(el) + $(tmo 240) ))
  while [ "$(el)" -lt "$until" ]; do
    kill -0 "$SERVER" 2>/dev/null || break
    python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/health', timeout=2)" 2>/dev/null && return 0
    sleep 0.5
  done
  tail -5 "$log" >&2
  serve_down
  return 1
}
# serve_down: stops the server serve_up started (SIGTERM, SIGKILL after 15 s).
serve_down() {
  [ -n "$SERVER" ] || return 0
  kill -TERM "$SERVER" 2>/dev/null
  for _ in $(seq 1 150); do kill -0 "$SERVER" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$SERVER" 2>/dev/null
  wait "$SERVER" 2>/dev/null
  SERVER=""
}
