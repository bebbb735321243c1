#!/usr/bin/env python3
"""Writes the seed corpus of every harness into fuzz/corpus/<harness>/.

Small valid files of each format (and a few near-valid ones), written from
the formats' descriptions in the readers' headers; the checkpoint manifest and
the epoch index are the real files the harnesses' own fixtures write
(SMP_FUZZ_SEED_OUT, built fuzzers in build-fuzz/), and the SentencePiece
models come from Debian's spm_train. Run again after changing a harness's
input layout:  python3 fuzz/make_corpus.py [--build build-fuzz]
"""
import argparse
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def out(harness, name, data):
    d = os.path.join(HERE, "corpus", harness)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def two(a, b):
    """Two files in one input (fuzz/support/fuzz_target.h split_two)."""
    return struct.pack("<I", len(a)) + a + b


# ---- safetensors ----

def safetensors(tensors, metadata=None):
    header, blobs, off = {}, [], 0
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + len(data)]}
        off += len(data)
        blobs.append(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(blobs)


def make_safetensors():
    f32 = struct.pack("<6f", *range(6))
    out("safetensors", "two-tensors", safetensors(
        {"model/w": ("F32", [2, 3], f32), "model/b": ("BF16", [3], b"\x80\x3f" * 3)},
        {"format": "smp-checkpoint", "rank": "0"}))
    out("safetensors", "every-dtype", safetensors({
        "f64": ("F64", [1], struct.pack("<d", 1.5)), "f16": ("F16", [2], b"\x00\x3c" * 2),
        "i64": ("I64", [1], struct.pack("<q", -7)), "i32": ("I32", [1], struct.pack("<i", 3)),
        "i16": ("I16", [1], struct.pack("<h", 3)), "i8": ("I8", [2], b"\x01\xff"),
        "u8": ("U8", [3], b"abc"), "bool": ("BOOL", [2], b"\x00\x01")}))
    out("safetensors", "scalar-and-empty", safetensors(
        {"step": ("I64", [], struct.pack("<q", 100)), "empty": ("F32", [0, 4], b"")}))
    out("safetensors", "header-only", safetensors({}))
    out("safetensors", "truncated", safetensors({"w": ("F32", [4], struct.pack("<4f", 1, 2, 3, 4))})[:-5])


# ---- Megatron indexed dataset ----

def indexed(docs, code=8, fmt="<H", elem=2):
    """docs: a list of documents, each a list of sequences of token ids."""
    lengths, offsets, doc_index, binary, off = [], [], [0], b"", 0
    for doc in docs:
        for seq in doc:
            lengths.append(len(seq))
            offsets.append(off)
            binary += b"".join(struct.pack(fmt, t) for t in seq)
            off += len(seq) * elem
        doc_index.append(len(lengths))
    idx = b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, code, len(lengths), len(doc_index))
    idx += struct.pack("<%di" % len(lengths), *lengths)
    idx += struct.pack("<%dq" % len(offsets), *offsets)
    idx += struct.pack("<%dq" % len(doc_index), *doc_index)
    return two(idx, binary)


def make_indexed():
    docs = [[list(range(i, i + n))] for i, n in enumerate([9, 7, 12, 6, 10, 8])]
    out("indexed_dataset", "uint16-six-documents", indexed(docs))
    out("indexed_dataset", "uint8", indexed(docs, 1, "<B", 1))
    out("indexed_dataset", "int16", indexed(docs, 3, "<h", 2))
    out("indexed_dataset", "int32", indexed([[list(range(70000, 70000 + n))] for n in [9, 8, 11, 7]], 4, "<i", 4))
    split = [[list(range(5)), list(range(5, 9))], [list(range(30, 41))], [[1, 2, 3], [4, 5, 6, 7]], [list(range(9))]]
    out("indexed_dataset", "split-sentences", indexed(split))
    out("indexed_dataset", "too-few-tokens", indexed([[[1, 2]], [[3]]]))


# ---- BPE tokenizers ----

