#!/usr/bin/env python3
"""The routing model's trace: every routing decision of held-out text, with the lookahead
router's predictions, in the format of docs/trace-format.md (docs/policy.md replays it).

    python3 tools/routing_model/make_trace.py SLUICE MODEL_DIR TEXT OUT.jsonl [--windows 64] [--ctx 256]

Runs `SLUICE perplexity` over TEXT (windows of CTX tokens, each from an empty context: one
problem_id a window) on the checkpoint's experts streamed with lookahead on, so each row also
carries `predicted_next`: what layer L+1's router picks from layer L's MoE input, the
prediction the engine's lookahead acts on. Keeps the first --windows windows, rounds the
gating weights to 4 decimals (the file is committed; xz it), and prints the routing summary.
"""
import argparse
import json
import pathlib
import subprocess
import tempfile


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("sluice")
    ap.add_argument("model")
    ap.add_argument("text")
    ap.add_argument("out")
    ap.add_argument("--windows", type=int, default=64)
    ap.add_argument("--ctx", type=int, default=256)
    a = ap.parse_args()
    cfg = json.loads((pathlib.Path(a.model) / "config.json").read_text())
    n_expert = cfg.get("num_experts", cfg.get("num_local_experts"))
    with tempfile.TemporaryDirectory() as tmp:
        pack, raw = pathlib.Path(tmp) / "pack", pathlib.Path(tmp) / "raw.jsonl"
        subprocess.run([a.sluice, "convert", a.model, str(pack), "--kinds", "bf16", "-q"], check=True)
        # Every record fits the cache: the trace does not depend on the cache, only the
        # streaming path (which is what runs the lookahead router) must be on.
        slots = str(cfg["num_hidden_layers"] * n_expert)
        # The CPU backend: its streamer reports each row's position (token_idx); the routing is
        # the model's, whichever backend computes it.
        run = subprocess.run([a.sluice, "perplexity", "--model", str(pack), "--backend", "cpu", "--file", a.text, "--ctx", str(a.ctx),
                              "--expert-slots", slots, "--lookahead", "on", "--trace-routing", str(raw)],
                             check=True, capture_output=True, text=True)
        print(run.stdout.strip())
        rows = 0
        with open(raw) as f, open(a.out, "w") as out:
            for line in f:
                r = json.loads(line)
                if r["problem_id"] >= a.windows:
                    break
                r["dataset"] = "sluice-routing-model"
                r["gating_probs"] = [round(x, 4) for x in r["gating_probs"]]
                out.write(json.dumps(r, separators=(",", ":")) + "\n")
                rows += 1
    print(f"{rows} rows, {a.windows} windows of {a.ctx} tokens -> {a.out}")


if __name__ == "__main__":
    main()
