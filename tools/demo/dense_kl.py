#!/usr/bin/env python3
"""KL(bf16 pack || --dense X pack) per position on windows of the demo model's held-out text.

Usage (from the repository root, after converting models/demo to PACKS/demo-<choice> for bf16
and each choice, as docs/quantization.md shows):
    python3 tools/demo/dense_kl.py PACKS N_WINDOWS CHOICE...      # e.g. /tmp/dq 24 f32 int8 q4
Runs `sluice logits` (SLUICE, default build/bin/sluice) on N_WINDOWS windows of about 1000
characters spread evenly over models/demo/heldout.txt, reads the float32 [n, V] .npy files
and prints one markdown row per choice: mean KL, max KL (nats per position), top-1 agreement,
positions. Pure Python (no numpy).
"""
import array, math, os, subprocess, sys

sluice = os.environ.get("SLUICE", "build/bin/sluice")
packs, n_win, choices = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
text = open("models/demo/heldout.txt", encoding="utf-8").read()
win_chars = 1000
step = (len(text) - win_chars) // n_win


def read_npy(path):
    b = open(path, "rb").read()
    header_len = int.from_bytes(b[8:10], "little")
    shape = eval(b[10:10 + header_len].decode())["shape"]
    a = array.array("f")
    a.frombytes(b[10 + header_len:])
    return shape, a


def log_softmax(a, off, V):
    m = max(a[off:off + V])
    lse = m + math.log(sum(math.exp(a[i] - m) for i in range(off, off + V)))
    return [a[i] - lse for i in range(off, off + V)]


totals = {k: [0.0, 0, 0.0, 0] for k in choices}  # sum KL, positions, max KL, top-1 agreements
for w in range(n_win):
    chunk = text[w * step: w * step + win_chars]
    chunk = chunk[chunk.find(" ") + 1:]  # start at a word
    for k in ["bf16"] + choices:
        subprocess.run([sluice, "logits", "--model", f"{packs}/demo-{k}", "--prompt", chunk, "--out", f"{packs}/{k}.npy"],
                       check=True, capture_output=True)
    (n, V), ref = read_npy(f"{packs}/bf16.npy")
    for k in choices:
        _, x = read_npy(f"{packs}/{k}.npy")
        t = totals[k]
        for p in range(n):
            lp, lq = log_softmax(ref, p * V, V), log_softmax(x, p * V, V)
            kl = sum(math.exp(a) * (a - b) for a, b in zip(lp, lq))
            t[0] += kl
            t[1] += 1
            t[2] = max(t[2], kl)
            t[3] += lp.index(max(lp)) == lq.index(max(lq))
for k in choices:
    s, n, mx, top = totals[k]
    print(f"| {k} | {s / n:.3g} | {mx:.3g} | {100 * top / n:.1f}% | {n} |")