def byte_chars():
    """GPT-2's bytes_to_unicode."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def bpe_vocab(extra_merges):
    chars = byte_chars()
    vocab = {chars[b]: i for i, b in enumerate(sorted(chars))}
    merges = []
    for a, b in extra_merges:
        merges.append((a, b))
        vocab.setdefault(a + b, len(vocab))
    vocab["<|endoftext|>"] = len(vocab)
    return vocab, merges


MERGES = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "a"), ("e", "r"), ("o", "n"), ("Ġ", "w"),
          ("l", "l"), ("'", "s"), ("Ġ", "1"), ("2", "3")]

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3_PATTERN = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
                  r"""\s*[\r\n]+|\s+(?!\S)|\s+""")


def tokenizer_json(pre, merges_as="strings", added=True, ignore_merges=False):
    vocab, merges = bpe_vocab(MERGES)
    model = {"type": "BPE", "vocab": vocab,
             "merges": [a + " " + b for a, b in merges] if merges_as == "strings" else [[a, b] for a, b in merges]}
    if ignore_merges:
        model["ignore_merges"] = True
    j = {"version": "1.0", "normalizer": None, "pre_tokenizer": pre, "model": model}
    if added:
        j["added_tokens"] = [{"id": vocab["<|endoftext|>"], "content": "<|endoftext|>", "special": True}]
    return json.dumps(j, ensure_ascii=False)


def make_bpe():
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True}
    out("bpe_json", "gpt2", tokenizer_json(byte_level))
    out("bpe_json", "gpt2-prefix-space", tokenizer_json(dict(byte_level, add_prefix_space=True), "pairs"))
    seq = {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": LLAMA3_PATTERN}, "behavior": "Isolated", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "use_regex": False}]}
    out("bpe_json", "llama3", tokenizer_json(seq, ignore_merges=True))
    seq2 = json.loads(json.dumps(seq))
    seq2["pretokenizers"][0]["pattern"]["Regex"] = GPT2_PATTERN
    out("bpe_json", "split-gpt2", tokenizer_json(seq2, added=False))
    out("bpe_json", "wordpiece-refused", json.dumps({"model": {"type": "WordPiece", "vocab": {"a": 0}}}))
    vocab, merges = bpe_vocab(MERGES)
    text = "#version: 0.2\n" + "".join("%s %s\n" % m for m in merges)
    out("bpe_merges", "gpt2", two(json.dumps(vocab, ensure_ascii=False).encode(), text.encode()))
    out("bpe_merges", "crlf-no-version", two(json.dumps(vocab, ensure_ascii=False).encode(),
                                             "".join("%s %s\r\n" % m for m in merges[:5]).encode()))
    out("bpe_merges", "bad-merge", two(json.dumps(vocab, ensure_ascii=False).encode(), b"#version: 0.2\na b c\n"))


# ---- SentencePiece ----

def make_sentencepiece():
    if not shutil.which("spm_train"):
        print("spm_train not found (Debian's sentencepiece): SentencePiece seeds not written", file=sys.stderr)
        return
    text = open("/usr/share/common-licenses/GPL-3", encoding="utf-8").read()[:40000]
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "text.txt")
        with open(src, "w") as f:
            f.write(text)
        for model_type, vocab in [("unigram", 80), ("bpe", 80), ("char", 60), ("word", 60)]:
            prefix = os.path.join(tmp, model_type)
            subprocess.run(["spm_train", "--input=" + src, "--model_prefix=" + prefix, "--vocab_size=%d" % vocab,
                            "--model_type=" + model_type, "--normalization_rule_name=identity",
                            "--character_coverage=1.0", "--minloglevel=2", "--hard_vocab_limit=false"],
                           check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            out("sentencepiece", model_type + ".model", open(prefix + ".model", "rb").read())
    out("sentencepiece", "not-a-model", "not a model")


# ---- job configuration ----

def make_config():
    cfg = os.path.join(ROOT, "configs")
    for name in sorted(os.listdir(cfg)):
        if name.endswith(".toml"):
            out("config", name, open(os.path.join(cfg, name), "rb").read())
    tiny = open(os.path.join(cfg, "gpt-tiny.toml")).read()
    out("config", "gpt-tiny-with-sets", tiny + "\n#--set\nparallel.tp=2\nparallel.axes.cp=2\ntrain.lr=1e-3\n"
        "model.hidden=128\nparallel.schedule=1f1b\nmemory.shard=optimizer\n")
    out("config", "axes-and-flatten",
        '[parallel]\npp = 2\naxes = { cp = 2 }\nflatten = { mp2 = ["tp", "cp"] }\nplacement = "pp,dp,cp,tp"\n'
        'microbatches = 4\nschedule = "interleaved-1f1b"\nvirtual_stages = 2\n[train]\nbatch_size = 8\n'
        'precision = "bf16"\n[tp]\nsequence_parallel = true\n[model]\nadapter = "gpt"\n')
    out("config", "only-sets", "\n#--set\nparallel.dp=8\ntrain.steps=5\nrun.trace=true\nrun.trace_steps=[1, 2]\n")


# ---- plugin descriptors (the byte layout fuzz/plugin_descriptor.cpp decodes) ----

def make_plugin():
    # Names by index into plugin_descriptor.cpp's kKnown: 0 tp, 1 ep, 2 cp, 5 linear, 6 attention, 7 gpt,
    # 8 adamw, 11 tp_extra, 13 balanced, 15 x. Each struct ends with its size byte (0: the full struct).
    full = bytes([
        15, 5, 0, 6, 0,                     # name x, version "linear", ABI 2.6, no torch version
        1, 0, 0, 5, 0, 0, 0, 0, 1, 0,       # a module kind "linear", every function, features 1
        1, 0, 0, 7, 0, 0, 0, 0, 0,          # an adapter "gpt"
        1, 0, 0, 13, 0, 0,                  # a partition strategy "balanced"
        1, 0, 0, 0, 5, 6, 0, 100, 200, 0,   # a tp rule linear -> attention, splits 0.5 and 1
        2,                                  # two extensions:
        1, 0, 1, 0, 0, 11, 0, 0, 0,         #   config: table "tp_extra"
        2, 0, 1, 0, 0, 5, 1, 0,             #   memory: kind "linear" ...
        1, 0, 0, 0, 5, 100, 100, 0, 0,      #   ... and rule tp:linear
        0, 0])                              # a descriptor, full size
    optimizer = bytes([15, 15, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                       1, 0, 0, 1, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0])
    minor0 = bytes([7, 7, 0, 0, 0,
                    1, 0, 0, 6, 0, 0, 0, 0, 0, 214,  # a module kind of ABI 2.0's size
                    0, 0, 0, 0,
                    1, 0, 0, 2, 6, 5, 0, 0, 0, 212,  # a cp rule of ABI 2.0's size
                    0, 0, 0])
    out("plugin_descriptor", "full", full)
    out("plugin_descriptor", "optimizer-then-full", optimizer + full)
    out("plugin_descriptor", "abi-2.0-sizes", minor0)
    out("plugin_descriptor", "abi-1", bytes([15, 15, 241, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]))
    out("plugin_descriptor", "twice", full + full)


# ---- the fixtures' own files ----

def make_from_fixtures(build):
    for harness in ("manifest", "epoch_index"):
        exe = os.path.join(build, "fuzz_" + harness)
        if not os.path.exists(exe):
            print("%s not built: its seeds not written (scripts/fuzz.sh --build-only first)" % exe, file=sys.stderr)
            continue
        d = os.path.join(HERE, "corpus", harness)
        os.makedirs(d, exist_ok=True)
        seed = os.path.join(d, "real")
        with tempfile.TemporaryDirectory() as empty:
            subprocess.run([exe, "-runs=0", empty], env=dict(os.environ, SMP_FUZZ_SEED_OUT=seed), check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if harness == "manifest":
            m = json.load(open(seed))
            for s in (sl for t in m["tensors"].values() for sl in t["slices"]):
                s.pop("crc32c", None)
            out(harness, "no-slice-crcs", json.dumps(m, indent=1))
            m = json.load(open(seed))
            m["version"] = 2
            out(harness, "newer-version", json.dumps(m))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build-fuzz"))
    args = ap.parse_args()
    make_safetensors()
    make_indexed()
    make_bpe()
    make_sentencepiece()
    make_config()
    make_plugin()
    make_from_fixtures(args.build)


if __name__ == "__main__":
    main()
