#!/usr/bin/env python3
"""The fixture farm: many small random configs per family, each a real HF checkpoint with
transformers' teacher-forced logits at every position (independent checkpoints from other
configs find mismatches that the hand-made fixtures miss: a qwen4_exp one was found so).

Runs on the GPU machine (torch and transformers 5.17 are there), on its CPU cores:
    python3 tools/make_farm.py tests/fixtures/farm [--per-family N] [--families a,b]
For each config it writes tests/fixtures/farm/<family>_<nn>/:
    config.json, model.safetensors   the checkpoint (no tokenizer: the test feeds token ids)
    reference.json                   prompt ids, seed, margins, what the config exercises
    logits.npy                       [n_prompt, vocab] f32, one teacher-forced pass, f32 on the CPU
tests/models/farm_test.cpp checks every position of every config against logits.npy (1e-4),
both as one prefill and as a prefill followed by token-by-token decode.

The configs are drawn from a seeded generator (the farm is reproducible): layer type mixes,
head counts and sizes, rope variants (default, linear, yarn with and without mscale, partial
rotary, M-RoPE sections, interleaved rotary keys), latent attention sizes with and without a
q-LoRA, group-limited sigmoid routing (1 to 8 groups, correction biases, scaling, shared
experts, dense leading layers, MTP layers),
sliding windows shorter than the prompt, QSA budgets and compress ratios, PLE settings,
hyper-connection counts, top_k from 1 up, dense/MoE layer mixes, biases, clip_qkv, tied
embeddings, saved dtypes, text-only and multimodal layouts, prompts of 16-96 tokens.
Each config's weight seed is searched (make_fixtures.py's margins) so that no router top-k
and no QSA block top-k is decided by a gap below MARGIN_MIN: f32 rounding differences
(~1e-6) between two correct implementations must not flip a choice. QSA blocks that tie at
exactly zero (relu of all-negative dot products) are kept: which of them win is torch.topk's
rule, and the farm is there to check that sluice follows it; what is searched away there is a
zero score that a rounding could make positive (or a positive one that could become zero).
Kept small: tiny dimensions, vocabularies of 64-128, bf16 weights for most configs.
"""
import json
import math
import multiprocessing as mp
import os
import pathlib
import random
import sys
import time
import traceback

import numpy as np
import torch
import transformers

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import make_fixtures as mf  # noqa: E402

LIN, FULL, QSA = "linear_attention", "full_attention", "qwen_sparse_attention"
PER_FAMILY = {"qwen3_moe": 6, "mixtral": 4, "olmoe": 4, "qwen3_next": 5, "qwen3_5_moe": 4, "qwen4_exp": 10,
              "deepseek_v3": 10, "glm4_moe": 6, "minimax_m2": 5}
SEEDS_PER_CONFIG = 8   # weight seeds tried per config (the best margin is kept)
MARGIN_MIN = 1e-4      # a config whose best seed is below this is drawn again
MAX_DRAWS = 6          # configs drawn per farm slot before giving up on it


def pick(rng, xs):
    return xs[rng.randrange(len(xs))]


def common(rng, hidden=None):
    n_head = pick(rng, [2, 4])
    return dict(vocab_size=pick(rng, [64, 96, 128]), hidden_size=hidden or pick(rng, [32, 48]),
                num_attention_heads=n_head, num_key_value_heads=pick(rng, [d for d in (1, 2, 4) if n_head % d == 0]),
                head_dim=pick(rng, [8, 16]), max_position_embeddings=256, rms_norm_eps=pick(rng, [1e-6, 1e-5]),
                tie_word_embeddings=rng.random() < 0.3, initializer_range=0.08, attention_dropout=0.0)


def rope_scaling(rng):
    r = rng.random()
    if r < 0.5:
        return None
    if r < 0.7:
        return {"rope_type": "linear", "factor": pick(rng, [2.0, 4.0])}
    return {"rope_type": "yarn", "factor": pick(rng, [2.0, 4.0]), "original_max_position_embeddings": pick(rng, [32, 64])}


def moe_counts(rng):
    n_exp = pick(rng, [4, 6, 8])
    return n_exp, rng.randint(1, min(4, n_exp - 1))


