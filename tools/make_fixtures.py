#!/usr/bin/env python3
"""Tiny random-weight checkpoints of each family with transformers' reference outputs.

Runs on the GPU machine (torch and transformers 5.17 are there):
    python3 tools/make_fixtures.py tests/fixtures [family ...]
For each fixture it writes tests/fixtures/<name>/:
    config.json, model.safetensors, tokenizer.json, tokenizer_config.json  (a real HF checkpoint)
    reference.json      prompt ids, greedy continuation ids, smallest router top-k margin
    logits_prompt.npy   [n_prompt, vocab] f32, one teacher-forced pass over the prompt
    logits_full.npy     [n_prompt + n_cont, vocab] f32, over prompt + continuation
References are computed on the CPU in float32 with eager attention, from the checkpoint as
saved (so bf16/f16 fixtures are compared against their rounded weights).

Multimodal families (qwen3_5, qwen3_5_moe, qwen4_exp) are saved through their
ForConditionalGeneration class with a nested text_config and a tiny vision tower, so the
checkpoint has the real layout (model.language_model.*, model.visual.*, lm_head); their
references are computed from input_ids alone.

Seed search: a fixture's seed is the one whose smallest router top-k margin (over every
router call of the reference run) is largest, so that sluice's f32 rounding cannot flip a
routing decision and quantized-quality tests stay meaningful. The hybrid fixtures run ~100
tokens through every router, so their minimum is small for most seeds: for them (option
"search") many seeds are screened first in parallel by the margin of the prompt pass alone
(an upper bound of the full run's minimum), then the best candidates get the full
measurement, best first, until no remaining candidate's bound can beat the best found.
SLUICE_FIXTURE_SEARCH_SECONDS (default 60) bounds the screening wall time,
SLUICE_FIXTURE_FULL_SECONDS (default half that) the full measurements of one fixture. Beside each fixture the script writes
debug/<name>.npz (per-module activations of the prompt pass, for debugging a port; not part
of the fixture) when run with SLUICE_FIXTURE_DEBUG=DIR.
"""
import importlib.util
import inspect
import json
import math
import os
import pathlib
import re
import sys
import traceback

import numpy as np
import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

PROMPT = "The river carries the boat past the old mill, and the miller counts"
# Longer prompts for the hybrid families: more than one 64-token DeltaNet chunk, and enough
# compressed key blocks that QSA's block top-k drops some.
PROMPT_LONG = ("The river carries the boat past the old mill, and the miller counts the sacks of "
               "flour while the children run along the bank, calling to the ferryman, who waves "
               "his hat and laughs at the geese that follow the boat downstream.")
PROMPT_MEDIUM = ("The river carries the boat past the old mill, and the miller counts the sacks "
                 "while the children run along the bank.")
N_CONTINUATION = 10
VOCAB = 512           # model vocabulary (the tokenizer uses the first ~500 ids)
PERTURB_STD = 0.05    # added to every parameter after init, norm weights included
N_SEED_TRIES = 12     # keep the seed whose smallest router top-k margin is largest
SEARCH_SEEDS = 4000   # seeds screened per "search" fixture at most (the time bound usually ends it first)


def training_text() -> list[str]:
    """English prose for the fixture tokenizer: the docstrings of Python's standard library."""
    import argparse, calendar, collections, datetime, decimal, email, fractions, functools, \
        http, itertools, json as js, logging, os, pathlib as pl, random, re, shutil, statistics, \
        string, subprocess, textwrap, threading, typing, unittest, urllib
    texts = []
    for mod in [argparse, calendar, collections, datetime, decimal, email, fractions, functools,
                http, itertools, js, logging, os, pl, random, re, shutil, statistics, string,
                subprocess, textwrap, threading, typing, unittest, urllib]:
        texts.append(inspect.getdoc(mod) or "")
        for name in sorted(dir(mod)):
            doc = inspect.getdoc(getattr(mod, name, None))
            if doc and not name.startswith("_"):
                texts.append(doc)
    return texts


QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def make_tokenizer(out_dir: pathlib.Path):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    if (out_dir / "tokenizer.json").exists():  # keep the committed tokenizer (and every fixture's ids)
        return Tokenizer.from_file(str(out_dir / "tokenizer.json"))
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=500, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(training_text(), trainer)
    tok.add_special_tokens(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    out_dir.mkdir(parents=True, exist_ok=True)
    tok.save(str(out_dir / "tokenizer.json"))
    return tok


def write_tokenizer_config(d: pathlib.Path, bos):
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>",
           "bos_token": bos, "add_bos_token": bos is not None, "model_max_length": 4096}
    (d / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))


# name -> (model_type, config kwargs, saved dtype, bos token or None[, options])
# options (hybrid families): "cls" the transformers class built and saved; "vision" a tiny
# vision_config (the config kwargs then become the nested text_config, as in the real
# multimodal checkpoints); "prompt" the prompt text, or a function tok -> ids; "seeds" how
# many seeds to try; "search" how many seeds to screen at most (see the seed search above).
COMMON = dict(vocab_size=VOCAB, hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=False,
              initializer_range=0.08, attention_dropout=0.0)
FIXTURES = {
    "qwen3_moe": ("qwen3_moe", dict(COMMON, num_hidden_layers=3, head_dim=16, intermediate_size=96,
                  moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2,
                  decoder_sparse_step=1, mlp_only_layers=[1], norm_topk_prob=True,
                  rope_theta=10000.0), torch.float32, None),
    "qwen3_moe_yarn": ("qwen3_moe", dict(COMMON, num_hidden_layers=4, head_dim=16,
                       intermediate_size=80, moe_intermediate_size=24, num_experts=8,
                       num_experts_per_tok=3, decoder_sparse_step=2, mlp_only_layers=[],
                       norm_topk_prob=False, rope_theta=1000000.0,
                       rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                     "original_max_position_embeddings": 64}),
                       torch.bfloat16, None),
    "mixtral": ("mixtral", dict(COMMON, num_hidden_layers=2, intermediate_size=48,
                num_local_experts=8, num_experts_per_tok=2, sliding_window=6,
                rope_theta=1000000.0), torch.float16, "<|im_start|>"),
    "olmoe": ("olmoe", dict(COMMON, num_hidden_layers=2, intermediate_size=40, num_experts=8,
              num_experts_per_tok=2, norm_topk_prob=False, rope_theta=10000.0),
              torch.bfloat16, None),
}

# gpt_oss: attention with biases and per-head sinks, sliding (window 6, shorter than the
# prompt) and full layers alternating, YaRN rotary (truncate off as gpt-oss ships, and on),
# a router with a bias (softmax over the top-k logits), experts with biases and the clamped
# SwiGLU. "scale" multiplies the named parameters after the perturbation: the gate/up weights
# x 8 make |gate|, |up| exceed the clamp limit (7) for a good share of the values, so the
# clamp is exercised (at the init's scale it never would be). "mxfp4": the experts are also
# written in the real checkpoint layout (*_blocks / *_scales, e2m1 + e8m0), and the reference
# is computed from what transformers dequantizes.
GPT_OSS = dict(COMMON, head_dim=16, intermediate_size=48, num_local_experts=8, sliding_window=6,
               attention_bias=True, rms_norm_eps=1e-5)
