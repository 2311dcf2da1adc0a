"""Trains strata's demo model: a small qwen3moe (GQA attention with per-head q/k RMSNorm and NEOX
RoPE, a softmax router over 8 experts, top-2 renormalised, SwiGLU experts, tied embeddings) on the
King James Bible as Debian's bible-kjv prints it, with a byte-level BPE vocabulary trained on the
same text. Jude and Revelation are held out for evaluation. CPU only, deterministic (fixed seeds,
fixed thread count); writes the float32 GGUF, the held-out text and a summary.

The forward pass is written the way llama.cpp computes qwen3moe (and strata reproduces), so the
GGUF needs no conversion: `strata logits --exact` on the float file equals this module's logits.
"""
import argparse
import json
import math
import os
import re
import subprocess
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe  # noqa: E402
import gguf_write  # noqa: E402

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
HELD_OUT_BOOKS = ("Jude", "Rev")


class Config:
    n_vocab = 2048          # 256 bytes + merges + specials
    n_embd = 256
    n_layer = 4
    n_head = 4
    n_head_kv = 2
    head_dim = 64
    n_expert = 8
    n_expert_used = 2
    n_ff_exp = 256
    n_ctx = 512
    rope_base = 10000.0
    eps = 1e-6


def read_bible():
    """(book, chapter, text) of every verse, from `bible -f`."""
    out = subprocess.run(["bible", "-f", "Genesis 1:1-Revelation 22:21"], check=True, capture_output=True,
                         text=True).stdout
    verses = []
    for line in out.splitlines():
        ref, _, text = line.partition(" ")
        book = ref.rstrip("0123456789:")
        chapter = int(ref[len(book):].split(":")[0])
        verses.append((book, chapter, text.strip()))
    if len(verses) < 31000:
        raise SystemExit(f"train: bible printed {len(verses)} verses, expected 31102 (is bible-kjv installed?)")
    return verses


def chapters(verses):
    """[(book, [verse texts])] in order."""
    out = []
    for book, ch, text in verses:
        if not out or out[-1][0] != (book, ch):
            out.append(((book, ch), []))
        out[-1][1].append(text)
    return [(key[0], texts) for key, texts in out]