def draw_qwen3_moe(rng):
    kw = common(rng)
    n_exp, k = moe_counts(rng)
    L = rng.randint(1, 3)
    kw.update(num_hidden_layers=L, intermediate_size=pick(rng, [32, 48]), moe_intermediate_size=pick(rng, [8, 16]),
              num_experts=n_exp, num_experts_per_tok=k, decoder_sparse_step=pick(rng, [1, 1, 2]),
              mlp_only_layers=[l for l in range(L) if rng.random() < 0.25], norm_topk_prob=rng.random() < 0.5,
              attention_bias=rng.random() < 0.3, rope_theta=pick(rng, [10000.0, 1000000.0]))
    if rng.random() < 0.35:
        kw.update(use_sliding_window=True, sliding_window=rng.randint(3, 12))
    if (rs := rope_scaling(rng)):
        kw["rope_scaling"] = rs
    return "qwen3_moe", kw, None


def draw_mixtral(rng):
    kw = common(rng)
    n_exp, k = moe_counts(rng)
    kw.update(num_hidden_layers=rng.randint(1, 3), intermediate_size=pick(rng, [16, 24]), num_local_experts=n_exp,
              num_experts_per_tok=k, rope_theta=pick(rng, [10000.0, 1000000.0]))
    if rng.random() < 0.7:
        kw["sliding_window"] = rng.randint(3, 12)
    return "mixtral", kw, None


def draw_olmoe(rng):
    kw = common(rng)
    del kw["head_dim"]  # OLMoE's q/k norms span the whole projection: head_dim is hidden / heads
    n_exp, k = moe_counts(rng)
    kw.update(num_hidden_layers=rng.randint(1, 3), intermediate_size=pick(rng, [16, 24]), num_experts=n_exp,
              num_experts_per_tok=k, norm_topk_prob=rng.random() < 0.5, attention_bias=rng.random() < 0.3,
              rope_theta=10000.0)
    if rng.random() < 0.4:
        kw["clip_qkv"] = pick(rng, [0.3, 0.5, 1.0])
    return "olmoe", kw, None


def hybrid_common(rng, allow):
    kw = common(rng, hidden=32)
    kw["head_dim"] = pick(rng, [16, 32])
    L = rng.randint(2, 4)
    types = [pick(rng, allow) for _ in range(L)]
    if all(t == LIN for t in types):
        types[rng.randrange(L)] = allow[-1]
    nk = pick(rng, [1, 2])
    partial = pick(rng, [0.25, 0.5, 1.0])
    rot_half = int(kw["head_dim"] * partial) // 2
    a = rot_half // 2
    b = (rot_half - a) // 2
    rope = {"rope_type": "default", "rope_theta": pick(rng, [10000.0, 1000000.0]), "partial_rotary_factor": partial,
            "mrope_section": [a, b, rot_half - a - b], "mrope_interleaved": True}
    kw.update(num_hidden_layers=L, layer_types=types, rope_parameters=rope, linear_conv_kernel_dim=pick(rng, [2, 3, 4]),
              linear_num_key_heads=nk, linear_num_value_heads=nk * pick(rng, [1, 2]),
              linear_key_head_dim=pick(rng, [8, 16]), linear_value_head_dim=pick(rng, [8, 16]))
    n_exp, k = moe_counts(rng)
    kw.update(num_experts=n_exp, num_experts_per_tok=k, moe_intermediate_size=pick(rng, [8, 16]),
              shared_expert_intermediate_size=pick(rng, [8, 16, 24]))
    return kw


def draw_qwen3_next(rng):
    kw = hybrid_common(rng, [LIN, LIN, FULL])
    L = kw["num_hidden_layers"]
    kw["rope_parameters"].pop("mrope_section")
    kw["rope_parameters"].pop("mrope_interleaved")
    kw.update(intermediate_size=pick(rng, [32, 48]), decoder_sparse_step=1, norm_topk_prob=rng.random() < 0.5,
              mlp_only_layers=[l for l in range(L) if rng.random() < 0.25])
    return "qwen3_next", kw, {"cls": "Qwen3NextForCausalLM"}


def draw_qwen3_5_moe(rng):
    kw = hybrid_common(rng, [LIN, LIN, FULL])
    if rng.random() < 0.5:
        return "qwen3_5_moe", kw, {"cls": "Qwen3_5MoeForConditionalGeneration",
                                   "vision": dict(mf.TINY_VISION, out_hidden_size=kw["hidden_size"])}
    return "qwen3_5_moe_text", kw, {"cls": "Qwen3_5MoeForCausalLM"}