SLIDE, FULLA = "sliding_attention", "full_attention"
GPT_OSS_SCALE = {"mlp.experts.gate_up_proj": 8.0, "mlp.experts.gate_up_proj_bias": 8.0}
FIXTURES.update({
    "gpt_oss": ("gpt_oss", dict(GPT_OSS, num_hidden_layers=3, num_experts_per_tok=2,
                layer_types=[SLIDE, FULLA, SLIDE], rope_theta=150000.0,
                rope_scaling={"rope_type": "yarn", "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
                              "truncate": False, "original_max_position_embeddings": 64}),
                torch.bfloat16, None, {"plain": True, "scale": GPT_OSS_SCALE}),
    "gpt_oss_mxfp4": ("gpt_oss", dict(GPT_OSS, num_hidden_layers=4, num_experts_per_tok=3,
                      intermediate_size=96, layer_types=[SLIDE, FULLA, FULLA, SLIDE], rope_theta=10000.0,
                      rope_scaling={"rope_type": "yarn", "factor": 8.0, "beta_fast": 16.0, "beta_slow": 2.0,
                                    "truncate": True, "original_max_position_embeddings": 32}),
                      torch.bfloat16, "<|im_start|>", {"plain": True, "scale": GPT_OSS_SCALE, "mxfp4": True}),
})

# llama4_text (Llama4ForCausalLM): MoE on every interleave_moe_layer_step-th layer with a dense
# MLP (intermediate_size_mlp) between, top-1 sigmoid routing that scales the expert's input,
# a shared expert, NoPE layers (no_rope_layers 0) with attention temperature tuning (floor_scale
# small so the scale moves within the prompt), chunked attention on the rope layers (chunk 8
# under a 33-token prompt), L2 q/k norm, llama3 rope scaling; the second config: top-2, MoE in
# every layer, no q/k norm, no tuning, no chunking, default rope.
LLAMA4 = dict(COMMON, head_dim=16, intermediate_size=32, intermediate_size_mlp=48, num_local_experts=8,
              rms_norm_eps=1e-5, attention_bias=False)
FIXTURES.update({
    "llama4": ("llama4_text", dict(LLAMA4, num_hidden_layers=4, num_experts_per_tok=1, interleave_moe_layer_step=2,
               no_rope_layers=[1, 1, 1, 0], attention_chunk_size=8, use_qk_norm=True, attn_temperature_tuning=True,
               floor_scale=4, attn_scale=0.1, rope_theta=500000.0,
               rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                             "original_max_position_embeddings": 64}),
               torch.bfloat16, "<|im_start|>", {"plain": True}),
    "llama4_top2": ("llama4_text", dict(LLAMA4, num_hidden_layers=3, num_experts_per_tok=2,
                    interleave_moe_layer_step=1, no_rope_layers=[1, 0, 1], attention_chunk_size=8192,
                    use_qk_norm=False, attn_temperature_tuning=False, rope_theta=10000.0),
                    torch.float32, None, {"plain": True}),
})

# gemma4_text (Gemma4ForCausalLM): sliding and full layers with their own rope (default theta
# 1e4; proportional with partial_rotary_factor on full layers) and a wider head on full layers
# (global_head_dim), the MoE block beside the dense MLP, per-layer input embeddings, the final
# logit softcap, tied embeddings; the second config: attention_k_eq_v with its own kv heads on
# full layers, KV shared by the last layers, the double-wide MLP there, no PLE, top-1.
GEMMA4_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
               "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0}}
GEMMA4 = dict(COMMON, head_dim=16, global_head_dim=32, intermediate_size=48, sliding_window=6,
              tie_word_embeddings=True, rope_parameters=GEMMA4_ROPE, hidden_activation="gelu_pytorch_tanh",
              num_experts=8, moe_intermediate_size=32, enable_moe_block=True, vocab_size_per_layer_input=VOCAB,
              pad_token_id=0, bos_token_id=2, eos_token_id=1)
FIXTURES.update({
    "gemma4": ("gemma4_text", dict(GEMMA4, num_hidden_layers=4, top_k_experts=2, hidden_size_per_layer_input=8,
               layer_types=["sliding_attention", "sliding_attention", "full_attention", "full_attention"],
               final_logit_softcapping=30.0),
               torch.bfloat16, "<|im_start|>", {"cls": "Gemma4ForCausalLM", "search": SEARCH_SEEDS}),
    "gemma4_kv": ("gemma4_text", dict(GEMMA4, num_hidden_layers=6, top_k_experts=1, hidden_size_per_layer_input=0,
                  layer_types=["sliding_attention", "full_attention"] * 3, attention_k_eq_v=True,
                  num_global_key_value_heads=1, num_kv_shared_layers=2, use_double_wide_mlp=True),
                  torch.bfloat16, "<|im_start|>", {"cls": "Gemma4ForCausalLM", "search": SEARCH_SEEDS}),
})

EOS_ID = 500  # "<|endoftext|>" in the fixture tokenizer
# A vision tower as small as its config allows: the checkpoint must carry one (with the real
# model.visual.* names) for the loader's skip to be tested, but it is never run.
TINY_VISION = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, patch_size=16,
                   temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=64,
                   num_position_embeddings=64)
# Shared by the hybrid families: 2 key heads and 4 value heads in the DeltaNet layers (so
# the query/key heads are repeated), 4 query heads over 2 kv heads in full attention.
HYBRID = dict(COMMON, head_dim=16, linear_conv_kernel_dim=4, linear_key_head_dim=16,
              linear_value_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4)
LIN, FULL = "linear_attention", "full_attention"


def rope_params(partial, mrope=None):
    p = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": partial}
    if mrope:  # the multimodal families' interleaved M-RoPE (text-only positions: plain rope)
        p.update({"mrope_section": mrope, "mrope_interleaved": True})
    return p


def ple_prompt(tok):
    """Two sentences with the end-of-text token between them: PLE's n-grams restart there."""
    return (tok.encode("The river carries the boat past the old mill.").ids + [EOS_ID] +
            tok.encode(" The miller counts the sacks of flour by the door.").ids)


QWEN4 = dict(HYBRID, moe_intermediate_size=32, shared_expert_intermediate_size=48, num_experts=8,
             num_experts_per_tok=3, hc_lowrank=16, indexer_n_heads=2, indexer_kv_heads=1,
             indexer_head_dim=16, indexer_compress_ratio=4, rope_parameters=rope_params(0.5, [2, 1, 1]))
