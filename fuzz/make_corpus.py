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
    make_bpe_hostile(byte_level)


def make_bpe_hostile(byte_level):
    """Issue 51's classes: two pieces at one id, type errors, a key given
    twice, nesting past the bound; and for tokenizer_export (its first byte:
    even, a tokenizer.json; odd, vocab.json + merges.txt) the same plus a file
    that is no tokenizer at all."""
    def spoiled(change):
        j = json.loads(tokenizer_json(byte_level))
        change(j)
        return json.dumps(j, ensure_ascii=False)

    def dup(j):
        j["model"]["vocab"]["<|endoftext|>"] = j["model"]["vocab"]["a"]
    hostile_json = {
        "dup-id": spoiled(dup),
        "dup-id-added": spoiled(lambda j: j.update(added_tokens=[{"id": 65, "content": "<|pad|>", "special": True}])),
        "type-id-string": spoiled(lambda j: j["model"]["vocab"].update(a="97")),
        "type-merges-numbers": spoiled(lambda j: j["model"].update(merges=[[1, 2], [3, 4]])),
        "type-merges-number": spoiled(lambda j: j["model"].update(merges=[7])),
        "type-merges-object": spoiled(lambda j: j["model"].update(merges={"a": "b"})),
        "type-added-no-content": spoiled(lambda j: j.update(added_tokens=[{"id": 256}])),
        "type-added-object": spoiled(lambda j: j.update(added_tokens={"content": 1})),
        "type-added-id-string": spoiled(lambda j: j.update(added_tokens=[{"id": "x", "content": "<|endoftext|>"}])),
        "type-model-type": spoiled(lambda j: j["model"].update(type=5)),
        "type-ignore-merges": spoiled(lambda j: j["model"].update(ignore_merges="yes")),
        "type-pre-tokenizer": spoiled(lambda j: j.update(pre_tokenizer={"type": 3})),
        "type-pre-sequence": spoiled(lambda j: j.update(pre_tokenizer={"type": "Sequence", "pretokenizers": [1, 2]})),
        "type-normalizer-string": spoiled(lambda j: j.update(normalizer="NFC")),
        "dup-key": tokenizer_json(byte_level).replace('"model": {', '"model": {"type": "BPE", ', 1),
        "deep-nesting": '{"model": ' + "[" * 80 + "]" * 80 + "}",
    }
    for name, text in hostile_json.items():
        out("bpe_json", name, text)
        out("tokenizer_export", "json-" + name, b"\x00" + text.encode())
    vocab, merges = bpe_vocab(MERGES)
    text = ("#version: 0.2\n" + "".join("%s %s\n" % m for m in merges)).encode()
    dup_vocab = dict(vocab, **{"<|endoftext|>": vocab["a"]})
    hostile_merges = {
        "dup-id": two(json.dumps(dup_vocab, ensure_ascii=False).encode(), text),
        "type-id-string": two(json.dumps(dict(vocab, a="97"), ensure_ascii=False).encode(), text),
        "type-id-object": two(json.dumps(dict(vocab, a={"id": 97}), ensure_ascii=False).encode(), text),
        "type-vocab-array": two(b"[1, 2, 3]", text),
        "merges-numbers": two(json.dumps(vocab, ensure_ascii=False).encode(), b"#version: 0.2\n1 2\n3 4\n"),
        "dup-key": two(json.dumps(vocab, ensure_ascii=False).replace("{", '{"a": 1, ', 1).encode(), text),
        "deep-nesting": two(b"[" * 80 + b"]" * 80, text),
    }
    for name, data in hostile_merges.items():
        out("bpe_merges", name, data)
        out("tokenizer_export", "merges-" + name, b"\x01" + data)
    out("tokenizer_export", "json-gpt2", b"\x00" + tokenizer_json(byte_level).encode())
    out("tokenizer_export", "merges-gpt2", b"\x01" + two(json.dumps(vocab, ensure_ascii=False).encode(), text))
    secret = b"root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n"
    out("tokenizer_export", "json-not-a-tokenizer", b"\x00" + secret)
    out("tokenizer_export", "merges-not-a-tokenizer", b"\x01" + two(secret, secret))


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
    # Issue 51's nesting classes, just past the bound of 32 levels (the 10^5-deep
    # files that crashed toml++ are in fuzz/regressions/config/review-deep-*),
    # and what nests within it, strings and comments full of brackets included.
    out("config", "deep-table-headers", "[train]\nsteps = 1\n[model" + ".m" * 40 + "]\nx = 1\n")
    out("config", "deep-array-of-tables", "[[model" + ".m" * 40 + "]]\nx = 1\n")
    out("config", "deep-dotted-key", '[model]\nadapter = "gpt"\n' + "a" + ".a" * 40 + " = 1\n")
    out("config", "deep-inline-tables", "[model]\nx = " + "{a = " * 40 + "1" + "}" * 40 + "\n")
    out("config", "deep-arrays", "[model]\nx = " + "[" * 40 + "]" * 40 + "\n")
    out("config", "deep-mixed",
        "[model.a.b.c.d.e.f.g.h.i]\nx.y.z.w.v.u.t.s.r.q = {k.l.m = [[[[[[[[[[[[[[1]]]]]]]]]]]]]]}\n")
    out("config", "nested-within-bound",
        "[model.a.b.c]\nx = [[1, 2], [3, [4, [5]]]]\ny = {p = {q = {r = 1}}}\nd.e.f = 2\n[[model.rows]]\nk = 1\n"
        "[[model.rows]]\nk = 2\n")
    out("config", "strings-with-brackets",
        '[model]\ns = "[[[{{{a.b.c\\"[["\nm = """\n[[[[\n{{{{ a.a.a.a\n""""\nl = \'\'\'a.b.c]]]}}\'\'\'\n'
        "t = 'x[y{'\n# [[[[a.a.a.a\n\"q.u.o.t.e.d\" = 1\n")
    out("config", "deep-set-value", "[train]\nsteps = 1\n#--set\nmodel.x=" + "[" * 40 + "\n")