def documents(chs, rng):
    """The training documents: each chapter as lines of verses, and for each chapter one chat
    exchange (a verse from the user, the verses after it from the assistant) so the model learns its
    template's turns and to end them."""
    docs = []
    for _, texts in chs:
        docs.append(("text", "\n".join(texts) + "\n"))
        if len(texts) >= 3:
            i = int(rng.integers(0, len(texts) - 2))
            n = int(rng.integers(1, 4))
            docs.append(("chat", texts[i], " ".join(texts[i + 1:i + 1 + n])))
    return docs


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope_neox(x, base):
    """x: [B, T, H, D]; NEOX pairing (i, i + D/2), as llama.cpp's rope for qwen3moe."""
    _, T, _, D = x.shape
    inv = base ** (-torch.arange(0, D // 2, dtype=torch.float32) * 2.0 / D)
    ang = torch.arange(T, dtype=torch.float32)[:, None] * inv[None, :]
    cos, sin = ang.cos()[None, :, None, :], ang.sin()[None, :, None, :]
    x0, x1 = x[..., :D // 2], x[..., D // 2:]
    return torch.cat([x0 * cos - x1 * sin, x0 * sin + x1 * cos], dim=-1)


class Model(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        g = torch.Generator().manual_seed(1)

        def p(*shape, std=0.02):
            return torch.nn.Parameter(torch.randn(*shape, generator=g) * std)

        def ones(n):
            return torch.nn.Parameter(torch.ones(n))

        E, H, K, D, X, FF = c.n_embd, c.n_head, c.n_head_kv, c.head_dim, c.n_expert, c.n_ff_exp
        out_std = 0.02 / math.sqrt(2 * c.n_layer)
        self.tok_embd = p(c.n_vocab, E)
        self.layers = torch.nn.ModuleList()
        for _ in range(c.n_layer):
            m = torch.nn.Module()
            m.attn_norm, m.ffn_norm = ones(E), ones(E)
            m.wq, m.wk, m.wv = p(H * D, E), p(K * D, E), p(K * D, E)
            m.q_norm, m.k_norm = ones(D), ones(D)
            m.wo = p(E, H * D, std=out_std)
            m.router = p(X, E)
            m.gate, m.up = p(X, FF, E), p(X, FF, E)
            m.down = p(X, E, FF, std=out_std)
            self.layers.append(m)
        self.out_norm = ones(E)

    def forward(self, tokens):
        """tokens [B, T] -> (logits [B, T, V], load-balancing loss)."""
        c = self.c
        B, T = tokens.shape
        x = self.tok_embd[tokens]
        mask = torch.full((T, T), float("-inf")).triu(1)
        aux = 0.0
        for m in self.layers:
            h = rms_norm(x, m.attn_norm, c.eps)
            q = rms_norm((h @ m.wq.T).view(B, T, c.n_head, c.head_dim), m.q_norm, c.eps)
            k = rms_norm((h @ m.wk.T).view(B, T, c.n_head_kv, c.head_dim), m.k_norm, c.eps)
            v = (h @ m.wv.T).view(B, T, c.n_head_kv, c.head_dim)
            q, k = rope_neox(q, c.rope_base), rope_neox(k, c.rope_base)
            rep = c.n_head // c.n_head_kv
            k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
            att = (q.transpose(1, 2) @ k.transpose(1, 2).transpose(-1, -2)) / math.sqrt(c.head_dim) + mask
            o = (att.softmax(-1) @ v.transpose(1, 2)).transpose(1, 2).reshape(B, T, -1)
            x = x + o @ m.wo.T

            h = rms_norm(x, m.ffn_norm, c.eps).reshape(B * T, -1)
            probs = (h @ m.router.T).softmax(-1)
            top_p, top_i = probs.topk(c.n_expert_used, dim=-1)
            w = top_p / top_p.sum(-1, keepdim=True)
            y = torch.zeros_like(h)
            for e in range(c.n_expert):
                rows, slot = (top_i == e).nonzero(as_tuple=True)
                if rows.numel() == 0:
                    continue
                he = h[rows]
                ye = (F.silu(he @ m.gate[e].T) * (he @ m.up[e].T)) @ m.down[e].T
                y = y.index_add(0, rows, ye * w[rows, slot, None])
            frac = F.one_hot(top_i, c.n_expert).float().sum(1).mean(0) / c.n_expert_used
            aux = aux + c.n_expert * (frac * probs.mean(0)).sum()
            x = x + y.view(B, T, -1)
        x = rms_norm(x, self.out_norm, c.eps)
        return x @ self.tok_embd.T, aux / c.n_layer


def gguf_tensors(model):
    """The model's weights under llama.cpp's qwen3moe tensor names (GGUF dims are the shapes
    reversed: [out, in] is ne = {in, out})."""
    t = {"token_embd.weight": model.tok_embd, "output_norm.weight": model.out_norm}
    for i, m in enumerate(model.layers):
        b = f"blk.{i}."
        t.update({b + "attn_norm.weight": m.attn_norm, b + "attn_q.weight": m.wq, b + "attn_k.weight": m.wk,
                  b + "attn_v.weight": m.wv, b + "attn_q_norm.weight": m.q_norm, b + "attn_k_norm.weight": m.k_norm,
                  b + "attn_output.weight": m.wo, b + "ffn_norm.weight": m.ffn_norm,
                  b + "ffn_gate_inp.weight": m.router, b + "ffn_gate_exps.weight": m.gate,
                  b + "ffn_up_exps.weight": m.up, b + "ffn_down_exps.weight": m.down})
    return {k: v.detach().numpy() for k, v in t.items()}


def gguf_metadata(c, vocab, merges, summary):
    a = "qwen3moe."
    n_special = len(SPECIALS)
    return {
        "general.architecture": "qwen3moe",
        "general.name": "strata-demo",
        "general.description": ("strata's demo MoE: trained by scripts/train-demo.sh on the King James Bible "
                                "(Debian bible-kjv), Jude and Revelation held out; " + summary),
        "general.file_type": 0,
        a + "context_length": c.n_ctx,
        a + "embedding_length": c.n_embd,
        a + "block_count": c.n_layer,
        a + "feed_forward_length": c.n_ff_exp,
        a + "attention.head_count": c.n_head,
        a + "attention.head_count_kv": c.n_head_kv,
        a + "attention.key_length": c.head_dim,
        a + "attention.value_length": c.head_dim,
        a + "rope.freq_base": c.rope_base,
        a + "attention.layer_norm_rms_epsilon": c.eps,
        a + "expert_count": c.n_expert,
        a + "expert_used_count": c.n_expert_used,
        a + "expert_feed_forward_length": c.n_ff_exp,
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "gpt-2",
        "tokenizer.ggml.tokens": vocab,
        "tokenizer.ggml.token_type": gguf_write.I32([1] * (len(vocab) - n_special) + [3] * n_special),
        "tokenizer.ggml.merges": [f"{a_} {b_}" for a_, b_ in merges],
        "tokenizer.ggml.bos_token_id": vocab.index("<|endoftext|>"),
        "tokenizer.ggml.eos_token_id": vocab.index("<|im_end|>"),
        "tokenizer.ggml.padding_token_id": vocab.index("<|endoftext|>"),
        "tokenizer.ggml.add_bos_token": False,
        "tokenizer.chat_template": CHAT_TEMPLATE,
    }


def evaluate(model, ids, c, n_chunks=None):
    """llama-perplexity's rule: non-overlapping chunks of n_ctx, scored on their second half."""
    model.eval()
    nll, n = 0.0, 0
    chunks = len(ids) // c.n_ctx if n_chunks is None else min(n_chunks, len(ids) // c.n_ctx)
    with torch.no_grad():
        for k in range(chunks):
            x = torch.tensor(ids[k * c.n_ctx:(k + 1) * c.n_ctx])[None]
            logits, _ = model(x)
            lp = logits[0, :-1].log_softmax(-1)
            tgt = x[0, 1:]
            first = c.n_ctx // 2  # logits of positions first .. n_ctx-2 score the tokens after them
            nll -= lp[first:].gather(1, tgt[first:, None]).sum().item()
            n += len(tgt) - first
    model.train()
    return math.exp(nll / n)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--batch", type=int, default=8, help="sequences of n_ctx tokens per step")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--threads", type=int, default=2, help="fixed, so a rerun computes the same sums")
    ap.add_argument("--seed", type=int, default=20261203)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    rng = np.random.default_rng(args.seed)
    os.makedirs(args.out, exist_ok=True)
    c = Config()
    t0 = time.time()

    def say(msg):
        print(f"[{time.time() - t0:7.1f} s] {msg}", flush=True)

    verses = read_bible()
    chs = chapters(verses)
    train_chs = [ch for ch in chs if ch[0] not in HELD_OUT_BOOKS]
    held_chs = [ch for ch in chs if ch[0] in HELD_OUT_BOOKS]
    train_text = "".join("\n".join(t) + "\n" for _, t in train_chs)
    held_text = "".join("\n".join(t) + "\n" for _, t in held_chs)
    with open(os.path.join(args.out, "heldout.txt"), "w") as f:
        f.write(held_text)
    # The corpus's words, for the tests that check generated text is English (test_demo_model.cpp).
    with open(os.path.join(args.out, "kjv-words.txt"), "w") as f:
        f.write("\n".join(sorted({w.lower() for w in re.findall(r"[A-Za-z]+", train_text)})) + "\n")
    say(f"corpus: {len(train_chs)} chapters to train on ({len(train_text)} bytes), "
        f"{len(held_chs)} held out ({len(held_text)} bytes)")

    n_merges = c.n_vocab - 256 - len(SPECIALS)
    merges = bpe.train(train_text, n_merges, lambda k, n: say(f"bpe: {k}/{n} merges"))
    vocab = [bpe.BYTE_CHARS[b] for b in range(256)] + [a + b for a, b in merges] + SPECIALS
    assert len(vocab) == c.n_vocab and len(set(vocab)) == len(vocab)
    enc = bpe.Encoder(vocab, merges)
    sp = {s: vocab.index(s) for s in SPECIALS}
    stream = []
    docs = documents(train_chs, rng)
    for i in rng.permutation(len(docs)):
        d = docs[i]
        if d[0] == "text":
            stream += enc.encode(d[1])
        else:
            stream += [sp["<|im_start|>"]] + enc.encode("user\n" + d[1]) + [sp["<|im_end|>"]] + enc.encode("\n")
            stream += [sp["<|im_start|>"]] + enc.encode("assistant\n" + d[2]) + [sp["<|im_end|>"]] + enc.encode("\n")
        stream.append(sp["<|endoftext|>"])
    held_ids = enc.encode(held_text)
    data = torch.tensor(stream)
    say(f"tokens: {len(stream)} to train on ({len(train_text) / len(enc.encode(train_text)):.2f} bytes/token), "
        f"{len(held_ids)} held out")

    model = Model(c)
    n_params = sum(p.numel() for p in model.parameters())
    say(f"model: qwen3moe, {c.n_layer} layers, n_embd {c.n_embd}, {c.n_expert} experts top-{c.n_expert_used}, "
        f"{n_params / 1e6:.2f} M parameters")
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1)
    warm = max(1, args.steps // 20)
    tok_per_step = args.batch * c.n_ctx
    t_train = time.time()
    for step in range(1, args.steps + 1):
        lr = args.lr * min(step / warm, 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, args.steps - warm))))
        for g in opt.param_groups:
            g["lr"] = lr
        starts = torch.from_numpy(rng.integers(0, len(stream) - c.n_ctx - 1, args.batch))
        x = torch.stack([data[s:s + c.n_ctx] for s in starts])
        y = torch.stack([data[s + 1:s + 1 + c.n_ctx] for s in starts])
        logits, aux = model(x)
        loss = F.cross_entropy(logits.reshape(-1, c.n_vocab), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        (loss + 0.01 * aux).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 20 == 0 or step == args.steps:
            el = time.time() - t_train
            eta = el / step * (args.steps - step)
            msg = (f"step {step}/{args.steps}  loss {loss.item():.3f}  balance {aux.item():.3f}  lr {lr:.2e}  "
                   f"{step * tok_per_step / el:.0f} tok/s  eta {eta / 60:.1f} min")
            if step % 200 == 0 or step == args.steps:
                msg += f"  held-out ppl {evaluate(model, held_ids, c, n_chunks=8):.2f}"
            say(msg)

    ppl = evaluate(model, held_ids, c)
    summary = (f"{n_params / 1e6:.2f} M parameters, {args.steps} steps of {tok_per_step} tokens, "
               f"held-out perplexity {ppl:.3f} (float, ctx {c.n_ctx})")
    path = os.path.join(args.out, "strata-demo-F32.gguf")
    gguf_write.write(path, gguf_metadata(c, vocab, merges, summary), gguf_tensors(model))
    with open(os.path.join(args.out, "train-summary.json"), "w") as f:
        json.dump({"parameters": n_params, "steps": args.steps, "tokens_per_step": tok_per_step,
                   "seed": args.seed, "threads": args.threads, "heldout_perplexity": ppl,
                   "heldout_tokens": len(held_ids), "train_tokens": len(stream),
                   "seconds": time.time() - t0}, f, indent=2)
    # The float logits of the first 64 held-out tokens: `strata logits --exact` on the F32 file
    # reproduces them (scripts/train-demo.sh checks it), and `strata tokenize` the ids.
    model.eval()
    with torch.no_grad():
        probe = held_ids[:64]
        logits, _ = model(torch.tensor(probe)[None])
    logits[0].numpy().astype(np.float32).tofile(os.path.join(args.out, "check-logits.f32"))
    with open(os.path.join(args.out, "check-tokens.json"), "w") as f:
        json.dump({"ids": probe}, f)
    with open(os.path.join(args.out, "heldout-ids.json"), "w") as f:
        json.dump(held_ids, f)
    say(f"wrote {path}: {summary}")


if __name__ == "__main__":
    main()
