#!/usr/bin/env python3
"""The PyTorch-eager peers for `smp-bench eager`: the benchmark GPT written as one
writes it in PyTorch (pre-LN blocks with separate q/k/v projections, causal
softmax attention, GELU(tanh) MLP, final LN, LM head tied to the token
embedding, token-mean cross entropy; torch.optim.AdamW with decay on dim >= 2
tensors, clip_grad_norm_, linear warm-up + cosine), fed the gpt adapter's
samples (the same splitmix64 offsets into the same bytes). One thread. Run with
Debian's python3-torch (LibTorch 1.13, the version smp builds against):

  /usr/bin/python3 bench/eager_gpt.py --config bench/configs/gpt-bench.toml \
      --set train.steps=12 --out summary.json [--fused-qkv]

--fused-qkv is the leanest loop a user would write in plain eager PyTorch, as
nanoGPT writes it: one Linear(h, 3h) for q, k and v, split three ways;
zero_grad(set_to_none=True); F.scaled_dot_product_attention where torch has it
(2.0 on; 1.13 has not, so there the explicit softmax attention of nanoGPT's
non-flash path). Same model, initialisation scheme, AdamW and clipping as the
default loop; no torch.compile.

Timed step, both variants (as smp's Runtime::train_step and the plain LibTorch
loop): zeroing the gradients, sampling the batch, forward, backward,
clip_grad_norm_, AdamW and reading the loss. step_seconds is the mean over
steps 2..N (the first step pays one-time costs).
"""
import argparse
import json
import math
import os
import sys
import time
import tomllib

import torch
import torch.nn.functional as F

M64 = (1 << 64) - 1


def splitmix(x):
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def load_config(path, sets):
    with open(path, "rb") as f:
        cfg = tomllib.load(f)
    for s in sets:
        key, value = s.split("=", 1)
        *tables, last = key.split(".")
        node = cfg
        for t in tables:
            node = node.setdefault(t, {})
        node[last] = tomllib.loads("v = " + value)["v"]
    return cfg


def read_bytes(path):
    if os.path.isdir(path):
        names = sorted(n for n in os.listdir(path) if not n.startswith(".") and os.path.isfile(os.path.join(path, n)))
        return b"".join(open(os.path.join(path, n), "rb").read() for n in names)
    return open(path, "rb").read()


def adamw(model, t, lr):
    """AdamW as smp's: weight decay on tensors of dim >= 2 only."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": t.get("weight_decay", 0.1)},
                              {"params": no_decay, "weight_decay": 0.0}],
                             lr=lr, betas=(t.get("beta1", 0.9), t.get("beta2", 0.95)), eps=t.get("eps", 1e-8))


def lr_schedule(lr, min_lr, warmup, steps):
    """Linear warm-up, then cosine to min_lr (smp's schedule)."""
    def lr_at(step):
        if warmup > 0 and step < warmup:
            return lr * (step + 1) / warmup
        if steps <= warmup:
            return lr
        p = min(1.0, max(0.0, (step - warmup) / max(1, steps - warmup)))
        return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * p))
    return lr_at


def write_summary(path, losses, seconds, tokens_per_step, extra):
    """The summary smp-bench reads: step_seconds is the mean over steps 2..N."""
    timed = seconds[1:] if len(seconds) > 1 else seconds
    step_s = sum(timed) / len(timed)
    out = {"losses": losses, "final_loss": losses[-1], "step_seconds": step_s, "step_seconds_each": seconds,
           "tokens_per_s": tokens_per_step / step_s, "threads": torch.get_num_threads(), "torch": torch.__version__}
    out.update(extra)
    text = json.dumps(out)
    if path:
        with open(path, "w") as f:
            f.write(text)
    else:
        print(text)