FIXTURES.update({
    # qwen3_next: ForCausalLM; one dense layer (mlp_only_layers); a prompt longer than one
    # 64-token DeltaNet chunk.
    "qwen3_next": ("qwen3_next", dict(HYBRID, num_hidden_layers=4, layer_types=[LIN, FULL, LIN, FULL],
                   intermediate_size=96, moe_intermediate_size=32, shared_expert_intermediate_size=48,
                   num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
                   mlp_only_layers=[2], rope_parameters=rope_params(0.25)),
                   torch.float16, None, {"cls": "Qwen3NextForCausalLM", "prompt": PROMPT_LONG, "search": SEARCH_SEEDS}),
    # qwen3_5: the dense hybrid, multimodal layout.
    "qwen3_5": ("qwen3_5", dict(HYBRID, num_hidden_layers=4, layer_types=[LIN, LIN, LIN, FULL],
                intermediate_size=96, rope_parameters=rope_params(0.25, [1, 1, 0])),
                torch.bfloat16, None, {"cls": "Qwen3_5ForConditionalGeneration", "vision": TINY_VISION,
                                       "prompt": PROMPT_MEDIUM, "seeds": 2}),
    # qwen3_5_moe: multimodal layout, routed + shared experts in every layer.
    "qwen3_5_moe": ("qwen3_5_moe", dict(HYBRID, num_hidden_layers=4, layer_types=[LIN, FULL, LIN, FULL],
                    moe_intermediate_size=32, shared_expert_intermediate_size=48, num_experts=8,
                    num_experts_per_tok=2, rope_parameters=rope_params(0.5, [2, 1, 1])),
                    torch.bfloat16, None, {"cls": "Qwen3_5MoeForConditionalGeneration", "vision": TINY_VISION,
                                           "prompt": PROMPT_MEDIUM, "search": SEARCH_SEEDS}),
    # qwen4_exp with QSA dropping blocks: budget 8 tokens = 2 blocks of 4, on a ~100-token
    # prompt; hc_count 3; the DeltaNet output gate is a sigmoid.
    "qwen4_exp_qsa": ("qwen4_exp", dict(QWEN4, num_hidden_layers=4, layer_types=[LIN, FULL, LIN, FULL],
                      hc_count=3, indexer_budget=8, output_gate_type="sigmoid"),
                      torch.bfloat16, None, {"cls": "Qwen4ExpForConditionalGeneration", "vision": TINY_VISION,
                                             "prompt": PROMPT_LONG, "search": SEARCH_SEEDS}),
    # qwen4_exp with PLE on two DeltaNet layers (1-indexed 1 and 3): tiny prime n-gram tables
    # stored in 2 shards, a dilated conv of kernel 3, an end-of-text token inside the prompt;
    # hc_count 4; QSA's budget covers the whole prompt (nothing dropped).
    "qwen4_exp_ple": ("qwen4_exp", dict(QWEN4, num_hidden_layers=4, layer_types=[LIN, FULL, LIN, LIN],
                      hc_count=4, indexer_budget=64, ple_layer_ids=[1, 3], ple_embed_dim=32,
                      ple_conv_kernel_size=3, ngram_size=3, heads_per_ngram=2, ngram_vocab_size_base=50,
                      make_ngram_vocab_size_divisible_by=8, seed=4321, split_ngram_parts=2,
                      eos_token_id=EOS_ID),
                      torch.bfloat16, None, {"cls": "Qwen4ExpForConditionalGeneration", "vision": TINY_VISION,
                                             "prompt": ple_prompt, "search": SEARCH_SEEDS}),
})


# The giant families: sigmoid routing with a correction bias added for the choice only
# ("router_bias": the std of the random e_score_correction_bias written into the buffer,
# large enough to change which experts win), group-limited in DeepSeek-V3 and GLM-4.5
# (n_group groups ranked by the sum of their two best, topk_group kept), shared experts and
# leading dense layers (first_k_dense_replace). "mtp": a multi-token-prediction layer of the
# checkpoint's layout (model.layers.<num_hidden_layers>.*: enorm, hnorm, eh_proj, shared_head
# and a decoder layer) appended to the saved file, as the published checkpoints carry one;
# transformers ignores it, sluice must skip it. "fp8": every projection matrix rewritten as
# F8_E4M3 with a weight_scale_inv per block of the config's weight_block_size (as
# DeepSeek-V3 / Kimi K2 / MiniMax-M2 ship), the reference computed from the script's
# dequantization, which fp8_dequantized.safetensors keeps for the converter's test.
#   deepseek_v3: MLA with a q-LoRA, YaRN with mscale != mscale_all_dim (both the rotary
#     attention factor and the softmax scale move), interleaved rope, 4 groups of 4 experts
#     with 2 kept, top-4, a shared expert, one leading dense layer, an MTP layer.
#   deepseek_v3_plain: no q-LoRA (a plain q_proj), default rope, rope_interleave off, one
#     group, no renormalization, every layer MoE.
#   deepseek_v3_fp8: the first config's shape in FP8 blocks of 32 (partial edge blocks:
#     moe_intermediate_size 40, kv_lora_rank 48).
#   glm4_moe: GQA with attention biases, partial rotary 0.5, qk-norm, 2 groups with 1 kept,
#     shared expert, a leading dense layer, an MTP layer; glm4_moe_plain: no qk-norm, one group.
#   minimax_m2: qk-norm over the whole q / k projections, rotary on half of each head,
#     sigmoid routing with the bias, no groups, no shared expert.
DSV3 = dict(COMMON, num_key_value_heads=4, intermediate_size=96, moe_intermediate_size=24,
            n_routed_experts=16, num_experts_per_tok=4, n_shared_experts=1, routed_scaling_factor=2.5,
            kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, rms_norm_eps=1e-6)
YARN_DS = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "beta_fast": 32.0,
           "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 0.8}
GLM = dict(COMMON, num_key_value_heads=2, head_dim=32, intermediate_size=96, moe_intermediate_size=24,
           n_routed_experts=16, num_experts_per_tok=4, n_shared_experts=1, routed_scaling_factor=2.5,
           attention_bias=True, partial_rotary_factor=0.5, rms_norm_eps=1e-5)