# ---- cluster files (smp-plan --cluster) ----

def make_cluster():
    clusters = os.path.join(ROOT, "configs", "clusters")
    for name in sorted(os.listdir(clusters)):
        if name.endswith(".toml"):
            out("cluster", name[:-5], open(os.path.join(clusters, name), "rb").read())
    base = open(os.path.join(clusters, "dgx-a100-80gb.toml")).read()

    def edited(name, old, new):
        assert old in base, old
        out("cluster", name, base.replace(old, new, 1))

    # Issue 51: figures that made every prediction NaN or overflowed an int,
    # and the nesting classes, just past the bound.
    edited("nan-efficiency", "[64, 0.25]", "[64, nan]")
    edited("nan-gemm-size", "[64, 0.25]", "[nan, 0.25]")
    edited("inf-gemm-size", "[8192, 0.78]", "[inf, 0.78]")
    edited("tiny-efficiency", "[64, 0.25]", "[64, 1e-300]")
    edited("huge-memory", "memory_gb = 80", "memory_gb = 1e300")
    edited("inf-memory-bandwidth", "memory_bandwidth_gbs = 2039", "memory_bandwidth_gbs = inf")
    edited("nan-peak", "fp16 = 312.0", "fp16 = nan")
    edited("tiny-peak", "fp16 = 312.0", "fp16 = 1e-300")
    edited("huge-latency", "latency_us = 5", "latency_us = 1e300")
    edited("huge-node", "accelerators = 8", "accelerators = 1e10")
    edited("int-overflow-node", "accelerators = 8", "accelerators = 2147483648")
    edited("negative-overhead", "memory_bandwidth_gbs = 2039", "memory_bandwidth_gbs = 2039\nop_overhead_us = -inf")
    edited("alltoall-link", "[topology]", "[links.alltoall]\nbandwidth_gbs = 100\nlatency_us = 20\n\n[topology]")
    edited("deep-table-headers", "[topology]", "[a" + ".a" * 40 + "]\n\n[topology]")
    edited("deep-dotted-key", "[topology]", "a" + ".a" * 40 + " = 1\n\n[topology]")
    edited("deep-inline-tables", "peak_tflops = {", "x = " + "{a = " * 40 + "1" + "}" * 40 + "\npeak_tflops = {")
    edited("deep-arrays", "gemm_efficiency = [", "gemm_efficiency = " + "[" * 40)


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