def draw_qwen4_exp(rng):
    kw = hybrid_common(rng, [LIN, LIN, QSA, FULL])
    L = kw["num_hidden_layers"]
    rot = int(kw["head_dim"] * kw["rope_parameters"]["partial_rotary_factor"])
    c = pick(rng, [1, 2, 3, 4])
    kw.update(hc_count=rng.randint(2, 4), hc_lowrank=pick(rng, [8, 12, 16]), norm_topk_prob=rng.random() < 0.8,
              output_gate_type=pick(rng, ["silu", "sigmoid"]), indexer_n_heads=pick(rng, [1, 2, 4]),
              indexer_kv_heads=1, indexer_head_dim=max(rot, pick(rng, [8, 16])),
              indexer_budget=c * rng.randint(1, 4), indexer_compress_ratio=c)
    lin = [i + 1 for i, t in enumerate(kw["layer_types"]) if t == LIN]
    if lin and rng.random() < 0.5:
        ngram = pick(rng, [2, 3])
        heads = pick(rng, [1, 2])
        nh = (ngram - 1) * heads
        kw.update(ple_layer_ids=sorted(rng.sample(lin, rng.randint(1, len(lin)))), ple_embed_dim=nh * pick(rng, [4, 8]),
                  ple_conv_kernel_size=pick(rng, [1, 2, 3]), ngram_size=ngram, heads_per_ngram=heads,
                  ngram_vocab_size_base=pick(rng, [31, 50, 97]), make_ngram_vocab_size_divisible_by=pick(rng, [1, 8]),
                  seed=rng.randint(1, 10000), split_ngram_parts=pick(rng, [1, 2]))
        kw["eos_token_id"] = kw["vocab_size"] - 1
    if rng.random() < 0.5:
        return "qwen4_exp", kw, {"cls": "Qwen4ExpForConditionalGeneration",
                                 "vision": dict(mf.TINY_VISION, out_hidden_size=kw["hidden_size"])}
    return "qwen4_exp_text", kw, {"cls": "Qwen4ExpForCausalLM"}


def grouped_router(rng, max_experts=32):
    """Group-limited sigmoid routing (DeepSeek-V3, GLM-4.5): 1 to 8 groups of 2 to 4 experts,
    some of them kept, top-k inside them, a correction bias (make_fixtures' router_bias)."""
    groups = pick(rng, [1, 1, 2, 4, 8])
    per = pick(rng, [p for p in (2, 3, 4) if groups * p <= max_experts])
    keep = rng.randint(1, groups)
    k = rng.randint(1, min(4, keep * per))
    return dict(n_routed_experts=groups * per, n_group=groups, topk_group=keep, num_experts_per_tok=k,
                norm_topk_prob=rng.random() < 0.5, routed_scaling_factor=pick(rng, [1.0, 2.5, 1.75]))


def draw_deepseek_v3(rng):
    """Multi-head latent attention: a q-LoRA or a plain q, latent and head sizes, the rotary key
    interleaved or in halves, YaRN with and without mscale / mscale_all_dim (the softmax scale),
    attention biases; dense leading layers, shared experts, an MTP layer."""
    kw = common(rng)
    del kw["head_dim"]  # transformers sets head_dim to qk_rope_head_dim
    kw["num_key_value_heads"] = kw["num_attention_heads"]  # MLA forms keys and values per head
    L = rng.randint(1, 3)
    kw.update(grouped_router(rng))
    kw.update(num_hidden_layers=L, first_k_dense_replace=rng.randint(0, L - 1), n_shared_experts=pick(rng, [1, 1, 2]),
              q_lora_rank=pick(rng, [None, 8, 16]), kv_lora_rank=pick(rng, [8, 16, 24]),
              qk_nope_head_dim=pick(rng, [4, 8, 16]), qk_rope_head_dim=pick(rng, [2, 4, 8]),
              v_head_dim=pick(rng, [4, 8, 16]), intermediate_size=pick(rng, [32, 48]),
              moe_intermediate_size=pick(rng, [8, 12, 16]), rope_interleave=rng.random() < 0.5,
              attention_bias=rng.random() < 0.3, rope_theta=pick(rng, [10000.0, 50000.0]))
    r = rng.random()
    if r < 0.6:  # YaRN as DeepSeek-V3 / Kimi K2 ship it, mscale variants
        rs = {"rope_type": "yarn", "factor": pick(rng, [2.0, 4.0, 40.0]),
              "original_max_position_embeddings": pick(rng, [32, 64]), "beta_fast": 32.0, "beta_slow": 1.0}
        ms = pick(rng, [None, (1.0, 1.0), (1.0, 0.8), (0.707, 0.0), (1.0, 0.707)])
        if ms:
            rs.update(mscale=ms[0], mscale_all_dim=ms[1])
        kw["rope_scaling"] = rs
    elif r < 0.7:
        kw["rope_scaling"] = {"rope_type": "linear", "factor": 2.0}
    mtp = rng.random() < 0.5
    if mtp:
        kw["num_nextn_predict_layers"] = 1
    return "deepseek_v3", kw, {"plain": True, "router_bias": pick(rng, [0.05, 0.1]), "mtp": mtp}


