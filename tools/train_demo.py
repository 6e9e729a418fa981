#!/usr/bin/env python3
"""Trains sluice's demo model: a small qwen3_moe on the Brown Corpus, on the GPU machine.

    python3 tools/train_demo.py CORPUS_DIR OUT_DIR [--seconds 360]

CORPUS_DIR holds train.txt and heldout.txt (tools/demo/prepare_corpus.py). Writes OUT_DIR/model
(config.json, model.safetensors in bf16, tokenizer.json, tokenizer_config.json),
OUT_DIR/reference.json (held-out perplexity by the procedure `sluice perplexity` repeats,
training curve, samples) and OUT_DIR/routing.jsonl (routing trace of greedy generations, in
the format of docs/trace-format.md).

Held-out perplexity procedure (also sluice's): encode the whole file (no special tokens),
cut it into consecutive windows of CTX tokens (the last may be shorter, at least 2), run each
window from an empty context, and average the negative log-likelihood of every token but the
first of each window; perplexity = exp(mean).
"""
import argparse
import json
import math
import pathlib
import time

import torch
import torch.nn.functional as F
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

CTX = 256
VOCAB = 4096
SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")
PROMPTS = ["The old man walked slowly", "In the first years of the war,", "She said that the committee",
           "Scientists have found that", "The city of Atlanta"]


def train_tokenizer(text_path: pathlib.Path) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB - 1, show_progress=False, special_tokens=[],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train([str(text_path)], trainer)
    tok.add_special_tokens(["<|endoftext|>"])
    return tok


def make_config(vocab: int) -> Qwen3MoeConfig:
    cfg = Qwen3MoeConfig(vocab_size=vocab, hidden_size=256, intermediate_size=512, moe_intermediate_size=128,
                         num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=4, head_dim=32,
                         num_experts=16, num_experts_per_tok=2, norm_topk_prob=True, decoder_sparse_step=1,
                         mlp_only_layers=[], max_position_embeddings=1024, rms_norm_eps=1e-6,
                         tie_word_embeddings=True, output_router_logits=True, router_aux_loss_coef=0.01,
                         initializer_range=0.02, attention_dropout=0.0)
    cfg.rope_parameters = {"rope_type": "default", "rope_theta": 10000.0}
    return cfg