class Gpt(torch.nn.Module):
    def __init__(self, L, h, heads, s, V, ffn, fused_qkv=False):
        super().__init__()
        self.h, self.heads, self.fused_qkv = h, heads, fused_qkv
        self.sdpa = fused_qkv and hasattr(F, "scaled_dot_product_attention")
        self.wte = torch.nn.Embedding(V, h)
        self.wpe = torch.nn.Embedding(s, h)
        torch.nn.init.normal_(self.wte.weight, std=0.02)
        torch.nn.init.normal_(self.wpe.weight, std=0.01)
        out_std = 0.02 / math.sqrt(2 * L)
        self.blocks = torch.nn.ModuleList()
        for _ in range(L):
            b = torch.nn.Module()
            b.ln1, b.ln2 = torch.nn.LayerNorm(h), torch.nn.LayerNorm(h)
            if fused_qkv:  # one [3h, h] weight, drawn as the three [h, h] ones are
                b.qkv = torch.nn.Linear(h, 3 * h)
                qkv = [b.qkv]
            else:
                b.q, b.k, b.v = (torch.nn.Linear(h, h) for _ in range(3))
                qkv = [b.q, b.k, b.v]
            b.o = torch.nn.Linear(h, h)
            b.fc, b.proj = torch.nn.Linear(h, ffn), torch.nn.Linear(ffn, h)
            for lin, std in [(m, 0.02) for m in qkv] + [(b.o, out_std), (b.fc, 0.02), (b.proj, out_std)]:
                torch.nn.init.normal_(lin.weight, std=std)
                torch.nn.init.zeros_(lin.bias)
            self.blocks.append(b)
        self.ln_f = torch.nn.LayerNorm(h)
        self.register_buffer("causal", torch.ones(s, s, dtype=torch.bool).triu(1), persistent=False)

    def attention(self, b, x):
        B, S, _ = x.shape
        hd = self.h // self.heads
        split = lambda t: t.view(B, S, self.heads, hd).transpose(1, 2)
        if self.fused_qkv:
            q, k, v = (split(t) for t in b.qkv(x).split(self.h, dim=2))
        else:
            q, k, v = split(b.q(x)), split(b.k(x)), split(b.v(x))
        if self.sdpa:
            return b.o(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, S, self.h))
        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        probs = torch.softmax(scores.masked_fill(self.causal[:S, :S], -1e9), -1)
        return b.o((probs @ v).transpose(1, 2).reshape(B, S, self.h))

    def forward(self, tokens, targets):
        x = self.wte(tokens) + self.wpe.weight[: tokens.shape[1]]
        for b in self.blocks:
            x = x + self.attention(b, b.ln1(x))
            x = x + b.proj(F.gelu(b.fc(b.ln2(x)), approximate="tanh"))
        logits = F.linear(self.ln_f(x), self.wte.weight)
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--out")
    ap.add_argument("--fused-qkv", action="store_true",
                    help="the nanoGPT-style loop: one qkv projection, set_to_none zeroing, SDPA where torch has it")
    ap.add_argument("--profile-ops", metavar="FILE",
                    help="profile steps 3..N op by op (torch.autograd.profiler) and write them as smp's "
                         "run.profile_ops does: {steps, ops: [{name, calls, self_us, total_us} per step]}")
    a = ap.parse_args()
    cfg = load_config(a.config, a.set)
    m, t = cfg["model"], cfg["train"]
    if m.get("dropout", 0.0) > 0:
        sys.exit("eager_gpt.py: model.dropout must be 0 (no dropout in the peer)")
    torch.set_num_threads(1)
    L, h, heads, s, V = m["layers"], m["hidden"], m["heads"], m["seq_len"], m["vocab"]
    ffn = m.get("ffn", 4 * h)
    B, steps, seed = t["batch_size"], t["steps"], t.get("seed", 1234)
    lr, min_lr, warmup = t.get("lr", 1e-3), t.get("min_lr", 1e-4), t.get("warmup_steps", 0)
    clip = t.get("grad_clip", 1.0)
    data = read_bytes(m.get("data", "/usr/share/common-licenses"))
    split = int(len(data) * (1.0 - m.get("val_fraction", 0.1)))
    span = split - s - 1
    torch.manual_seed(seed)
    model = Gpt(L, h, heads, s, V, ffn, a.fused_qkv)
    opt = adamw(model, t, lr)

    lr_at = lr_schedule(lr, min_lr, warmup, steps)
    buf = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    losses, seconds = [], []
    prof = None
    for step in range(steps):
        if a.profile_ops and step == 2:
            prof = torch.autograd.profiler.profile(use_kineto=False)
            prof.__enter__()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=a.fused_qkv)
        offs = [splitmix(seed ^ splitmix(splitmix(step * 1000003 + i))) % (span + 1) for i in range(B)]
        rows = torch.stack([buf[o: o + s + 1] for o in offs]).long()
        loss = model(rows[:, :-1], rows[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        opt.step()
        losses.append(loss.item())
        seconds.append(time.perf_counter() - t0)
    if prof is not None:
        prof.__exit__(None, None, None)
        n = steps - 2
        ops = [{"name": e.key, "calls": e.count / n, "self_us": e.self_cpu_time_total / n,
                "total_us": e.cpu_time_total / n} for e in prof.key_averages()]
        ops.sort(key=lambda o: -o["self_us"])
        with open(a.profile_ops, "w") as f:
            json.dump({"steps": n, "per": "step", "ops": ops}, f, indent=1)
    write_summary(a.out, losses, seconds, B * s, {"variant": "fused-qkv" if a.fused_qkv else "separate-qkv",
                                                  "attention": "sdpa" if model.sdpa else "softmax"})


if __name__ == "__main__":
    main()
