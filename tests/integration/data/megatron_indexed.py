#!/usr/bin/env python3
"""Megatron-LM's own indexed-dataset reader and writer
(megatron/core/datasets/indexed_dataset.py from the megatron-core package),
for data_test's check that smp's files and Megatron's are the same format.

    megatron_indexed.py read PREFIX     Megatron's reader: prints {dtype, lengths, document_indices, tokens}
    megatron_indexed.py write PREFIX    Megatron's writer (IndexedDatasetBuilder): writes a dataset of
                                        several documents of several sequences, prints what it wrote

The module is loaded from its file, with stand-ins for the three helpers it
imports from the rest of megatron.core (object storage, the multi-storage
client, rank-0 logging), none of which a local file uses: importing
megatron.core itself pulls in Transformer Engine and more. Exits 77 when
megatron-core, numpy or torch is not installed.

SMP_PYDEPS names a folder of pure-Python packages (megatron-core, and numpy
for an interpreter without one), searched after the interpreter's own: so
Debian's python3 takes its own numpy, the one its python3-torch was built
against, and megatron-core from there.
"""
import importlib.util
import json
import os
import sys
import types

if os.environ.get("SMP_PYDEPS"):
    sys.path.append(os.environ["SMP_PYDEPS"])
try:
    import numpy
    import torch
    spec = importlib.util.find_spec("megatron")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("no megatron package (pip install megatron-core)")
except ImportError as e:
    print(f"megatron_indexed.py: {e}")
    sys.exit(77)


def megatron_indexed_dataset():
    root = list(spec.submodule_search_locations)[0]
    path = os.path.join(root, "core", "datasets", "indexed_dataset.py")
    for name in ("megatron", "megatron.core", "megatron.core.datasets"):
        sys.modules.setdefault(name, types.ModuleType(name))
    storage = types.ModuleType("megatron.core.datasets.object_storage_utils")
    for name in ("cache_index_file", "dataset_exists", "get_index_cache_path", "get_object_storage_access",
                 "parse_s3_path"):
        setattr(storage, name, lambda *a, **k: (_ for _ in ()).throw(RuntimeError("object storage is not used")))
    storage.is_object_storage_path = lambda path: False
    storage.S3Config = storage.ObjectStorageConfig = object
    msc = types.ModuleType("megatron.core.msc_utils")
    msc.MultiStorageClientFeature = type("MultiStorageClientFeature", (), {"is_enabled": staticmethod(lambda: False)})
    utils = types.ModuleType("megatron.core.utils")
    utils.log_single_rank = lambda logger, level, msg: None
    sys.modules.update({storage.__name__: storage, msc.__name__: msc, utils.__name__: utils})
    module_spec = importlib.util.spec_from_file_location("megatron.core.datasets.indexed_dataset", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def main():
    mode, prefix = sys.argv[1:3]
    m = megatron_indexed_dataset()
    if mode == "read":
        ds = m.IndexedDataset(prefix)
        tokens = [int(t) for i in range(len(ds)) for t in ds[i]]
        print(json.dumps({"dtype": numpy.dtype(ds.index.dtype).name, "lengths": [int(x) for x in ds.sequence_lengths],
                          "document_indices": [int(x) for x in ds.document_indices], "tokens": tokens}))
    elif mode == "write":
        builder = m.IndexedDatasetBuilder(prefix + ".bin", dtype=numpy.uint16)
        docs = [[[5, 6, 7], [8, 9]], [[300, 301, 302, 303]], [[1], [2, 2], [3, 3, 3]]] * 40
        for doc in docs:
            for seq in doc:
                builder.add_item(torch.tensor(seq, dtype=torch.int64))
            builder.end_document()
        builder.finalize(prefix + ".idx")
        print(json.dumps({"documents": docs}))
    else:
        sys.exit(f"megatron_indexed.py: unknown mode {mode}")


main()
