#!/usr/bin/env python3
"""The PyTorch peer of scripts/gpu/check.sh: smp's benchmark GPT written as a
user writes it in PyTorch, nanoGPT's way, timed on the device.

The model is the gpt adapter's model.arch = "gpt2" (adapters/gpt/gpt_adapter.cpp)
for the same config: token + learned position embeddings, pre-LN blocks
(LayerNorm eps 1e-5, one Linear(h, 3h) for q/k/v with biases, causal
F.scaled_dot_product_attention, output projection, MLP h -> ffn -> h with
GELU(tanh)), final LayerNorm, LM head tied to the token embedding, the
vocabulary padded to a multiple of model.vocab_multiple (128) as smp pads it,
token-mean cross entropy. Initialisation as smp's (std 0.02, output
projections 0.02 / sqrt(2 L), positions 0.01). fp32 parameters under
torch.autocast(bfloat16) (precision "bf16"), torch.optim.AdamW(fused=True)
with decay on tensors of dim >= 2, clip_grad_norm_, the config's batch in its
microbatches (gradient accumulation), zero_grad(set_to_none=True).

  python3 bench/gpu/peer_gpt.py --config bench/configs/gpt-1.3b-bf16.toml \
      [--set model.layers=2 ...] [--compile none|full|regional] [--out peer.json]

Timed: --warmup steps (default 2), then --steps steps (default: the config's
train.steps - warmup, at least 1), each between two CUDA events (wall clock on
the CPU); the batch is sampled on the host (random byte windows of the
config's data, or random bytes where the data is missing), pinned and copied
without blocking, as nanoGPT's get_batch. Prints one JSON object (also to
--out): tokens_per_s (tokens per step / mean timed step), step_ms (median),
step_ms_each, max_memory_allocated (bytes, CUDA), compile seconds, and what
ran (attention, optimizer, autocast dtype, torch version).

Works on torch 1.13 (no SDPA: the explicit softmax; no fused AdamW: foreach;
--compile refused) and on the CPU (the dry run of scripts/gpu/check.sh).
"""
import argparse
import json
import math
import os
import statistics
import sys
import time

try:
    import tomllib
except ImportError:  # python < 3.11
    try:
        import tomli as tomllib
    except ImportError:
        tomllib = None

import torch
import torch.nn.functional as F


def load_config(path, sets):
    if tomllib is None:
        sys.exit("peer_gpt.py: needs python >= 3.11 (tomllib) or the tomli package to read " + path)
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


def read_bytes(path, want):
    """The corpus as bytes (a file, or a folder's files in name order); random
    bytes where it is missing: the data does not change the arithmetic."""
    data = b""
    try:
        if os.path.isdir(path):
            for n in sorted(os.listdir(path)):
                p = os.path.join(path, n)
                if not n.startswith(".") and os.path.isfile(p):
                    data += open(p, "rb").read()
                    if len(data) >= want:
                        break
        elif os.path.isfile(path):
            data = open(path, "rb").read(want)
    except OSError:
        data = b""
    if len(data) < 4 * want // 1024:  # too little to draw windows from (a few KiB would do)
        g = torch.Generator().manual_seed(7)
        return torch.randint(0, 256, (want,), dtype=torch.uint8, generator=g), "random bytes"
    return torch.frombuffer(bytearray(data), dtype=torch.uint8), path