def draw_glm4_moe(rng):
    """GLM-4.5: partial rotary (written into rope_parameters, as the fixtures do), q/k norms on
    or off, attention biases on or off, the grouped router, dense leading layers, an MTP layer."""
    kw = common(rng)
    L = rng.randint(1, 3)
    kw.update(grouped_router(rng))
    kw.update(num_hidden_layers=L, first_k_dense_replace=rng.randint(0, L - 1), n_shared_experts=pick(rng, [1, 1, 2]),
              intermediate_size=pick(rng, [32, 48]), moe_intermediate_size=pick(rng, [8, 12, 16]),
              use_qk_norm=rng.random() < 0.5, attention_bias=rng.random() < 0.6,
              rope_theta=pick(rng, [10000.0, 1000000.0]))
    rs = {"partial_rotary_factor": pick(rng, [0.25, 0.5, 1.0])}
    if rng.random() < 0.3:
        rs.update(rope_type="yarn", factor=2.0, original_max_position_embeddings=64)
    kw["rope_scaling"] = rs
    mtp = rng.random() < 0.5
    if mtp:
        kw["num_nextn_predict_layers"] = 1
    return "glm4_moe", kw, {"plain": True, "router_bias": pick(rng, [0.05, 0.1]), "mtp": mtp}


def draw_minimax_m2(rng):
    """MiniMax-M2: q/k norms over the whole projections, rotary on part of each head (in
    rope_parameters, and as the published config.json's rotary_dim on some), sigmoid routing
    with a correction bias, always renormalized."""
    kw = common(rng)
    n_exp = pick(rng, [4, 6, 8, 16])
    partial = pick(rng, [0.25, 0.5, 1.0])
    kw.update(num_hidden_layers=rng.randint(1, 3), intermediate_size=pick(rng, [16, 24]), num_local_experts=n_exp,
              num_experts_per_tok=rng.randint(1, min(4, n_exp - 1)), rope_theta=pick(rng, [10000.0, 5000000.0]),
              rope_scaling={"partial_rotary_factor": partial})
    if rng.random() < 0.5:
        kw["rotary_dim"] = int(kw["head_dim"] * partial)
    return "minimax_m2", kw, {"plain": True, "router_bias": pick(rng, [0.05, 0.1])}


DRAW = {"qwen3_moe": draw_qwen3_moe, "mixtral": draw_mixtral, "olmoe": draw_olmoe, "qwen3_next": draw_qwen3_next,
        "qwen3_5_moe": draw_qwen3_5_moe, "qwen4_exp": draw_qwen4_exp, "deepseek_v3": draw_deepseek_v3,
        "glm4_moe": draw_glm4_moe, "minimax_m2": draw_minimax_m2}


def build(model_type, kw, opts):
    if opts is None or opts.get("plain"):  # rope_theta / rope_scaling and JSON_ONLY fields as the fixtures
        return mf.build_config(model_type, kw, opts)
    if "vision" in opts:
        cfg = transformers.AutoConfig.for_model(model_type, text_config=kw, vision_config=opts["vision"],
                                                tie_word_embeddings=kw.get("tie_word_embeddings", False))
    else:
        cfg = transformers.AutoConfig.for_model(model_type, **kw)
    cfg._attn_implementation = "eager"
    return cfg


def seeded(cfg, opts, seed, dtype):
    torch.manual_seed(seed)
    cls = mf.model_class(opts)
    model = mf.new_model(cls, cfg).float().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * mf.PERTURB_STD)
        if (opts or {}).get("router_bias"):  # a buffer, not a parameter (make_fixtures' seeded_model)
            for bname, b in model.named_buffers():
                if bname.endswith("e_score_correction_bias"):
                    b.copy_(torch.randn_like(b) * opts["router_bias"])
    return model.to(dtype).float()


def measure(model, k, ids):
    rm, rh = mf.router_margins(model, k)
    qm, qh = mf.qsa_margins(model)
    with torch.no_grad():
        model(torch.tensor([ids]))
    for h in rh + qh:
        h.remove()
    return (min(rm) if rm else 1.0), (min(m for m, _ in qm) if qm else 1.0), sum(1 for _, tie in qm if tie)