FIXTURES.update({
    "deepseek_v3": ("deepseek_v3", dict(DSV3, num_hidden_layers=3, q_lora_rank=24, n_group=4, topk_group=2,
                    first_k_dense_replace=1, norm_topk_prob=True, rope_interleave=True, rope_theta=10000.0,
                    num_nextn_predict_layers=1, rope_scaling=YARN_DS),
                    torch.bfloat16, "<|im_start|>", {"plain": True, "router_bias": 0.1, "mtp": True}),
    "deepseek_v3_plain": ("deepseek_v3", dict(DSV3, num_hidden_layers=2, q_lora_rank=None, n_group=1, topk_group=1,
                          first_k_dense_replace=0, norm_topk_prob=False, rope_interleave=False,
                          rope_theta=50000.0, routed_scaling_factor=1.0),
                          torch.float32, None, {"plain": True, "router_bias": 0.1}),
    "deepseek_v3_fp8": ("deepseek_v3", dict(DSV3, num_hidden_layers=3, q_lora_rank=24, n_group=4, topk_group=2,
                        first_k_dense_replace=1, norm_topk_prob=True, rope_interleave=True, rope_theta=10000.0,
                        moe_intermediate_size=40, kv_lora_rank=48, rope_scaling=YARN_DS),
                        torch.bfloat16, None, {"plain": True, "router_bias": 0.1, "fp8": [32, 32]}),
    "glm4_moe": ("glm4_moe", dict(GLM, num_hidden_layers=3, use_qk_norm=True, n_group=2, topk_group=1,
                 first_k_dense_replace=1, norm_topk_prob=True, num_nextn_predict_layers=1, rope_theta=10000.0,
                 rope_scaling={"partial_rotary_factor": 0.5}),
                 torch.bfloat16, None, {"plain": True, "router_bias": 0.1, "mtp": True}),
    "glm4_moe_plain": ("glm4_moe", dict(GLM, num_hidden_layers=2, use_qk_norm=False, n_group=1, topk_group=1,
                       first_k_dense_replace=0, norm_topk_prob=False, rope_theta=1000000.0,
                       rope_scaling={"partial_rotary_factor": 0.5}),
                       torch.float32, "<|im_start|>", {"plain": True, "router_bias": 0.1}),
    "minimax_m2": ("minimax_m2", dict(COMMON, num_hidden_layers=3, head_dim=16, intermediate_size=24,
                   num_local_experts=16, num_experts_per_tok=4, rms_norm_eps=1e-6, rope_theta=5000000.0,
                   bos_token_id=None, eos_token_id=EOS_ID,
                   rotary_dim=8, rope_scaling={"partial_rotary_factor": 0.5}),
                   torch.bfloat16, None, {"plain": True, "router_bias": 0.1}),
})


def build_config(model_type: str, kwargs: dict, opts: dict | None = None):
    kwargs = dict(kwargs)
    if opts and not opts.get("plain"):  # hybrid families: rope_parameters given whole (partial rotary, M-RoPE sections)
        if "vision" in opts:
            cfg = AutoConfig.for_model(model_type, text_config=kwargs, vision_config=dict(opts["vision"]),
                                       tie_word_embeddings=kwargs.get("tie_word_embeddings", False))
        else:
            cfg = AutoConfig.for_model(model_type, **kwargs)
        cfg._attn_implementation = "eager"
        return cfg
    rope_scaling = kwargs.pop("rope_scaling", None)
    theta = kwargs.pop("rope_theta")
    for key in JSON_ONLY:  # written into config.json after saving (see add_json_only)
        kwargs.pop(key, None)
    cfg = AutoConfig.for_model(model_type, **kwargs)
    # transformers 5 keeps rope settings in rope_parameters; older versions in rope_theta /
    # rope_scaling. Set whichever this version has.
    if hasattr(cfg, "rope_parameters"):
        params = {"rope_type": "default", "rope_theta": theta}
        if rope_scaling:
            params.update(rope_scaling)
        cfg.rope_parameters = params
    else:
        cfg.rope_theta = theta
        if rope_scaling:
            cfg.rope_scaling = rope_scaling
    cfg._attn_implementation = "eager"
    return cfg


def model_class(opts):
    return getattr(transformers, opts["cls"]) if opts and "cls" in opts else AutoModelForCausalLM


def new_model(cls, cfg):
    try:
        return cls._from_config(cfg, attn_implementation="eager")
    except (TypeError, AttributeError):
        return cls.from_config(cfg) if cls is AutoModelForCausalLM else cls(cfg)


def text_config(model):
    c = model.config
    return c.get_text_config() if hasattr(c, "get_text_config") else c


def router_margins(model, k: int):
    """Hooks on every router; returns a list that fills with top-k margins (prob_k - prob_k+1)."""
    margins = []
    hooks = []
    hidden = text_config(model).hidden_size
    for name, mod in model.named_modules():
        if name.endswith(".router") and hasattr(mod, "per_expert_scale"):  # gemma4: probabilities are output 0
            def phook(m, args, out):
                s = torch.sort(out[0].double(), dim=-1, descending=True).values
                margins.append(float((s[:, k - 1] - s[:, k]).min()))
            hooks.append(mod.register_forward_hook(phook))
            continue
        w = getattr(mod, "weight", None)
        parent = model.get_submodule(name.rsplit(".", 1)[0]) if "." in name else None
        bias = getattr(mod, "e_score_correction_bias", getattr(parent, "e_score_correction_bias", None))
        if name.endswith(".gate") and w is not None and isinstance(bias, torch.Tensor):
            tc = text_config(model)
            hooks.append(mod.register_forward_hook(sigmoid_margin_hook(w, bias, k, getattr(tc, "n_group", None) or 1,
                                                                       getattr(tc, "topk_group", None) or 1, margins)))
            continue
        if (name.endswith(".gate") or name.endswith(".router")) and w is not None and w.dim() == 2 \
                and w.shape[0] <= 64 and w.shape[1] == hidden:
            b = getattr(mod, "bias", None)  # gpt-oss: the router's logits carry a bias

            def hook(m, args, out, _w=w, _b=b):
                x = args[0].reshape(-1, _w.shape[1]).double()
                logits = x @ _w.double().T + (_b.double() if isinstance(_b, torch.Tensor) else 0.0)
                p = torch.softmax(logits, dim=-1)
                s = torch.sort(p, dim=-1, descending=True).values
                margins.append(float((s[:, k - 1] - s[:, k]).min()))
            hooks.append(mod.register_forward_hook(hook))
    return margins, hooks