class Block(torch.nn.Module):
    def __init__(self, h, heads, ffn, out_std, sdpa):
        super().__init__()
        self.h, self.heads, self.sdpa = h, heads, sdpa
        self.ln1, self.ln2 = torch.nn.LayerNorm(h, eps=1e-5), torch.nn.LayerNorm(h, eps=1e-5)
        self.qkv = torch.nn.Linear(h, 3 * h)
        self.o = torch.nn.Linear(h, h)
        self.fc, self.proj = torch.nn.Linear(h, ffn), torch.nn.Linear(ffn, h)
        for lin, std in [(self.qkv, 0.02), (self.o, out_std), (self.fc, 0.02), (self.proj, out_std)]:
            torch.nn.init.normal_(lin.weight, std=std)
            torch.nn.init.zeros_(lin.bias)

    def attention(self, x):
        B, S, _ = x.shape
        hd = self.h // self.heads
        q, k, v = (t.view(B, S, self.heads, hd).transpose(1, 2) for t in self.qkv(x).split(self.h, dim=2))
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # torch 1.13: nanoGPT's non-flash path
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
            mask = torch.ones(S, S, dtype=torch.bool, device=x.device).triu(1)
            y = torch.softmax(scores.masked_fill(mask, float("-inf")), -1) @ v
        return self.o(y.transpose(1, 2).reshape(B, S, self.h))

    def forward(self, x):
        x = x + self.attention(self.ln1(x))
        return x + self.proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class Gpt(torch.nn.Module):
    def __init__(self, L, h, heads, s, V, ffn):
        super().__init__()
        self.sdpa = hasattr(F, "scaled_dot_product_attention")
        self.wte = torch.nn.Embedding(V, h)
        self.wpe = torch.nn.Embedding(s, h)
        torch.nn.init.normal_(self.wte.weight, std=0.02)
        torch.nn.init.normal_(self.wpe.weight, std=0.01)
        out_std = 0.02 / math.sqrt(2 * L)
        self.blocks = torch.nn.ModuleList(Block(h, heads, ffn, out_std, self.sdpa) for _ in range(L))
        self.ln_f = torch.nn.LayerNorm(h, eps=1e-5)

    def forward(self, tokens, targets):
        x = self.wte(tokens) + self.wpe.weight[: tokens.shape[1]]
        for b in self.blocks:
            x = b(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # tied head
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))