# ---- plugin files (fuzz/elf_header.cpp: the ELF check before dlopen) ----

def make_elf(project_build):
    """The first 4 KiB of real built plugins (the issue's SIGBUS), a whole tiny
    shared object, and hostile headers patched into that one."""
    for name, path in (("good_c_plugin-4k", "tests/plugins/good_c_plugin.so"),
                       ("smp_optim-4k", "lib/smp/plugins/smp_optim.so"),
                       ("smp_nn-2k", "lib/smp/plugins/smp_nn.so")):
        full = os.path.join(project_build, path)
        if not os.path.exists(full):
            print("%s not built: its seed not written" % full, file=sys.stderr)
            continue
        with open(full, "rb") as f:
            out("elf_header", name, f.read(4096 if name.endswith("4k") else 2048))
    with tempfile.TemporaryDirectory() as d:
        src, so = os.path.join(d, "s.c"), os.path.join(d, "s.so")
        with open(src, "w") as f:
            f.write("int smp_seed(void) { return 42; }\n")
        try:
            subprocess.run([os.environ.get("CC", "cc"), "-shared", "-fPIC", "-nostdlib", "-s", "-Wl,-z,noseparate-code",
                            "-Wl,--build-id=none", "-Wl,-z,norelro", "-o", so, src], check=True)
        except (OSError, subprocess.CalledProcessError) as e:
            print("no C compiler for the tiny shared object (%s): its seeds not written" % e, file=sys.stderr)
            return
        with open(so, "rb") as f:
            tiny = f.read()
    out("elf_header", "tiny-valid", tiny)
    phoff, = struct.unpack_from("<Q", tiny, 32)
    shoff, = struct.unpack_from("<Q", tiny, 40)

    def patched(*edits):
        b = bytearray(tiny)
        for off, fmt, value in edits:
            struct.pack_into(fmt, b, off, value)
        return bytes(b)

    load1 = phoff + 56  # the second program header: a PT_LOAD
    out("elf_header", "huge-p-offset", patched((load1 + 8, "<Q", 2**64 - 16)))
    out("elf_header", "huge-p-filesz", patched((load1 + 32, "<Q", 2**63)))
    out("elf_header", "phnum-65535", patched((56, "<H", 65535)))
    out("elf_header", "phoff-overflow", patched((32, "<Q", 2**64 - 8)))
    out("elf_header", "shoff-overflow", patched((40, "<Q", 2**64 - 64)))
    out("elf_header", "shnum-0-huge-count", patched((60, "<H", 0), (shoff + 32, "<Q", 2**60)))
    out("elf_header", "elf32", patched((4, "<B", 1)))
    out("elf_header", "aarch64", patched((18, "<H", 183)))
    out("elf_header", "exec", patched((16, "<H", 2)))
    out("elf_header", "truncated-mid-segment", tiny[:0x200])
    out("elf_header", "text", "#!/bin/sh\necho not a plugin\n")


# ---- the fixtures' own files ----

# ---- Hugging Face folders (hf_folder: config.json, index, one shard) ----

def three(a, b, c):
    return struct.pack("<I", len(a)) + a + struct.pack("<I", len(b)) + b + c


def hf_llama_tensors(hidden=4, heads=1, kv=1, ffn=4, vocab=4, layers=1, tied=False, experts=0):
    hd = hidden // heads
    t = {"model.embed_tokens.weight": [vocab, hidden], "model.norm.weight": [hidden]}
    if not tied:
        t["lm_head.weight"] = [vocab, hidden]
    for i in range(layers):
        p = "model.layers.%d." % i
        t[p + "input_layernorm.weight"] = [hidden]
        t[p + "post_attention_layernorm.weight"] = [hidden]
        t[p + "self_attn.q_proj.weight"] = [heads * hd, hidden]
        t[p + "self_attn.k_proj.weight"] = [kv * hd, hidden]
        t[p + "self_attn.v_proj.weight"] = [kv * hd, hidden]
        t[p + "self_attn.o_proj.weight"] = [hidden, heads * hd]
        if experts:
            t[p + "block_sparse_moe.gate.weight"] = [experts, hidden]
            for x in range(experts):
                e = p + "block_sparse_moe.experts.%d." % x
                t[e + "w1.weight"] = [ffn, hidden]
                t[e + "w3.weight"] = [ffn, hidden]
                t[e + "w2.weight"] = [hidden, ffn]
        else:
            t[p + "mlp.gate_proj.weight"] = [ffn, hidden]
            t[p + "mlp.up_proj.weight"] = [ffn, hidden]
            t[p + "mlp.down_proj.weight"] = [hidden, ffn]
    return t