def sigmoid_margin_hook(w, bias, k, n_group, topk_group, margins):
    """Group-limited sigmoid routing (DeepSeek-V3, GLM-4.5; MiniMax-M2 is one group): the
    choice is made on sigmoid(logits) + bias. Records the smaller of the group choice's margin
    (the topk_group-th group score minus the next) and the expert choice's inside the kept
    groups (the k-th masked score minus the next), as transformers' get_topk_indices makes them."""
    def hook(m, args, out):
        x = args[0].reshape(-1, w.shape[1]).double()
        c = torch.sigmoid(x @ w.double().T) + bias.double()
        n, e = c.shape
        ms = []
        if n_group > 1:
            g = c.view(n, n_group, e // n_group).topk(2, dim=-1).values.sum(-1)
            gs = torch.sort(g, dim=-1, descending=True).values
            if topk_group < n_group:
                ms.append(float((gs[:, topk_group - 1] - gs[:, topk_group]).min()))
            keep = torch.zeros_like(g).scatter_(1, torch.topk(g, topk_group, dim=-1).indices, 1.0)
            # transformers' masked_fill(-inf): a dropped group's experts are out of the choice even
            # where the kept ones' values are negative (a negative bias)
            c = c.masked_fill(keep.repeat_interleave(e // n_group, dim=1) == 0, float("-inf"))
        s = torch.sort(c, dim=-1, descending=True).values
        ms.append(float((s[:, k - 1] - s[:, k]).min()))
        margins.append(min(ms))
    return hook


def qsa_margins(model):
    """Hooks on every QSA indexer (qwen4_exp). For each query that has more complete blocks
    than it may keep, records (margin, tie): recomputing the block scores as the indexer does,
    margin is the smallest gap a rounding could close and so change the kept blocks. Normally
    score_k - score_k+1; when blocks tie at exactly zero (relu of all-negative dot products)
    across the k-th place (tie = True), torch.topk's own rule picks among them (sluice follows
    it, core/torch_topk.h), and the margin is how close a zero score is to becoming positive
    or a positive one to becoming zero."""
    margins, hooks = [], []
    for name, mod in model.named_modules():
        if not name.endswith(".indexer") or not hasattr(mod, "index_qk_proj"):
            continue
        rope = sys.modules[type(mod).__module__].apply_rotary_pos_emb

        def hook(m, args, out, _rope=rope):
            hs, (cos, sin), mask = args[0], args[1], args[2]
            b, n, _ = hs.shape
            hd, c, k = m.index_head_dim, m.compress_ratio, m.block_topk
            qk = m.index_qk_proj(hs)
            q, tk = torch.split(qk, [m.index_n_heads * hd, m.index_kv_heads * hd], dim=-1)
            q = m.q_layernorm(q.reshape(b, n, -1, hd))
            q = _rope(q, cos=cos[:, -n:], sin=sin[:, -n:], unsqueeze_dim=2)
            keys = tk.reshape(b, n, hd)
            vis = mask if mask.dtype == torch.bool else mask == 0
            for qi in range(n):
                idx = torch.nonzero(vis[0, 0, qi]).flatten()
                nb = idx.numel() // c
                if nb <= k:
                    continue
                blocks = idx[: nb * c].view(nb, c)
                pooled = m.k_layernorm(keys[0].index_select(0, blocks.flatten()).view(nb, c, hd).float().mean(1))
                starts = blocks[:, 0]
                bk = _rope(pooled.unsqueeze(1), cos=cos[0].index_select(0, starts),
                           sin=sin[0].index_select(0, starts)).squeeze(1)
                dots = (q[0, qi].double() @ bk.double().T).T  # [nb, heads]
                sc = torch.relu(dots).sum(-1) / math.sqrt(hd)
                srt = torch.sort(sc, descending=True).values
                if srt[k - 1] > 0:
                    margins.append((float(srt[k - 1] - srt[k]), False))
                else:  # a tie at zero across the k-th place: torch's rule picks; keep zeros zero
                    pos = sc[sc > 0]
                    zero_dots = dots[sc == 0].max(-1).values
                    ms = [float(pos.min()) if pos.numel() else 1.0, float(-zero_dots.max()) if zero_dots.numel() else 1.0]
                    margins.append((min(ms), True))
        hooks.append(mod.register_forward_hook(hook))
    return margins, hooks



# Which gated-delta-rule implementation computed the reference: transformers uses the
# flash-linear-attention kernels when they are installed and its torch fallbacks otherwise.
DELTA_CALLS = {"torch_chunk_gated_delta_rule": 0, "torch_recurrent_gated_delta_rule": 0}


def instrument_delta_rule():
    import importlib
    for fam in ["qwen3_next", "qwen3_5", "qwen3_5_moe", "qwen4_exp"]:
        try:
            mod = importlib.import_module(f"transformers.models.{fam}.modeling_{fam}")
        except ImportError:
            continue
        for fname in DELTA_CALLS:
            f = getattr(mod, fname, None)
            if f is None or getattr(f, "_sluice_counted", False):
                continue

            def counted(*a, _f=f, _n=fname, **kw):
                DELTA_CALLS[_n] += 1
                return _f(*a, **kw)
            counted._sluice_counted = True
            setattr(mod, fname, counted)


def capture_activations(model, ids, path):
    """Per-module outputs (and main inputs) of one forward pass, for debugging a port."""
    store, hooks = {}, []
    pat = re.compile(r"(embed_tokens|norm|hyper_connection_mixer|layers\.\d+(\.(linear_attn|self_attn|mlp|ple|"
                     r"attn_hyper_connection|mlp_hyper_connection|input_layernorm|post_attention_layernorm|"
                     r"self_attn\.indexer|mlp\.shared_expert|mlp\.shared_expert_gate|mlp\.experts|mlp\.gate|"
                     r"linear_attn\.norm|ple\.ple_embedding))?)")
    for name, mod in model.named_modules():
        short = name.split("language_model.")[-1] if "language_model." in name else re.sub(r"^model\.", "", name)
        if name.startswith("model.visual") or not pat.fullmatch(short):
            continue

        def hook(m, args, kwargs, out, _n=short):
            def put(key, t):
                if isinstance(t, torch.Tensor):
                    store[key] = t.detach().cpu().numpy() if not t.is_floating_point() else \
                        t.detach().float().cpu().numpy()
            outs = out if isinstance(out, tuple) else (out,)
            for i, t in enumerate(outs):
                put(f"{_n}.out{i}", t)
            if args:
                put(f"{_n}.in0", args[0])
            for key in ("hidden_states", "gate"):
                if key in kwargs:
                    put(f"{_n}.{key}", kwargs[key])
            if len(args) > 1:
                put(f"{_n}.in1", args[1])
        hooks.append(mod.register_forward_hook(hook, with_kwargs=True))
    with torch.no_grad():
        model(torch.tensor([ids]))
    for h in hooks:
        h.remove()
    np.savez_compressed(path, **store)


def reference(model, prompt_ids):
    ids = list(prompt_ids)
    with torch.no_grad():
        logits_prompt = model(torch.tensor([ids])).logits[0].float().numpy()
        for _ in range(N_CONTINUATION):
            nxt = int(model(torch.tensor([ids])).logits[0, -1].argmax())
            ids.append(nxt)
        logits_full = model(torch.tensor([ids])).logits[0].float().numpy()
    return ids[len(prompt_ids):], logits_prompt, logits_full


def fixture_prompt_ids(name: str, tok) -> list[int]:
    _, _, _, bos, *rest = FIXTURES[name]
    prompt = (rest[0] if rest else {}).get("prompt", PROMPT)
    ids = prompt(tok) if callable(prompt) else tok.encode(prompt).ids
    return ([tok.token_to_id(bos)] + ids) if bos is not None else ids


def seeded_model(name: str, seed: int):
    """The fixture's model for one seed: initialized, every parameter perturbed, rounded to
    the saved precision and back to f32 (what the margins are measured on)."""
    model_type, kwargs, dtype, _, *rest = FIXTURES[name]
    opts = rest[0] if rest else None
    torch.manual_seed(seed)
    model = new_model(model_class(opts), build_config(model_type, kwargs, opts)).float().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * PERTURB_STD)
        for key, factor in (opts or {}).get("scale", {}).items():
            for pname, p in model.named_parameters():
                if pname.endswith(key):
                    p.mul_(factor)
        if (opts or {}).get("router_bias"):  # a buffer, not a parameter: the perturbation leaves it at zero
            for bname, b in model.named_buffers():
                if bname.endswith("e_score_correction_bias"):
                    b.copy_(torch.randn_like(b) * opts["router_bias"])
    return model.to(dtype).float()


def measure_seed(name: str, seed: int, prompt_ids, tok):
    """The full measurement: every router (and QSA indexer) call of the reference run."""
    k = FIXTURES[name][1].get("num_experts_per_tok", FIXTURES[name][1].get("top_k_experts", 0))
    model = seeded_model(name, seed)
    margins, hooks = router_margins(model, k) if k else ([], [])
    qmargins, qhooks = qsa_margins(model)
    cont, _, _ = reference(model, prompt_ids)
    for h in hooks + qhooks:
        h.remove()
    m = min(margins) if margins else 1.0
    qm = min(m for m, _ in qmargins) if qmargins else 1.0
    score = min(m, qm)
    if max(cont) >= tok.get_vocab_size():  # a continuation the tokenizer cannot print
        score = -1.0
    print(f"  {name} seed {seed}: router margin {m:.4g}, qsa margin {qm:.4g} over {len(qmargins)} dropping queries",
          flush=True)
    return score, seed, model, m, qm, len(qmargins)


# Screening (fixtures with "search"): prompt ids per fixture, set before the pool forks.
SCREEN_PROMPTS: dict = {}


def screen_seed(job):
    """Worker: the smallest router top-k margin of the prompt pass alone for one seed, an
    upper bound of the whole reference run's minimum (the run's calls include these)."""
    name, seed = job
    torch.set_num_threads(1)
    k = FIXTURES[name][1].get("num_experts_per_tok", FIXTURES[name][1].get("top_k_experts", 0))
    model = seeded_model(name, seed)
    margins, hooks = router_margins(model, k)
    with torch.no_grad():
        model(torch.tensor([SCREEN_PROMPTS[name]]))
    for h in hooks:
        h.remove()
    return name, seed, min(margins) if margins else 1.0


def screen_seeds(names, tok, seconds: float) -> dict:
    """name -> [(prompt-pass margin, seed)] best first, over as many seeds as fit in `seconds`
    (round-robin over the fixtures, all cores)."""
    import multiprocessing as mp
    import time
    for n in names:
        SCREEN_PROMPTS[n] = fixture_prompt_ids(n, tok)
    most = max(FIXTURES[n][4]["search"] for n in names)
    jobs = [(n, s) for s in range(most) for n in names if s < FIXTURES[n][4]["search"]]
    found = {n: [] for n in names}
    t0 = time.time()
    workers = max(1, (os.cpu_count() or 2) - 1)
    pool = mp.get_context("fork").Pool(workers)
    try:
        results = pool.imap_unordered(screen_seed, jobs)  # chunksize 1: an iterator with next(timeout)
        while True:
            left = seconds - (time.time() - t0)
            if left <= 0:
                break
            try:  # bounded: a stuck worker ends the screening, not the run
                name, seed, m = results.next(timeout=left)
            except (StopIteration, mp.TimeoutError):
                break
            found[name].append((m, seed))
    finally:
        pool.terminate()
        pool.join()
    for n in names:
        found[n].sort(key=lambda t: (-t[0], t[1]))
        top = ", ".join(f"{m:.3g}@{s}" for m, s in found[n][:5])
        print(f"screen {n}: {len(found[n])} seeds in {time.time() - t0:.0f} s; best prompt-pass margins {top}",
              flush=True)
    return found


# Config fields the published checkpoints carry that transformers' config class may not
# declare: kept out of the config object and written into the saved config.json.
JSON_ONLY = ("num_nextn_predict_layers", "rotary_dim")


def add_json_only(out: pathlib.Path, kwargs: dict):
    extra = {k: kwargs[k] for k in JSON_ONLY if k in kwargs}
    if extra:
        cfg = json.loads((out / "config.json").read_text())
        cfg.update(extra)
        (out / "config.json").write_text(json.dumps(cfg, indent=2))


def append_mtp_layer(out: pathlib.Path, n_layers: int, seed: int):
    """The published DeepSeek-V3 / GLM-4.5 checkpoints carry their multi-token-prediction
    layer as model.layers.<num_hidden_layers>.*: a decoder layer plus enorm, hnorm, eh_proj
    [H, 2H], embed_tokens and shared_head (norm, head). Appended here (a copy of the last
    layer's tensors under the new index and random MTP tensors); transformers skips it."""
    from safetensors.torch import load_file, save_file
    sd = load_file(str(out / "model.safetensors"))
    last = f"model.layers.{n_layers - 1}."
    new = f"model.layers.{n_layers}."
    g = torch.Generator().manual_seed(seed)
    for key in [k for k in sd if k.startswith(last)]:
        sd[new + key[len(last):]] = sd[key].clone()
    h = sd["model.norm.weight"].shape[0]
    dt = sd["model.norm.weight"].dtype
    rnd = lambda *shape: (torch.randn(*shape, generator=g) * 0.05).to(dt)
    sd[new + "enorm.weight"] = torch.ones(h, dtype=dt)
    sd[new + "hnorm.weight"] = torch.ones(h, dtype=dt)
    sd[new + "eh_proj.weight"] = rnd(h, 2 * h)
    sd[new + "embed_tokens.weight"] = sd["model.embed_tokens.weight"].clone()
    sd[new + "shared_head.norm.weight"] = torch.ones(h, dtype=dt)
    sd[new + "shared_head.head.weight"] = sd.get("lm_head.weight", sd["model.embed_tokens.weight"]).clone()  # tied: no lm_head
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})


