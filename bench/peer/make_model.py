#!/usr/bin/env python3
"""make_model.py OUT LAYERS [SHAPE]: a checkpoint with random bf16 weights in the HF layout for
the side by side, written by transformers (torch and a GPU): SHAPE `qwen3-30b-a3b` (default;
Qwen3-30B-A3B's published config, its first LAYERS of 48 layers)."""
import sys
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM

out, n_layers = sys.argv[1], int(sys.argv[2])
shape = sys.argv[3] if len(sys.argv) > 3 else "qwen3-30b-a3b"
if shape != "qwen3-30b-a3b":
    sys.exit(f"make_model.py: unknown shape {shape!r} (known: qwen3-30b-a3b)")
cfg = AutoConfig.for_model(
    "qwen3_moe", hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_hidden_layers=n_layers,
    num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
    vocab_size=151936, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], max_position_embeddings=40960,
    rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, rms_norm_eps=1e-6, tie_word_embeddings=False,
    bos_token_id=151643, eos_token_id=151645)
t = time.time()
torch.manual_seed(0)
with torch.device("cuda"):
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16)
print(f"init {time.time() - t:.1f} s, {sum(p.numel() for p in model.parameters()) / 1e9:.2f}B parameters", flush=True)
t = time.time()
model.save_pretrained(out, max_shard_size="4GB")
print(f"saved in {time.time() - t:.1f} s", flush=True)
