#!/usr/bin/env bash
# Issue 13, eighteenth session, on call18's warm machine: the host-RAM row on the side by
# side's pack (/tmp/sbs/pack, still there), A (.carry/sluiceA.txz: sluice of 1169beb with
# SLUICE_CUDA_COPIES_BESIDE=0, the step before this session) against C (this session's main),
# interleaved, three rounds. About 1.5 minutes.
set -uo pipefail
cd "$(dirname "$0")/../.."
[ -x .carry/bin/sluice ] || tar xJf .carry/bins.txz -C .carry
mkdir -p .carry/A && { [ -x .carry/A/sluice ] || tar xJf .carry/sluiceA.txz -C .carry/A; }
export LD_LIBRARY_PATH=$PWD/.carry/lib
T0=$(date +%s)
P=/tmp/sbs/pack
[ -f $P/experts.q4.bin ] || { echo "no pack"; exit 1; }
cache=$(( $(stat -c %s $P/experts.q4.bin) / 10 ))
for r in 1 2 3; do
  [ $(( $(date +%s)-T0 )) -lt 150 ] || break
  for v in A C; do
    bin=.carry/bin/sluice; b=1; [ $v = A ] && { bin=.carry/A/sluice; b=0; }
    echo "$v run $r: $(SLUICE_CUDA_COPIES_BESIDE=$b timeout 40 $bin run --model $P --backend cuda --ignore-eos --temperature 0 -n 128 --tokens 1 \
      --expert-cache $cache --host-cache 16G --host-cache-preload 2>&1 >/dev/null | grep -o "generated [0-9]* tokens, [0-9.]* tok/s" | grep -o "[0-9.]* tok/s")"
  done
done
echo "total $(( $(date +%s)-T0 )) s"