FP8_MAX = 448.0  # the largest finite float8_e4m3fn


def is_fp8_matrix(key: str, t) -> bool:
    """The tensors DeepSeek-V3's FP8 checkpoint stores in F8_E4M3: every linear projection;
    not the embeddings, the output head, norms, the router (mlp.gate) or its bias."""
    return (key.endswith("_proj.weight") or key.endswith("_proj_with_mqa.weight")) and t.dim() == 2 \
        and ".mlp.gate." not in key


def write_fp8(out: pathlib.Path, block: list):
    """Rewrites the saved projections as F8_E4M3 with a float32 weight_scale_inv per block of
    block[0] x block[1] (edge blocks partial): scale = amax / 448 (1 for an all-zero block),
    q = round-to-nearest(w / scale) in e4m3, dequantized q * scale in float32. Returns {key:
    dequantized f32 tensor}, also written to fp8_dequantized.safetensors."""
    from safetensors.torch import load_file, save_file
    sd = load_file(str(out / "model.safetensors"))
    deq = {}
    br, bc = block
    for key in [k for k in sd if is_fp8_matrix(k, sd[k])]:
        w = sd.pop(key).float()
        r, c = w.shape
        nr, nc = -(-r // br), -(-c // bc)
        pad = torch.zeros(nr * br, nc * bc)
        pad[:r, :c] = w
        blocks = pad.view(nr, br, nc, bc)
        amax = blocks.abs().amax(dim=(1, 3))
        scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax)).float()
        full = scale.repeat_interleave(br, 0).repeat_interleave(bc, 1)[:r, :c]
        q = (w / full).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
        sd[key] = q.contiguous()
        sd[key.replace(".weight", ".weight_scale_inv")] = scale.contiguous()
        deq[key] = q.float() * full
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    save_file({k: v.contiguous() for k, v in deq.items()}, str(out / "fp8_dequantized.safetensors"))
    cfg = json.loads((out / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                  "weight_block_size": list(block)}
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return deq


FP4_GRID = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]  # e2m1 magnitudes by code (bit 3: sign)


