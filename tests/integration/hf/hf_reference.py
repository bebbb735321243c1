#!/usr/bin/env python3
"""transformers' side of the Hugging Face reference tests: the model of an
exported folder (LlamaForCausalLM, MixtralForCausalLM: AutoModelForCausalLM
by its config.json) scores the same tokens as smp_hf_eval.

    hf_reference.py FOLDER TOKENS SEQ_LEN
    hf_reference.py FOLDER --generate IDS N   (IDS: comma-separated prompt ids)
    hf_reference.py FOLDER --write TOKENS SEQ_LEN
                      writes a seeded random Llama (GQA, untied, rope_theta
                      500000, rms_norm_eps 1e-6) with save_pretrained in
                      files of at most 20KB, then scores TOKENS with it

Prints one JSON line: {"loss": mean next-token cross-entropy, "logits":
[row][position][vocabulary entry], every entry}; with --generate, {"ids": the
N tokens transformers' greedy generate() adds to the prompt}. Exits 77 when torch or
transformers is not installed. SMP_PYDEPS_HF names a folder of transformers
and its pure-Python dependencies, searched after the interpreter's own (so
Debian's python3 keeps its numpy and torch).
"""
import json
import os
import sys

if os.environ.get("SMP_PYDEPS_HF"):
    sys.path.append(os.environ["SMP_PYDEPS_HF"])
try:
    import torch
    from transformers import AutoModelForCausalLM
except Exception as e:  # ImportError, or a version check of transformers
    print(f"hf_reference.py: {type(e).__name__}: {e}")
    sys.exit(77)

if sys.argv[2] == "--generate":
    model = AutoModelForCausalLM.from_pretrained(sys.argv[1], torch_dtype=torch.float32, attn_implementation="eager")
    prompt = torch.tensor([[int(x) for x in sys.argv[3].split(",")]], dtype=torch.long)
    n = int(sys.argv[4])
    with torch.no_grad():
        out = model.generate(prompt, do_sample=False, max_new_tokens=n, min_new_tokens=n, pad_token_id=0)
    print(json.dumps({"ids": out[0, prompt.size(1):].tolist()}))
    sys.exit(0)
if sys.argv[2] == "--write":
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=256, hidden_size=32, intermediate_size=48, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
                         rms_norm_eps=1e-6, rope_theta=500000.0, tie_word_embeddings=False, initializer_range=0.3)
    LlamaForCausalLM(config).save_pretrained(sys.argv[1], safe_serialization=True, max_shard_size="20KB")
    sys.argv = [sys.argv[0], sys.argv[1], sys.argv[3], sys.argv[4]]
folder, tokens_path, seq_len = sys.argv[1], sys.argv[2], int(sys.argv[3])
ids = [int(x) for x in open(tokens_path).read().split()]
rows = torch.tensor(ids, dtype=torch.long).view(-1, seq_len + 1)
model = AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32, attn_implementation="eager")
model.eval()
with torch.no_grad():
    logits = model(input_ids=rows[:, :seq_len]).logits.double()
loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), rows[:, 1:].reshape(-1))
print(json.dumps({"loss": loss.item(), "logits": logits.reshape(-1).tolist(),
                  "transformers": __import__("transformers").__version__, "torch": torch.__version__}))