def perplexity(model, ids: list[int], device) -> tuple[float, int]:
    nll, count = 0.0, 0
    with torch.no_grad():
        for s in range(0, len(ids), CTX):
            w = ids[s:s + CTX]
            if len(w) < 2:
                continue
            x = torch.tensor([w], device=device)
            logits = model(x).logits[0].double()
            nll += float(F.cross_entropy(logits[:-1], x[0, 1:], reduction="sum"))
            count += len(w) - 1
    return math.exp(nll / count), count


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("corpus")
    ap.add_argument("out")
    ap.add_argument("--seconds", type=float, default=360)
    ap.add_argument("--batch", type=int, default=64)
    args = ap.parse_args()
    corpus, out = pathlib.Path(args.corpus), pathlib.Path(args.out)
    model_dir = out / "model"
    model_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    dev = torch.device("cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

    t0 = time.time()
    tok = train_tokenizer(corpus / "train.txt")
    tok.save(str(model_dir / "tokenizer.json"))
    (model_dir / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>", "bos_token": None,
         "add_bos_token": False, "model_max_length": 1024}, indent=2))
    eos = tok.token_to_id("<|endoftext|>")
    docs = (corpus / "train.txt").read_text(encoding="utf-8").split("\n\n")
    stream = []
    for d in docs:
        stream += tok.encode(d).ids + [eos]
    data = torch.tensor(stream, dtype=torch.long)
    n_val = len(data) // 50
    train, val = data[:-n_val], data[-n_val:]
    held_ids = tok.encode((corpus / "heldout.txt").read_text(encoding="utf-8")).ids
    print(f"tokenizer {time.time() - t0:.1f}s: {len(stream)} train tokens, {len(held_ids)} held-out tokens", flush=True)

    cfg = make_config(VOCAB)
    model = Qwen3MoeForCausalLM(cfg).to(dev)
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3, betas=(0.9, 0.95), weight_decay=0.1)
    max_steps, warmup = 1000, 100  # Brown is ~1.6M tokens: past ~10 epochs this size overfits
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1, (s + 1) / warmup) *
                                              (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s, max_steps) / max_steps))))
    g = torch.Generator().manual_seed(0)
    curve, best = [], (float("inf"), None, 0)
    t_train = time.time()
    step = 0
    while step < max_steps and time.time() - t_train < args.seconds:
        model.train()
        starts = torch.randint(0, len(train) - CTX - 1, (args.batch,), generator=g)
        x = torch.stack([train[s:s + CTX] for s in starts]).to(dev)
        y = torch.stack([train[s + 1:s + CTX + 1] for s in starts]).to(dev)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            outp = model(x)
            logits = outp.logits.float()
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))
        total = loss + cfg.router_aux_loss_coef * outp.aux_loss if outp.aux_loss is not None else loss
        opt.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        step += 1
        if step % 50 == 0:
            model.eval()
            with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
                vl = []
                for s in range(0, len(val) - CTX - 1, CTX * 4):
                    xv = val[s:s + CTX].unsqueeze(0).to(dev)
                    vl.append(float(F.cross_entropy(model(xv).logits[0, :-1].float(), xv[0, 1:])))
            v = sum(vl) / len(vl)
            curve.append({"step": step, "seconds": round(time.time() - t_train, 1), "train_loss": round(loss.item(), 4),
                          "val_loss": round(v, 4)})
            print(curve[-1], flush=True)
            if v < best[0]:
                best = (v, {k: t.detach().clone() for k, t in model.state_dict().items()}, step)
    print(f"trained {step} steps in {time.time() - t_train:.0f}s; best val {best[0]:.4f} at step {best[2]}", flush=True)
    model.load_state_dict(best[1])
    model.config.output_router_logits = False
    model.to(torch.bfloat16).save_pretrained(str(model_dir), safe_serialization=True)

    # Reference numbers from the saved bf16 weights, computed in f32 (no TF32).
    ref = Qwen3MoeForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32, attn_implementation="eager").to(dev).eval()
    ppl, count = perplexity(ref, held_ids, dev)
    samples = []
    trace = []
    for pi, p in enumerate(PROMPTS):
        ids = tok.encode(p).ids
        gates = []
        hooks = [m.register_forward_hook(lambda mod, a, o, li=li: gates.append((li, o[0].detach())))
                 for li, m in enumerate(ref.model.layers[i].mlp.gate for i in range(cfg.num_hidden_layers))]
        with torch.no_grad():
            for t in range(64):
                gates.clear()
                logits = ref(torch.tensor([ids], device=dev)).logits[0, -1]
                for li, rl in gates:
                    probs = torch.softmax(rl[-1].float(), -1)
                    top = torch.topk(probs, 2)
                    w = (top.values / top.values.sum()).tolist()
                    trace.append({"dataset": "sluice-demo", "problem_id": pi, "layer": li, "token_idx": t,
                                  "experts": top.indices.tolist(), "gating_probs": w})
                ids.append(int(logits.argmax()))
        for h in hooks:
            h.remove()
        samples.append({"prompt": p, "greedy": tok.decode(ids)})
    with open(out / "routing.jsonl", "w") as f:
        for r in trace:
            f.write(json.dumps(r) + "\n")
    result = {"params": n_params, "train_tokens": len(stream), "steps": step, "best_step": best[2],
              "best_val_loss": best[0], "heldout_tokens_scored": count, "heldout_perplexity": ppl, "ctx": CTX,
              "curve": curve, "samples": samples, "config": json.loads(cfg.to_json_string())}
    (out / "reference.json").write_text(json.dumps(result, indent=1))
    print(json.dumps({k: result[k] for k in ("params", "steps", "best_val_loss", "heldout_perplexity")}), flush=True)
    for s in samples:
        print(s["greedy"].replace("\n", " | ")[:300], flush=True)


if __name__ == "__main__":
    main()