def hf_shard(shapes, dtype="F32"):
    size = {"F32": 4, "BF16": 2, "F16": 2}[dtype]
    tensors = {}
    for name, shape in shapes.items():
        n = 1
        for d in shape:
            n *= d
        tensors[name] = (dtype, shape, bytes(range(7, 7 + size)) * n if size <= 4 else b"")
    return safetensors(tensors)


def make_hf():
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4,
              "intermediate_size": 4, "num_hidden_layers": 1, "num_attention_heads": 1,
              "num_key_value_heads": 1, "vocab_size": 4, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
              "tie_word_embeddings": False}
    c = json.dumps(config).encode()
    shapes = hf_llama_tensors()
    out("hf_folder", "llama-one-file", three(c, b"", hf_shard(shapes)))
    out("hf_folder", "llama-bf16", three(c, b"", hf_shard(shapes, "BF16")))
    index = json.dumps({"metadata": {"total_size": 0},
                        "weight_map": {n: "model-00001-of-00002.safetensors" for n in shapes}}).encode()
    out("hf_folder", "llama-sharded", three(c, index, hf_shard(shapes)))
    tied = dict(config, tie_word_embeddings=True)
    out("hf_folder", "llama-tied", three(json.dumps(tied).encode(), b"", hf_shard(hf_llama_tensors(tied=True))))
    mixtral = dict(config, model_type="mixtral", architectures=["MixtralForCausalLM"], num_local_experts=2,
                   num_experts_per_tok=1, rms_norm_eps=1e-5)
    out("hf_folder", "mixtral", three(json.dumps(mixtral).encode(), b"", hf_shard(hf_llama_tensors(experts=2))))
    # The hostile classes of issue 51, one seed each.
    wrong = dict(shapes)
    wrong["model.layers.0.self_attn.q_proj.weight"] = [2, 8]
    out("hf_folder", "wrong-shape", three(c, b"", hf_shard(wrong)))
    out("hf_folder", "deep-config", three(b"[" * 300 + b"]" * 300, b"", hf_shard(shapes)))
    out("hf_folder", "deep-index", three(c, b'{"weight_map":' + b"[" * 300 + b"]" * 300 + b"}", hf_shard(shapes)))
    out("hf_folder", "huge-layers", three(json.dumps(dict(config, num_hidden_layers=2 ** 62)).encode(), b"",
                                          hf_shard(shapes)))
    out("hf_folder", "nan-rope", three(c.replace(b"10000.0", b"NaN"), b"", hf_shard(shapes)))
    out("hf_folder", "index-outside", three(c, json.dumps({"weight_map": {"model.norm.weight": "../x"}}).encode(),
                                            hf_shard(shapes)))
    header = b'{"model.norm.weight":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},' \
             b'"model.norm.weight":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}'
    out("hf_folder", "duplicate-tensor", three(c, b"", struct.pack("<Q", len(header)) + header + b"\0" * 16))
    header = b'{"model.norm.weight":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},' \
             b'"lm_head.weight":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}}'
    out("hf_folder", "overlap", three(c, b"", struct.pack("<Q", len(header)) + header + b"\0" * 24))
    out("hf_folder", "huge-header", three(c, b"", struct.pack("<Q", 5 * 10 ** 9) + b"{}"))


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
    make_hf()
    make_indexed()
    make_bpe()
    make_sentencepiece()
    make_config()
    make_cluster()
    make_plugin()
    make_elf(os.path.join(ROOT, "build"))
    make_from_fixtures(args.build)


if __name__ == "__main__":
    main()
