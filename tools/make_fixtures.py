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
"""
import inspect
import json
import pathlib
import sys

import numpy as np
import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

PROMPT = "The river carries the boat past the old mill, and the miller counts"
N_CONTINUATION = 10
VOCAB = 512           # model vocabulary (the tokenizer uses the first ~500 ids)
PERTURB_STD = 0.05    # added to every parameter after init, norm weights included
N_SEED_TRIES = 12     # keep the seed whose smallest router top-k margin is largest


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


# name -> (model_type, config kwargs, saved dtype, bos token or None)
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


def build_config(model_type: str, kwargs: dict):
    kwargs = dict(kwargs)
    rope_scaling = kwargs.pop("rope_scaling", None)
    theta = kwargs.pop("rope_theta")
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


def router_margins(model, k: int):
    """Hooks on every router; returns a list that fills with top-k margins (prob_k - prob_k+1)."""
    margins = []
    hooks = []
    for name, mod in model.named_modules():
        w = getattr(mod, "weight", None)
        if name.endswith(".gate") and w is not None and w.dim() == 2 and w.shape[0] <= 64 \
                and w.shape[1] == model.config.hidden_size:
            def hook(m, args, out, _w=w):
                x = args[0].reshape(-1, _w.shape[1]).double()
                p = torch.softmax(x @ _w.double().T, dim=-1)
                s = torch.sort(p, dim=-1, descending=True).values
                margins.append(float((s[:, k - 1] - s[:, k]).min()))
            hooks.append(mod.register_forward_hook(hook))
    return margins, hooks


def reference(model, prompt_ids):
    ids = list(prompt_ids)
    with torch.no_grad():
        logits_prompt = model(torch.tensor([ids])).logits[0].float().numpy()
        for _ in range(N_CONTINUATION):
            nxt = int(model(torch.tensor([ids])).logits[0, -1].argmax())
            ids.append(nxt)
        logits_full = model(torch.tensor([ids])).logits[0].float().numpy()
    return ids[len(prompt_ids):], logits_prompt, logits_full


def make_fixture(root: pathlib.Path, name: str, tok):
    model_type, kwargs, dtype, bos = FIXTURES[name]
    out = root / name
    out.mkdir(parents=True, exist_ok=True)
    prompt_ids = tok.encode(PROMPT).ids
    if bos is not None:
        prompt_ids = [tok.token_to_id(bos)] + prompt_ids
    k = kwargs["num_experts_per_tok"]
    best = None
    for seed in range(N_SEED_TRIES):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(build_config(model_type, kwargs)).float().eval()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * PERTURB_STD)
        model = model.to(dtype).float()  # round to the saved precision before measuring
        margins, hooks = router_margins(model, k)
        reference(model, prompt_ids)
        for h in hooks:
            h.remove()
        m = min(margins) if margins else 1.0
        if best is None or m > best[0]:
            best = (m, seed, model)
    margin, seed, model = best
    model.to(dtype).save_pretrained(str(out), safe_serialization=True)
    (out / "tokenizer.json").write_text((root / "_tokenizer" / "tokenizer.json").read_text())
    write_tokenizer_config(out, bos)
    # Reload as saved, compute references in float32 on the CPU.
    ref_model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32,
                                                     attn_implementation="eager").eval()
    cont, lp, lf = reference(ref_model, prompt_ids)
    np.save(out / "logits_prompt.npy", lp.astype(np.float32))
    np.save(out / "logits_full.npy", lf.astype(np.float32))
    ref = {"family": model_type, "prompt": PROMPT, "prompt_ids": prompt_ids,
           "continuation_ids": cont, "seed": seed, "min_router_topk_margin": margin,
           "saved_dtype": str(dtype).replace("torch.", ""),
           "transformers_version": transformers.__version__, "torch_version": torch.__version__}
    (out / "reference.json").write_text(json.dumps(ref, indent=1))
    size = sum(f.stat().st_size for f in out.iterdir())
    from safetensors import safe_open
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        keys = sorted(f.keys())
    print(f"{name}: seed {seed} margin {margin:.4g} size {size} prompt {len(prompt_ids)} cont {cont}")
    print("   keys:", [k for k in keys if "layers.0." in k or "layers" not in k])


def main():
    root = pathlib.Path(sys.argv[1])
    names = sys.argv[2:] or list(FIXTURES)
    torch.set_num_threads(8)
    tok = make_tokenizer(root / "_tokenizer")
    for name in names:
        make_fixture(root, name, tok)


if __name__ == "__main__":
    main()
