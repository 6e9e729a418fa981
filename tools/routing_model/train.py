#!/usr/bin/env python3
"""Trains the routing model: a qwen3_moe with 64 experts, top-8, whose learned routing the
cache-policy tables replay (docs/policy.md). Plain torch (no transformers), so it runs on the
development machine's CPUs (Debian's python3-torch) as well as on a GPU.

    python3 tools/routing_model/train.py CORPUS_DIR TOKENIZER_DIR OUT_DIR [--seconds 1800]
        [--layers 8] [--hidden 256] [--experts 64] [--top-k 8] [--expert-width 128] [--ctx 512]

CORPUS_DIR holds train.u32 and heldout.u32: the token ids of train.txt / heldout.txt
(tools/routing_model/prepare_code_corpus.py, then `sluice tokenize --format u32`) under the
tokenizer of TOKENIZER_DIR (tokenizer.json, tokenizer_config.json; copied into the model).
Writes OUT_DIR/model (config.json, model.safetensors in bf16, the tokenizer): a checkpoint
that sluice and transformers load as Qwen3MoeForCausalLM; and OUT_DIR/reference.json: the
training curve and the held-out perplexity computed here in f32 from the saved bf16 weights,
by the procedure of `sluice perplexity --ctx CTX` (windows of CTX tokens from an empty
context, every token but each window's first scored), over the first --heldout-tokens ids.

The model is transformers' Qwen3MoeForCausalLM written out: RMSNorm (f32), q/k RMSNorm per
head before the rotary embedding (rotate-half, theta 10000), grouped-query attention, a
softmax router in f32 whose top-k weights are renormalized, SwiGLU experts, tied embeddings;
training adds transformers' load-balancing loss (coefficient --aux).
"""
import argparse
import json
import math
import pathlib
import shutil
import struct
import time

import numpy as np
import torch
import torch.nn.functional as F


class Config:
    def __init__(self, a, vocab):
        self.vocab, self.hidden, self.layers = vocab, a.hidden, a.layers
        self.heads, self.kv_heads, self.head_dim = a.hidden // 32, a.hidden // 64, 32
        self.experts, self.top_k, self.ff = a.experts, a.top_k, a.expert_width
        self.eps, self.theta, self.ctx = 1e-6, 10000.0, a.ctx

    def hf(self):
        return {
            "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "attention_bias": False,
            "attention_dropout": 0.0, "bos_token_id": None, "eos_token_id": None, "decoder_sparse_step": 1,
            "dtype": "bfloat16", "head_dim": self.head_dim, "hidden_act": "silu", "hidden_size": self.hidden,
            "initializer_range": 0.02, "intermediate_size": 4 * self.hidden, "max_position_embeddings": 4096,
            "mlp_only_layers": [], "moe_intermediate_size": self.ff, "norm_topk_prob": True,
            "num_attention_heads": self.heads, "num_experts_per_tok": self.top_k, "num_hidden_layers": self.layers,
            "num_key_value_heads": self.kv_heads, "num_experts": self.experts, "output_router_logits": False,
            "rms_norm_eps": self.eps, "rope_parameters": {"rope_theta": self.theta, "rope_type": "default"},
            "router_aux_loss_coef": 0.01, "sliding_window": None, "tie_word_embeddings": True, "use_cache": True,
            "use_sliding_window": False, "vocab_size": self.vocab}


def rms_norm(x, w, eps):
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps))


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


