#!/usr/bin/env python3
"""Reference byte-level BPE tokenizers from Hugging Face's `tokenizers`, for
the token-for-token test of smp's BpeTokenizer (data_test.cpp).

    bpe_reference.py CORPUS TEXT OUT_DIR

Trains two tokenizers on CORPUS (a text file): GPT-2's layout (ByteLevel
pre-tokenizer, saved as tokenizer.json and as vocab.json + merges.txt) and
Llama 3's (Split by its pattern, then ByteLevel without regex,
ignore_merges), and writes OUT_DIR/expected.json: each one's ids for TEXT
(a UTF-8 file). Exits 77 when `tokenizers` is not installed.
"""
import json
import os
import sys

try:
    import tokenizers
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
except ImportError:
    print("bpe_reference.py: Python's `tokenizers` is not installed (pip install tokenizers)")
    sys.exit(77)

LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def main():
    corpus, text_path, out = sys.argv[1:4]
    os.makedirs(out, exist_ok=True)
    text = open(text_path, encoding="utf-8", newline="").read()  # CR LF kept
    special = ["<|endoftext|>"]

    gpt2 = tokenizers.ByteLevelBPETokenizer()
    gpt2.train([corpus], vocab_size=1200, min_frequency=2, special_tokens=special)
    gpt2.save(os.path.join(out, "gpt2.json"))
    gpt2.save_model(out, "gpt2")  # gpt2-vocab.json, gpt2-merges.txt

    llama = Tokenizer(models.BPE(ignore_merges=True))
    llama.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    llama.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1500, min_frequency=2, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    llama.train([corpus], trainer)
    llama.save(os.path.join(out, "llama3.json"))

    expected = {
        "tokenizers_version": tokenizers.__version__,
        "gpt2": gpt2.encode(text).ids,
        "llama3": llama.encode(text, add_special_tokens=False).ids,
        "gpt2_eod": gpt2.token_to_id("<|endoftext|>"),
        "llama3_eod": llama.token_to_id("<|end_of_text|>"),
    }
    json.dump(expected, open(os.path.join(out, "expected.json"), "w"))
    print(f"bpe_reference.py: tokenizers {tokenizers.__version__}, {len(expected['gpt2'])} and "
          f"{len(expected['llama3'])} ids")


main()