def mxfp4_quantize(w):
    """w [..., K] (K % 32 == 0) -> (blocks [..., K/32, 16] uint8, scales [..., K/32] uint8) in
    gpt-oss's layout: byte j of a block holds elements 2j (low nibble) and 2j + 1 (high); the
    scale is e8m0 (2^(s - 127)) with s = floor(log2 amax) - 2 + 127, so amax lands in [4, 8)
    (6 is the largest code: saturation above it); nearest code, ties to the lower code."""
    g = w.double().reshape(*w.shape[:-1], -1, 32)
    amax = g.abs().amax(-1)
    e = torch.where(amax > 0, torch.floor(torch.log2(amax.clamp_min(1e-300))) - 2, torch.full_like(amax, -127.0))
    e = e.clamp(-127, 127)
    scaled = g / torch.pow(2.0, e)[..., None]
    grid = torch.tensor(FP4_GRID, dtype=torch.double)
    idx = (scaled.abs()[..., None] - grid).abs().argmin(-1)
    code = idx | ((scaled < 0).long() << 3)
    blocks = (code[..., 0::2] | (code[..., 1::2] << 4)).to(torch.uint8)
    return blocks, (e + 127).to(torch.uint8)


def mxfp4_dequantize(blocks, scales):
    lut = torch.tensor(FP4_GRID + [-v for v in FP4_GRID], dtype=torch.float32)
    b = blocks.long()
    vals = torch.stack([lut[b & 15], lut[b >> 4]], dim=-1).reshape(*blocks.shape[:-1], 32)
    vals = torch.ldexp(vals, (scales.long() - 127)[..., None].float())
    return vals.reshape(*blocks.shape[:-2], -1)