class Layer(torch.nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        d, hd = c.hidden, c.head_dim
        self.c = c
        init = lambda *s: torch.nn.Parameter(torch.randn(*s) * 0.02)
        self.input_layernorm = torch.nn.Parameter(torch.ones(d))
        self.q_proj, self.k_proj = init(c.heads * hd, d), init(c.kv_heads * hd, d)
        self.v_proj, self.o_proj = init(c.kv_heads * hd, d), init(d, c.heads * hd)
        self.q_norm, self.k_norm = torch.nn.Parameter(torch.ones(hd)), torch.nn.Parameter(torch.ones(hd))
        self.post_attention_layernorm = torch.nn.Parameter(torch.ones(d))
        self.gate = init(c.experts, d)
        # The experts stacked [E, out, in]: one batched product for all of them (moe below).
        self.gate_proj, self.up_proj = init(c.experts, c.ff, d), init(c.experts, c.ff, d)
        self.down_proj = init(c.experts, d, c.ff)

    def attention(self, x, cos, sin, mask):
        c = self.c
        B, T, _ = x.shape
        q = rms_norm((x @ self.q_proj.t()).view(B, T, c.heads, c.head_dim), self.q_norm, c.eps).transpose(1, 2)
        k = rms_norm((x @ self.k_proj.t()).view(B, T, c.kv_heads, c.head_dim), self.k_norm, c.eps).transpose(1, 2)
        v = (x @ self.v_proj.t()).view(B, T, c.kv_heads, c.head_dim).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        rep = c.heads // c.kv_heads
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        s = (q @ k.transpose(-1, -2)) * c.head_dim ** -0.5 + mask
        o = torch.softmax(s.float(), dim=-1) @ v
        return o.transpose(1, 2).reshape(B, T, -1) @ self.o_proj.t()

    def moe(self, x):
        c = self.c
        flat = x.reshape(-1, c.hidden)
        logits = flat @ self.gate.t()
        probs = torch.softmax(logits.float(), dim=-1)
        w, ids = torch.topk(probs, c.top_k, dim=-1)
        w = w / w.sum(-1, keepdim=True)
        # Pairs sorted by expert, padded to the busiest expert's count: [E, cap, d] through
        # three batched products (the padding rows are zeros and never read back).
        e_p = ids.reshape(-1)
        order = torch.argsort(e_p, stable=True)
        e_s = e_p[order]
        counts = torch.bincount(e_p, minlength=c.experts)
        starts = torch.cumsum(counts, 0) - counts
        pos = torch.arange(len(e_s), device=e_s.device) - starts[e_s]
        rows = order // c.top_k
        X = flat.new_zeros(c.experts, int(counts.max()), c.hidden).index_put((e_s, pos), flat[rows])
        H = F.silu(torch.bmm(X, self.gate_proj.transpose(1, 2))) * torch.bmm(X, self.up_proj.transpose(1, 2))
        Y = torch.bmm(H, self.down_proj.transpose(1, 2))
        out = torch.zeros_like(flat).index_add(0, rows, Y[e_s, pos] * w.reshape(-1)[order, None])
        # transformers' load_balancing_loss_func (no padding mask): E * sum_e f_e * P_e
        f = F.one_hot(ids, c.experts).float().mean(dim=(0, 1))
        aux = c.experts * (f * probs.mean(0)).sum()
        return out.view_as(x), aux, ids

    def forward(self, x, cos, sin, mask):
        x = x + self.attention(rms_norm(x, self.input_layernorm, self.c.eps), cos, sin, mask)
        m, aux, ids = self.moe(rms_norm(x, self.post_attention_layernorm, self.c.eps))
        return x + m, aux, ids


class Model(torch.nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.c = c
        self.embed = torch.nn.Parameter(torch.randn(c.vocab, c.hidden) * 0.02)
        self.layers = torch.nn.ModuleList(Layer(c) for _ in range(c.layers))
        self.norm = torch.nn.Parameter(torch.ones(c.hidden))
        inv = 1.0 / (c.theta ** (torch.arange(0, c.head_dim, 2, dtype=torch.int64).float() / c.head_dim))
        self.register_buffer("inv_freq", inv, persistent=False)

    def forward(self, tokens):
        T = tokens.shape[1]
        pos = torch.arange(T, device=tokens.device).float()
        ang = torch.outer(pos, self.inv_freq)
        emb = torch.cat((ang, ang), dim=-1)
        cos, sin = emb.cos()[None, None], emb.sin()[None, None]
        mask = torch.full((T, T), float("-inf"), device=tokens.device).triu(1)
        x = self.embed[tokens]
        aux = 0.0
        for layer in self.layers:
            x, a, _ = layer(x, cos, sin, mask)
            aux = aux + a
        return rms_norm(x, self.norm, self.c.eps) @ self.embed.t(), aux / len(self.layers)

    def hf_tensors(self):
        """name -> tensor in transformers' Qwen3MoeForCausalLM layout (experts one by one)."""
        t = {"model.embed_tokens.weight": self.embed, "model.norm.weight": self.norm}
        for i, L in enumerate(self.layers):
            p = f"model.layers.{i}."
            t[p + "input_layernorm.weight"] = L.input_layernorm
            t[p + "post_attention_layernorm.weight"] = L.post_attention_layernorm
            for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
                t[p + f"self_attn.{n}.weight"] = getattr(L, n)
            t[p + "self_attn.q_norm.weight"], t[p + "self_attn.k_norm.weight"] = L.q_norm, L.k_norm
            t[p + "mlp.gate.weight"] = L.gate
            for e in range(self.c.experts):
                for n in ("gate_proj", "up_proj", "down_proj"):
                    t[p + f"mlp.experts.{e}.{n}.weight"] = getattr(L, n)[e]
        return t


def save_safetensors(path: pathlib.Path, tensors: dict):
    """bf16 safetensors, written by hand (the format: 8-byte header length, JSON, raw data)."""
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        bits = tensors[name].detach().float().contiguous().view(torch.int32)
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).to(torch.int16)  # round to nearest even
        raw = bits.cpu().numpy().astype("<i2").tobytes()
        header[name] = {"dtype": "BF16", "shape": list(tensors[name].shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h)
        for b in blobs:
            f.write(b)


def load_safetensors(model: Model, path: pathlib.Path):
    """The inverse of save_safetensors (bf16 only)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    params = model.hf_tensors()
    with torch.no_grad():
        for name, meta in header.items():
            if name == "__metadata__":
                continue
            a, b = meta["data_offsets"]
            bits = torch.from_numpy(np.frombuffer(data[a:b], dtype="<i2").astype(np.int32)) << 16
            params[name].copy_(bits.view(torch.float32).view(meta["shape"]).to(params[name].device))


def bf16_round(model: Model):
    with torch.no_grad():
        for p in model.parameters():
            bits = p.data.float().contiguous().view(torch.int32)
            bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
            p.data.copy_(bits.view(torch.float32))


def perplexity(model: Model, ids: np.ndarray, ctx: int):
    dev = model.embed.device
    nll, count = 0.0, 0
    with torch.no_grad():
        for s in range(0, len(ids), ctx):
            w = torch.from_numpy(ids[s:s + ctx].astype(np.int64)).to(dev)
            if len(w) < 2:
                continue
            logits, _ = model(w[None])
            nll += float(F.cross_entropy(logits[0, :-1].double(), w[1:], reduction="sum"))
            count += len(w) - 1
    return math.exp(nll / count), count


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("corpus")
    ap.add_argument("tokenizer")
    ap.add_argument("out")
    ap.add_argument("--seconds", type=float, default=1800)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--top-k", type=int, default=8)
    ap.add_argument("--expert-width", type=int, default=128)
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--aux", type=float, default=0.01)
    ap.add_argument("--heldout", default="heldout_eval.u32", help="held-out ids in CORPUS_DIR for the reference")
    ap.add_argument("--heldout-tokens", type=int, default=1 << 20)
    ap.add_argument("--eval-only", action="store_true", help="load OUT_DIR/model and compute the reference only")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (bf16 autocast for training; the reference in f32)")
    a = ap.parse_args()
    torch.manual_seed(0)
    if a.threads:
        torch.set_num_threads(a.threads)
    corpus, out = pathlib.Path(a.corpus), pathlib.Path(a.out)
    model_dir = out / "model"
    model_dir.mkdir(parents=True, exist_ok=True)
    vocab = len(json.loads((pathlib.Path(a.tokenizer) / "tokenizer.json").read_text())["model"]["vocab"])
    vocab += len([t for t in json.loads((pathlib.Path(a.tokenizer) / "tokenizer.json").read_text())["added_tokens"]
                  if t["id"] >= vocab])
    train = np.fromfile(corpus / "train.u32", dtype="<u4").astype(np.int64)
    held = np.fromfile(corpus / a.heldout, dtype="<u4").astype(np.int64)
    n_val = len(train) // 100
    train, val = train[:-n_val], train[-n_val:]
    c = Config(a, vocab)
    dev = torch.device(a.device)
    if dev.type == "cuda":  # f32 products stay f32 (the reference below must be exact)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    model = Model(c).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    if a.eval_only:
        load_safetensors(model, model_dir / "model.safetensors")
        ppl, count = perplexity(model, held[:a.heldout_tokens], c.ctx)
        print(json.dumps({"heldout_perplexity": ppl, "heldout_tokens_scored": count}))
        return
    print(f"{n_params / 1e6:.2f}M parameters, {len(train)} train tokens, vocab {vocab}, "
          f"{torch.get_num_threads()} threads", flush=True)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.1)
    rng = np.random.default_rng(0)
    curve, best, step, warmup = [], (float("inf"), None, 0), 0, 50
    t0 = time.time()
    est_steps = None
    while time.time() - t0 < a.seconds:
        # Cosine from the step rate of the first 20 steps (a time budget, not a step count).
        if step == 20:
            est_steps = int(a.seconds / ((time.time() - t0) / 20))
        frac = min(1.0, step / est_steps) if est_steps else 0.0
        for g in opt.param_groups:
            g["lr"] = a.lr * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        starts = rng.integers(0, len(train) - c.ctx - 1, a.batch)
        x = torch.from_numpy(np.stack([train[s:s + c.ctx] for s in starts])).to(dev)
        y = torch.from_numpy(np.stack([train[s + 1:s + c.ctx + 1] for s in starts])).to(dev)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=dev.type == "cuda"):  # training only
            logits, aux = model(x)
        logits = logits.float()
        loss = F.cross_entropy(logits.reshape(-1, vocab), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        (loss + a.aux * aux).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % a.eval_every == 0:
            with torch.no_grad():
                vl = [float(F.cross_entropy(model(torch.from_numpy(val[s:s + c.ctx]).to(dev)[None])[0][0, :-1],
                                            torch.from_numpy(val[s + 1:s + c.ctx]).to(dev)))
                      for s in range(0, min(len(val), 32 * c.ctx) - c.ctx, c.ctx)]
            v = sum(vl) / len(vl)
            curve.append({"step": step, "seconds": round(time.time() - t0, 1), "train_loss": round(loss.item(), 4),
                          "aux": round(float(aux), 4), "val_loss": round(v, 4)})
            print(curve[-1], flush=True)
            if v < best[0]:
                best = (v, {k: t.detach().clone() for k, t in model.state_dict().items()}, step)
    print(f"trained {step} steps ({step * a.batch * c.ctx} tokens) in {time.time() - t0:.0f}s; "
          f"best val {best[0]:.4f} at step {best[2]}", flush=True)
    if best[1] is not None:
        model.load_state_dict(best[1])
    bf16_round(model)  # the reference below is computed from exactly the saved weights
    save_safetensors(model_dir / "model.safetensors", model.hf_tensors())
    (model_dir / "config.json").write_text(json.dumps(c.hf(), indent=2))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(pathlib.Path(a.tokenizer) / f, model_dir / f)
    ppl, count = perplexity(model, held[:a.heldout_tokens], c.ctx)
    result = {"params": n_params, "train_tokens_seen": step * a.batch * c.ctx, "steps": step, "best_step": best[2],
              "best_val_loss": best[0], "heldout_tokens_scored": count, "heldout_perplexity": ppl, "ctx": c.ctx,
              "heldout_tokens": a.heldout_tokens, "curve": curve, "config": c.hf(), "torch": torch.__version__}
    (out / "reference.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({k: result[k] for k in ("params", "steps", "best_val_loss", "heldout_perplexity",
                                             "heldout_tokens_scored")}), flush=True)


if __name__ == "__main__":
    main()
