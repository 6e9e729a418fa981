# bench/common.sh: what the streaming bench scripts share (streamed_prefill.sh,
# family_decode.sh); sourced after the script sets NAME (its name, for messages) and DEADLINE
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
