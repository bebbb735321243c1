#!/usr/bin/env python3
"""An independent writer of Megatron's indexed dataset (MMIDIDX version 1),
from the format alone (no smp code): <prefix>.idx = b"MMIDIDX\\x00\\x00", u64
version, u8 dtype code, u64 sequences, u64 document-index entries, int32
lengths, int64 byte offsets into .bin, int64 document index. It writes byte
tokens of the given text files as int32 (dtype 4), each document split into
sequences at blank lines (as preprocess_data.py --split-sentences makes
several sequences per document), followed by an end-of-document id 256.

  write_megatron_dataset.py PREFIX FILE [FILE ...]
"""
import struct
import sys


def main():
    prefix, files = sys.argv[1], sys.argv[2:]
    lengths, offsets, docs = [], [], [0]
    pos = 0
    with open(prefix + ".bin", "wb") as bin_file:
        for name in files:
            text = open(name, "rb").read()
            parts = [p for p in text.split(b"\n\n") if p]
            for k, part in enumerate(parts):
                ids = list(part) + ([256] if k == len(parts) - 1 else [])
                bin_file.write(struct.pack("<%di" % len(ids), *ids))
                lengths.append(len(ids))
                offsets.append(pos)
                pos += 4 * len(ids)
            docs.append(len(lengths))
    with open(prefix + ".idx", "wb") as idx:
        idx.write(b"MMIDIDX\x00\x00")
        idx.write(struct.pack("<Q", 1))
        idx.write(struct.pack("<B", 4))
        idx.write(struct.pack("<Q", len(lengths)))
        idx.write(struct.pack("<Q", len(docs)))
        idx.write(struct.pack("<%di" % len(lengths), *lengths))
        idx.write(struct.pack("<%dq" % len(offsets), *offsets))
        idx.write(struct.pack("<%dq" % len(docs), *docs))


if __name__ == "__main__":
    main()
