#!/usr/bin/env bash
# compare.sh OLD_BIN NEW_BIN [REPS]: on a machine with a GPU, two builds of sluice side by side on
# the same full-size synthetic qwen3-30b-a3b q4 pack (48 layers, written to /tmp/q3 unless
# present): resident decode (bench_cuda), streamed decode at a 10% expert cache from disk and
# from a preloaded host tier (sluice run, sampled tokens so that routing varies). The runs
# are interleaved (old, new, old, new, ...) REPS times (default 3) so that drift of the machine
# hits both alike; prints one markdown row per measure: mean ± standard deviation of each
# build, and new / old. Also the disk's O_DIRECT read rate, measured in the same run.
# Each BIN holds sluice and bench_cuda. About 90 s a repetition after the pack is written.
# Measures: resident = bench_cuda's steady decode (greedy, logits to the host); run-greedy and
# run-t1 = what `sluice run` reports for 128 resident tokens, greedy and at temperature 1
# (sampling included); disk10 / host10 = streamed decode at a 10% cache.
set -uo pipefail
OLD=$1 NEW=$2 REPS=${3:-3}
P=/tmp/q3
export SLUICE_SOURCE_DIR=${SLUICE_SOURCE_DIR:-$PWD}
[ -e $P/manifest.json ] || timeout 120 "$NEW/sluice" synth --like qwen3-30b-a3b --kinds q4 $P -q --force
sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
disk=$(dd if=$P/experts.q4.bin of=/dev/null bs=6553600 count=300 iflag=direct 2>&1 | grep -o "[0-9.]* [GM]B/s")
cache=$(( $(stat -c %s $P/experts.q4.bin) / 10 ))
resident() { timeout 120 "$1/bench_cuda" --model $P --prefill 512 --decode 64 --reps 1 2>/dev/null |
             grep -E "^\| 512 " | awk -F'|' '{print $4}' | grep -o "^ *[0-9.]*" | tr -d ' '; }
generated() { local bin=$1; shift
             timeout 120 "$bin/sluice" run --model $P --backend cuda --tokens 1 -n 128 --ignore-eos "$@" 2>&1 >/dev/null |
             grep -o "generated [0-9]* tokens, [0-9.]*" | grep -o "[0-9.]*$"; }
streamed() { local bin=$1; shift
             timeout 120 "$bin/sluice" run --model $P --backend cuda --tokens 1 -n 33 --temperature 1 --seed 1 \
               --ignore-eos --expert-cache $cache --wait-timeout 8 "$@" 2>&1 >/dev/null |
             grep -o "streaming: decode [0-9.]*" | grep -o "[0-9.]*$"; }
declare -A got
for r in $(seq "$REPS"); do
  for b in old new; do
    bin=$OLD; [ $b = new ] && bin=$NEW
    got[$b,resident]+="$(resident "$bin") "
    got[$b,run-greedy]+="$(generated "$bin" --temperature 0) "
    got[$b,run-t1]+="$(generated "$bin" --temperature 1 --seed 1) "
    got[$b,disk10]+="$(streamed "$bin") "
    got[$b,host10]+="$(streamed "$bin" --host-cache 16G --host-cache-preload) "
  done
done
stats() { python3 -c "import sys,statistics as s; v=[float(x) for x in sys.argv[1:]]; print(f'{s.mean(v):.1f} ± {s.stdev(v) if len(v)>1 else 0:.1f}' if v else '-')" $1; }
ratio() { python3 -c "import sys,statistics as s; a=[float(x) for x in sys.argv[1].split()]; b=[float(x) for x in sys.argv[2].split()]; print(f'{s.mean(b)/s.mean(a):.3f}')" "$1" "$2" 2>/dev/null || echo -; }
echo "disk O_DIRECT read: $disk; expert cache $cache bytes (10%)"
echo "| decode tok/s, qwen3-30b-a3b q4 (48 layers) | old ($OLD) | new ($NEW) | new / old |"
echo "|---|---|---|---|"
for m in resident run-greedy run-t1 disk10 host10; do
  echo "| $m | $(stats "${got[old,$m]}") | $(stats "${got[new,$m]}") | $(ratio "${got[old,$m]}" "${got[new,$m]}") |"
done
echo "raw: $(for k in "${!got[@]}"; do echo -n "$k=[${got[$k]}] "; done)"