def write_mxfp4_experts(out: pathlib.Path, n_embd: int, n_ff: int):
    """Rewrites the saved checkpoint's expert matrices in gpt-oss's MXFP4 layout: gate_up [E, H,
    2F] -> gate_up_proj_blocks [E, 2F, H/32, 16] and _scales [E, 2F, H/32]; down [E, F, H] ->
    down_proj_blocks [E, H, F/32, 16] and _scales [E, H, F/32]; biases as saved. Returns
    {param key: dequantized tensor in the saved layout}."""
    from safetensors.torch import load_file, save_file
    sd = load_file(str(out / "model.safetensors"))
    deq = {}
    for key in list(sd):
        if not (key.endswith("mlp.experts.gate_up_proj") or key.endswith("mlp.experts.down_proj")):
            continue
        t = sd.pop(key).float()
        gate_up = key.endswith("gate_up_proj")
        out_dim, in_dim = (2 * n_ff, n_embd) if gate_up else (n_embd, n_ff)
        if list(t.shape[1:]) == [in_dim, out_dim]:  # [E, in, out] (the original layout): rows = outputs
            rows, transposed = t.transpose(1, 2), True
        elif list(t.shape[1:]) == [out_dim, in_dim]:
            rows, transposed = t, False
        else:
            raise RuntimeError(f"{key}: shape {list(t.shape)} is neither [E, {in_dim}, {out_dim}] nor the transpose")
        blocks, scales = mxfp4_quantize(rows)
        sd[key + "_blocks"] = blocks.contiguous()
        sd[key + "_scales"] = scales.contiguous()
        d = mxfp4_dequantize(blocks, scales)
        deq[key] = d.transpose(1, 2).contiguous() if transposed else d
    save_file(sd, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((out / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    return deq


def load_mxfp4_reference(cls, out: pathlib.Path, deq: dict):
    """The reference model of an MXFP4 fixture: transformers' own load (dequantizing), checked
    against the script's dequantization of the same blocks; where transformers cannot load it
    here, the bf16 model with the dequantized experts put in (said in reference.json)."""
    try:
        from transformers import Mxfp4Config
        m = cls.from_pretrained(str(out), dtype=torch.float32, attn_implementation="eager",
                                quantization_config=Mxfp4Config(dequantize=True)).float().eval()
        st = m.state_dict()
        for key, d in deq.items():
            if key not in st or not torch.equal(st[key].float(), d.float()):
                raise RuntimeError(f"{key}: transformers' dequantized tensor differs from the blocks' values")
        return m, "transformers (Mxfp4Config(dequantize=True)), equal to the script's dequantization"
    except Exception as e:  # noqa: BLE001 - recorded, then the fallback
        print(f"  mxfp4: transformers load failed ({type(e).__name__}: {e}); reference from the script's dequantization")
        traceback.print_exc()
        return None, f"script (transformers failed: {type(e).__name__}: {str(e)[:200]})"


def make_fixture(root: pathlib.Path, name: str, tok, screened=None, full_seconds: float = 60.0):
    import time
    model_type, kwargs, dtype, bos, *rest = FIXTURES[name]
    opts = rest[0] if rest else None
    out = root / name
    out.mkdir(parents=True, exist_ok=True)
    prompt = (opts or {}).get("prompt", PROMPT)
    prompt_ids = fixture_prompt_ids(name, tok)
    cls = model_class(opts)
    best = None
    n_screened = 0
    if screened:  # best candidates first until none left can beat the best full measurement
        n_screened = len(screened)
        t0 = time.time()
        for bound, seed in screened:
            if best is not None and (bound <= best[0] or time.time() - t0 > full_seconds):
                break
            got = measure_seed(name, seed, prompt_ids, tok)
            if best is None or got[0] > best[0]:
                best = got
    else:
        for seed in range((opts or {}).get("seeds", N_SEED_TRIES)):
            got = measure_seed(name, seed, prompt_ids, tok)
            if best is None or got[0] > best[0]:
                best = got
    _, seed, model, margin, qmargin, n_dropping = best
    model.to(dtype)
    saved_state = {key: t.detach().clone() for key, t in model.state_dict().items()}
    model.save_pretrained(str(out), safe_serialization=True)
    (out / "tokenizer.json").write_text((root / "_tokenizer" / "tokenizer.json").read_text())
    write_tokenizer_config(out, bos)
    # Reload as saved, compute references in float32 on the CPU.
    ref_model = cls.from_pretrained(str(out), dtype=torch.float32, attn_implementation="eager").eval()
    mxfp4_by, mxfp4_keys = None, set()
    if (opts or {}).get("mxfp4"):
        deq = write_mxfp4_experts(out, kwargs["hidden_size"], kwargs["intermediate_size"])
        mxfp4_keys = set(deq)
        for key in deq:
            saved_state.pop(key, None)
        got, mxfp4_by = load_mxfp4_reference(cls, out, deq)
        if got is None:  # the bf16 model (loaded above, before the rewrite) with the dequantized experts
            with torch.no_grad():
                st = ref_model.state_dict()
                for key, d in deq.items():
                    st[key].copy_(d)
        else:
            ref_model = got
    if (opts or {}).get("fp8"):  # the reference: the bf16-rounded dequantization (what a bf16 run holds)
        import shutil
        from safetensors.torch import load_file, save_file
        deq_dir = out.parent / (out.name + ".dequantized")
        shutil.rmtree(deq_dir, ignore_errors=True)
        shutil.copytree(out, deq_dir)
        deq = write_fp8(out, opts["fp8"])
        sd = load_file(str(deq_dir / "model.safetensors"))
        for key, d in deq.items():
            sd[key] = d.to(torch.bfloat16)
        save_file(sd, str(deq_dir / "model.safetensors"), metadata={"format": "pt"})
        # transformers maps the checkpoint's per-expert names onto its own layout on load
        ref_model = cls.from_pretrained(str(deq_dir), dtype=torch.float32, attn_implementation="eager").eval()
        saved_state = {key: t.detach().clone() for key, t in ref_model.state_dict().items()}
        shutil.rmtree(deq_dir)
    add_json_only(out, kwargs)
    if (opts or {}).get("mtp"):
        append_mtp_layer(out, kwargs["num_hidden_layers"], seed)
    # The reference must come from exactly the saved weights (a missed conversion would
    # leave a freshly initialized tensor behind without an error).
    got_state = ref_model.state_dict()
    bad = [key for key, t in saved_state.items() if t.is_floating_point() and
           (key not in got_state or not torch.equal(t.float(), got_state[key].float()))]
    bad += [key for key in got_state if key not in saved_state and key not in mxfp4_keys]
    if bad:
        print(f"  {name}: WARNING: reloaded weights differ from the saved ones: {bad[:8]} ({len(bad)})")
    for key in DELTA_CALLS:
        DELTA_CALLS[key] = 0
    cont, lp, lf = reference(ref_model, prompt_ids)
    np.save(out / "logits_prompt.npy", lp.astype(np.float32))
    np.save(out / "logits_full.npy", lf.astype(np.float32))
    ref = {"family": model_type, "prompt": prompt if isinstance(prompt, str) else inspect.getdoc(prompt),
           "prompt_ids": prompt_ids, "continuation_ids": cont, "seed": seed, "min_router_topk_margin": margin,
           "saved_dtype": str(dtype).replace("torch.", ""),
           "transformers_version": transformers.__version__, "torch_version": torch.__version__}
    if n_screened:
        ref["seeds_screened"] = n_screened
    if mxfp4_by:
        ref["mxfp4_reference"] = mxfp4_by
    if opts:
        if "cls" in opts:
            ref["model_class"] = opts["cls"]
        if n_dropping:  # counted over all passes of the seed's reference run (prompt, each step, full)
            ref["min_qsa_block_topk_margin"] = qmargin
            ref["qsa_queries_dropping_blocks"] = n_dropping
        if any(DELTA_CALLS.values()) or "linear_attention" in json.dumps(kwargs):
            fla = importlib.util.find_spec("fla") is not None
            ref["delta_rule"] = {"calls": dict(DELTA_CALLS),
                                 "implementation": "flash-linear-attention kernels" if fla else
                                 "transformers' torch fallbacks (flash-linear-attention not installed)"}
        if bad:
            ref["reload_mismatch"] = bad
    (out / "reference.json").write_text(json.dumps(ref, indent=1))
    if os.environ.get("SLUICE_FIXTURE_DEBUG"):
        dbg = pathlib.Path(os.environ["SLUICE_FIXTURE_DEBUG"])
        dbg.mkdir(parents=True, exist_ok=True)
        capture_activations(ref_model, prompt_ids, dbg / f"{name}.npz")
    size = sum(f.stat().st_size for f in out.iterdir())
    from safetensors import safe_open
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        keys = sorted(f.keys())
    print(f"{name}: seed {seed} margin {margin:.4g} qsa {qmargin:.4g}/{n_dropping} size {size} "
          f"prompt {len(prompt_ids)} cont {cont} delta {dict(DELTA_CALLS)}")
    print("   keys:", [k for k in keys if ("layers.0." in k or "layers.1." in k or "layers" not in k)
                       and "visual" not in k and "experts.1" not in k and not re.search(r"experts\.[2-9]", k)])
    print("   n keys:", len(keys), "visual:", sum("visual" in k for k in keys))


def main():
    root = pathlib.Path(sys.argv[1])
    names = sys.argv[2:] or list(FIXTURES)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    instrument_delta_rule()
    tok = make_tokenizer(root / "_tokenizer")
    seconds = float(os.environ.get("SLUICE_FIXTURE_SEARCH_SECONDS", "60"))
    full_seconds = float(os.environ.get("SLUICE_FIXTURE_FULL_SECONDS", str(seconds / 2)))
    search = [n for n in names if len(FIXTURES[n]) > 4 and "search" in FIXTURES[n][4]]
    screened = {}
    if search:  # before any torch op in this process: the pool forks it
        try:
            screened = screen_seeds(search, tok, seconds)
        except Exception:  # fall back to the plain loop over N_SEED_TRIES seeds
            traceback.print_exc()
    torch.set_num_threads(8)
    failed = []
    for name in names:
        try:
            make_fixture(root, name, tok, screened.get(name), full_seconds=full_seconds)
        except Exception:  # one broken fixture must not cost the others their run
            traceback.print_exc()
            failed.append(name)
    if failed:
        print("FAILED:", failed)
        sys.exit(1)


if __name__ == "__main__":
    main()
