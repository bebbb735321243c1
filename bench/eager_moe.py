#!/usr/bin/env python3
"""The PyTorch-eager peer for `smp-bench moe`: the MoE benchmark model written
as one writes it in PyTorch, after Hugging Face's Mixtral: a llama decoder
(RMSNorm, rotary q and k, grouped-query attention, no biases, untied head)
whose MLP is a top-k mixture of SwiGLU experts, each an nn.Module, computed
by the loop over experts that Mixtral's sparse block runs (each expert's
tokens found with torch.where, index_add_ into the output); router softmax
over the top-k logits, Switch's aux loss and the router z-loss with the
config's weights. Same data sampling, AdamW, clipping and schedule as
eager_gpt.py. One thread. Run with Debian's python3-torch:

  /usr/bin/python3 bench/eager_moe.py --config bench/configs/moe-bench.toml --out summary.json

Timed step: zeroing, sampling the batch, forward, backward, clipping, AdamW,
reading the loss; step_seconds is the mean over steps 2..N.
"""
import argparse
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from eager_gpt import adamw, load_config, lr_schedule, read_bytes, splitmix, write_summary  # noqa: E402


class RmsNorm(torch.nn.Module):
    def __init__(self, h, eps=1e-5):
        super().__init__()
        self.weight, self.eps = torch.nn.Parameter(torch.ones(h)), eps

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotary(t, heads, base):
    B, S, _ = t.shape
    d = t.shape[-1] // heads
    inv = base ** (-torch.arange(0, d // 2, dtype=torch.float64) * 2.0 / d)
    ang = torch.outer(torch.arange(S, dtype=torch.float64), inv)
    cos = torch.cat([ang.cos(), ang.cos()], -1).float().view(1, S, 1, d)
    sin = torch.cat([ang.sin(), ang.sin()], -1).float().view(1, S, 1, d)
    x = t.view(B, S, heads, d)
    rot = torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1)
    return (x * cos + rot * sin).reshape(B, S, heads * d)


class Expert(torch.nn.Module):
    def __init__(self, h, f, std, out_std):
        super().__init__()
        self.w1, self.w3 = torch.nn.Linear(h, f, bias=False), torch.nn.Linear(h, f, bias=False)
        self.w2 = torch.nn.Linear(f, h, bias=False)
        for lin, s in ((self.w1, std), (self.w3, std), (self.w2, out_std)):
            torch.nn.init.normal_(lin.weight, std=s)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(torch.nn.Module):
    def __init__(self, h, heads, kv, E, k, f, rope, std, out_std):
        super().__init__()
        self.heads, self.kv, self.d, self.E, self.k, self.rope = heads, kv, h // heads, E, k, rope
        self.ln1, self.ln2 = RmsNorm(h), RmsNorm(h)
        self.q, self.o = torch.nn.Linear(h, h, bias=False), torch.nn.Linear(h, h, bias=False)
        self.kp, self.v = torch.nn.Linear(h, kv * self.d, bias=False), torch.nn.Linear(h, kv * self.d, bias=False)
        self.router = torch.nn.Linear(h, E, bias=False)
        for lin, s in ((self.q, std), (self.kp, std), (self.v, std), (self.o, out_std), (self.router, std)):
            torch.nn.init.normal_(lin.weight, std=s)
        self.experts = torch.nn.ModuleList(Expert(h, f, std, out_std) for _ in range(E))

    def attention(self, x):
        B, S, _ = x.shape
        q = rotary(self.q(x), self.heads, self.rope).view(B, S, self.heads, self.d).transpose(1, 2)
        k = rotary(self.kp(x), self.kv, self.rope).view(B, S, self.kv, self.d).transpose(1, 2)
        v = self.v(x).view(B, S, self.kv, self.d).transpose(1, 2)
        g = self.heads // self.kv
        k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
        if hasattr(F, "scaled_dot_product_attention"):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            mask = torch.ones(S, S, dtype=torch.bool).triu(1)
            y = torch.softmax(((q @ k.transpose(-2, -1)) / math.sqrt(self.d)).masked_fill(mask, -1e9), -1) @ v
        return self.o(y.transpose(1, 2).reshape(B, S, -1))

    def moe(self, x):
        B, S, h = x.shape
        flat = x.reshape(-1, h)
        logits = self.router(flat)
        probs = torch.softmax(logits, -1)
        top_v, top_i = logits.topk(self.k, -1)
        gates = torch.softmax(top_v, -1)
        out = torch.zeros_like(flat)
        mask = F.one_hot(top_i, self.E).permute(2, 1, 0)  # [E, k, tokens], as Mixtral's sparse block
        for e in range(self.E):
            idx, tok = torch.where(mask[e])
            if tok.numel() == 0:
                continue
            out.index_add_(0, tok, self.experts[e](flat[tok]) * gates[tok, idx, None])
        counts = F.one_hot(top_i, self.E).sum(1).float().view(B, S, self.E).sum(1)
        aux = (probs.view(B, S, self.E).sum(1) * counts).sum() * (self.E / (S * S * self.k)) / B
        z = torch.logsumexp(logits, -1).pow(2).mean()
        return out.view(B, S, h), aux, z

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        y, aux, z = self.moe(self.ln2(x))
        return x + y, aux, z


class MoeModel(torch.nn.Module):
    def __init__(self, m):
        super().__init__()
        L, h, V = m["layers"], m["hidden"], m["vocab"]
        self.wte = torch.nn.Embedding(V, h)
        self.head = torch.nn.Linear(h, V, bias=False)
        torch.nn.init.normal_(self.wte.weight, std=0.02)
        torch.nn.init.normal_(self.head.weight, std=0.02)
        out_std = 0.02 / math.sqrt(2 * L)
        self.blocks = torch.nn.ModuleList(
            Block(h, m["heads"], m["kv_heads"], m["experts"], m["top_k"], m["expert_ffn"], m.get("rope_base", 10000.0),
                  0.02, out_std) for _ in range(L))
        self.norm = RmsNorm(h)
        self.aux_w, self.z_w = m.get("aux_loss_weight", 0.01), m.get("z_loss_weight", 0.0)

    def forward(self, tokens, targets):
        x = self.wte(tokens)
        extra = 0.0
        for b in self.blocks:
            x, aux, z = b(x)
            extra = extra + self.aux_w * aux + self.z_w * z
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1)) + extra


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--out")
    a = ap.parse_args()
    cfg = load_config(a.config, a.set)
    m, t = cfg["model"], cfg["train"]
    torch.set_num_threads(1)
    s, B, steps, seed = m["seq_len"], t["batch_size"], t["steps"], t.get("seed", 1234)
    lr, min_lr, warmup = t.get("lr", 1e-3), t.get("min_lr", 1e-4), t.get("warmup_steps", 0)
    data = read_bytes(m.get("data", "/usr/share/common-licenses"))
    span = int(len(data) * (1.0 - m.get("val_fraction", 0.1))) - s - 1
    torch.manual_seed(seed)
    model = MoeModel(m)
    opt = adamw(model, t, lr)

    lr_at = lr_schedule(lr, min_lr, warmup, steps)
    buf = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    losses, seconds = [], []
    for step in range(steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        offs = [splitmix(seed ^ splitmix(splitmix(step * 1000003 + i))) % (span + 1) for i in range(B)]
        rows = torch.stack([buf[o: o + s + 1] for o in offs]).long()
        loss = model(rows[:, :-1], rows[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), t.get("grad_clip", 1.0))
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        opt.step()
        losses.append(loss.item())
        seconds.append(time.perf_counter() - t0)
    write_summary(a.out, losses, seconds, B * s, {})


if __name__ == "__main__":
    main()