def make_one(job):
    """One farm slot: draw configs until one has a seed with margins >= MARGIN_MIN; save it."""
    root, family, index = job
    torch.set_num_threads(1)
    rng = random.Random(f"{family}-{index}")
    name = f"{family}_{index:02d}"
    log = []
    for draw in range(MAX_DRAWS):
        model_type, kw, opts = DRAW[family](rng)
        dtype = pick(rng, [torch.bfloat16, torch.bfloat16, torch.float16, torch.float32])
        n_prompt = rng.randint(16, 96)
        vocab = kw["vocab_size"]
        ids = [rng.randrange(vocab) for _ in range(n_prompt)]
        if "eos_token_id" in kw:  # PLE: n-grams restart after the end-of-text token
            for p in rng.sample(range(2, n_prompt - 2), 2):
                ids[p] = kw["eos_token_id"]
        try:
            cfg = build(model_type, dict(kw), opts)
        except Exception as e:  # a draw transformers rejects: draw again
            log.append(f"draw {draw}: config rejected: {e}")
            continue
        try:
            got = search_and_save(root, name, family, model_type, kw, opts, dtype, ids, draw, log)
        except Exception:  # a draw that breaks transformers: log it, draw again
            log.append(f"draw {draw}: " + traceback.format_exc().strip().splitlines()[-1])
            continue
        if got:
            return name, got, log
    return name, 0, log


def search_and_save(root, name, family, model_type, kw, opts, dtype, ids, draw, log):
    """The seed search for one drawn config; saves it and returns its size in bytes, or 0."""
    cfg = build(model_type, dict(kw), opts)
    k = kw.get("num_experts_per_tok", 0)
    best = None
    for seed in range(SEEDS_PER_CONFIG):
        model = seeded(cfg, opts, seed, dtype)
        rm, qm, nq = measure(model, k, ids)
        if best is None or min(rm, qm) > min(best[1], best[2]):
            best = (seed, rm, qm, nq)
    log.append(f"draw {draw}: best seed {best[0]} router {best[1]:.3g} qsa {best[2]:.3g}, {best[3]} zero ties")
    if min(best[1], best[2]) < MARGIN_MIN:
        return 0
    out = pathlib.Path(root) / name
    out.mkdir(parents=True, exist_ok=True)
    model = seeded(cfg, opts, best[0], dtype).to(dtype)
    model.save_pretrained(str(out), safe_serialization=True)
    for extra in ("generation_config.json",):
        (out / extra).unlink(missing_ok=True)
    mf.add_json_only(out, kw)  # rotary_dim, num_nextn_predict_layers: as published config.json files carry them
    if (opts or {}).get("mtp"):  # the MTP layer a DeepSeek-V3 / GLM-4.5 checkpoint carries; transformers skips it
        mf.append_mtp_layer(out, kw["num_hidden_layers"], best[0])
    cls = mf.model_class(opts)
    ref = cls.from_pretrained(str(out), dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        logits = ref(torch.tensor([ids])).logits[0].float().numpy()
    np.save(out / "logits.npy", logits.astype(np.float32))
    (out / "reference.json").write_text(json.dumps({
        "family": family, "model_type": model_type, "model_class": (opts or {}).get("cls", "AutoModelForCausalLM"),
        "prompt_ids": ids, "seed": best[0], "min_router_topk_margin": best[1], "min_qsa_margin": best[2],
        "qsa_zero_tie_queries": best[3], "saved_dtype": str(dtype).replace("torch.", ""),
        "config": {k2: v for k2, v in kw.items() if not isinstance(v, float) or math.isfinite(v)},
        "transformers_version": transformers.__version__, "torch_version": torch.__version__}, indent=1))
    return sum(f.stat().st_size for f in out.iterdir())


def main():
    args = sys.argv[1:]
    root = pathlib.Path(args[0])
    per = dict(PER_FAMILY)
    if "--per-family" in args:
        n = int(args[args.index("--per-family") + 1])
        per = {f: n for f in per}
    if "--families" in args:
        keep = args[args.index("--families") + 1].split(",")
        per = {f: n for f, n in per.items() if f in keep}
    root.mkdir(parents=True, exist_ok=True)
    jobs = [(str(root), f, i) for f, n in per.items() for i in range(n)]
    t0 = time.time()
    total, failed = 0, []
    with mp.get_context("fork").Pool(max(1, (os.cpu_count() or 2) - 1)) as pool:
        for name, size, log in pool.imap_unordered(make_one, jobs):
            total += size
            print(f"{name}: {size} bytes; " + "; ".join(log), flush=True)
            if not size:
                failed.append(name)
    print(f"farm: {len(jobs) - len(failed)} of {len(jobs)} configs, {total / 1e6:.2f} MB, {time.time() - t0:.0f} s")
    if failed:
        print("no config with margins >= MARGIN_MIN for:", failed)


if __name__ == "__main__":
    try:
        main()
    except Exception:
        traceback.print_exc()
        sys.exit(1)