def model_flops_per_sample(L, h, s, V):
    """Megatron's training FLOPs per sample without recomputation (the gpt adapter's count)."""
    return 72.0 * s * L * h * h * (1.0 + s / (6.0 * h) + V / (12.0 * L * h))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--set", action="append", default=[], help="KEY=VALUE as smp-launch's --set (TOML value)")
    ap.add_argument("--device", default="auto", help="cuda, cpu or auto (cuda when available)")
    ap.add_argument("--compile", default="none", choices=["none", "full", "regional"],
                    help="torch.compile the whole model (nanoGPT) or each block (regional: one compile reused by "
                         "the identical blocks, a fraction of the compile time)")
    ap.add_argument("--compile-backend", default="inductor",
                    help="torch.compile's backend (the dry run uses eager: dynamo only, no code generation)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=0, help="timed steps (0: train.steps - warmup, at least 1)")
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default)")
    ap.add_argument("--out")
    a = ap.parse_args()

    cfg = load_config(a.config, a.set)
    m, t, p = cfg.get("model", {}), cfg.get("train", {}), cfg.get("parallel", {})
    if m.get("arch", "gpt2") != "gpt2" or "preset" in m and str(m["preset"]).startswith("llama"):
        sys.exit("peer_gpt.py: only model.arch = \"gpt2\" is written here")
    if m.get("dropout", 0.0) > 0:
        sys.exit("peer_gpt.py: model.dropout must be 0 (the benchmark has none)")
    if a.threads > 0:
        torch.set_num_threads(a.threads)
    L, h, heads, s = m.get("layers", 2), m.get("hidden", 64), m.get("heads", 4), m.get("seq_len", 64)
    vocab = m.get("vocab", 256)
    multiple = m.get("vocab_multiple", 128)
    V = -(-vocab // multiple) * multiple  # padded as smp pads it (tp 1)
    ffn = m.get("ffn", 4 * h)
    B = t.get("batch_size", 8)
    micro = p.get("microbatches", 1)
    if B % micro:
        sys.exit(f"peer_gpt.py: train.batch_size {B} is not divisible by parallel.microbatches {micro}")
    mb = B // micro
    precision = t.get("precision", "fp32")
    timed = a.steps if a.steps > 0 else max(1, t.get("steps", 8) - a.warmup)

    dev = a.device
    if dev == "auto":
        dev = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(dev)
    cuda = device.type == "cuda"
    torch.manual_seed(t.get("seed", 1234))
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    model = Gpt(L, h, heads, s, V, ffn).to(device)
    n_params = sum(q.numel() for q in model.parameters())
    decay = [q for q in model.parameters() if q.dim() >= 2]
    no_decay = [q for q in model.parameters() if q.dim() < 2]
    groups = [{"params": decay, "weight_decay": t.get("weight_decay", 0.1)},
              {"params": no_decay, "weight_decay": 0.0}]
    kw = dict(lr=t.get("lr", 1e-4), betas=(t.get("beta1", 0.9), t.get("beta2", 0.95)), eps=t.get("eps", 1e-8))
    opt, optimizer = None, None
    for variant in ("fused", "foreach"):
        try:
            opt = torch.optim.AdamW(groups, **kw, **{variant: True})
            optimizer = variant
            break
        except (TypeError, RuntimeError, ValueError):
            continue
    if opt is None:
        opt, optimizer = torch.optim.AdamW(groups, **kw), "for-loop"

    compiled = "none"
    if a.compile != "none":
        if not hasattr(torch, "compile"):
            sys.exit(f"peer_gpt.py: torch {torch.__version__} has no torch.compile")
        if a.compile == "full":
            fwd = torch.compile(model, backend=a.compile_backend)
        else:
            for i, b in enumerate(model.blocks):
                if hasattr(b, "compile"):  # torch >= 2.2: in place, the parameters' names unchanged
                    b.compile(backend=a.compile_backend)
                else:
                    model.blocks[i] = torch.compile(b, backend=a.compile_backend)
            fwd = model
        compiled = f"{a.compile} ({a.compile_backend})"
    else:
        fwd = model

    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    if amp_dtype is torch.float16:
        sys.exit("peer_gpt.py: precision fp16 (loss scaling) is not written here; bf16 or fp32")

    def autocast():
        if amp_dtype is None:
            return torch.autocast(device_type=device.type, enabled=False)
        return torch.autocast(device_type=device.type, dtype=amp_dtype)

    steps_total = a.warmup + timed
    data, data_source = read_bytes(m.get("data", "/usr/share/common-licenses"),
                                   max(1 << 22, 64 * (s + 1)) if cuda else max(1 << 20, 4 * B * (s + 1)))
    gen = torch.Generator().manual_seed(t.get("seed", 1234))
    window = torch.arange(s + 1)

    def batch():
        offs = torch.randint(0, data.numel() - s - 1, (B,), generator=gen)
        rows = data[offs[:, None] + window].long()
        if cuda:
            rows = rows.pin_memory().to(device, non_blocking=True)
        return rows[:, :-1], rows[:, 1:]

    clip = t.get("grad_clip", 1.0)
    ms, losses = [], []
    compile_s = None
    t_first = time.perf_counter()
    for step in range(steps_total):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        x, y = batch()
        for i in range(micro):
            with autocast():
                loss = fwd(x[i * mb:(i + 1) * mb], y[i * mb:(i + 1) * mb]) / micro
            loss.backward()
        if clip and clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach() * micro)
        if cuda:
            end.record()
            if step < a.warmup:
                torch.cuda.synchronize()
            else:
                ms.append((start, end))
        elif step >= a.warmup:
            ms.append((time.perf_counter() - t0) * 1e3)
        if step == a.warmup - 1 or (a.warmup == 0 and step == 0):
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats(device)
            compile_s = time.perf_counter() - t_first  # the warm-up: compilation, allocator growth
    if cuda:
        torch.cuda.synchronize()
        ms = [st.elapsed_time(en) for st, en in ms]
    tokens_per_step = B * s
    mean_ms = sum(ms) / len(ms)
    flops = model_flops_per_sample(L, h, s, V) * B
    out = {
        "runner": "pytorch-eager" if compiled == "none" else "pytorch-compile",
        "compile": compiled,
        "device": str(device) + (f" ({torch.cuda.get_device_name(device)})" if cuda else ""),
        "torch": torch.__version__,
        "precision": precision,
        "autocast": str(amp_dtype).replace("torch.", "") if amp_dtype else "none",
        "attention": "sdpa" if model.sdpa else "softmax (no SDPA in this torch)",
        "optimizer": f"AdamW ({optimizer})",
        "parameters": n_params,
        "shape": {"layers": L, "hidden": h, "heads": heads, "seq_len": s, "vocab": vocab, "padded_vocab": V,
                  "ffn": ffn, "batch_size": B, "microbatches": micro, "tied_embeddings": True},
        "data": data_source,
        "warmup_steps": a.warmup,
        "timed_steps": len(ms),
        "timer": "cuda events" if cuda else "wall clock",
        "warmup_seconds": compile_s,
        "tokens_per_step": tokens_per_step,
        "step_ms": statistics.median(ms),
        "step_ms_mean": mean_ms,
        "step_ms_each": ms,
        "tokens_per_s": tokens_per_step / (mean_ms / 1e3),
        "model_flops_per_step": flops,
        "model_flops_per_s": flops / (mean_ms / 1e3),
        "max_memory_allocated": torch.cuda.max_memory_allocated(device) if cuda else None,
        "losses": [float(v) for v in losses],
    }
    text = json.dumps(out)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
