// The epoch-index cache (adapters/gpt/epoch_index.cpp): the input is the
// cached file of epoch 0 of a small real dataset (written once at start),
// which TextDataset maps instead of building the index, then draws every
// training sample of the epoch through it. The file's key word (word 2) is a
// hash of the dataset files' sizes, times and inode, which no stored input can
// know: the harness writes the real key there, everything else is the input.
#include "support/fuzz_target.h"

#include "epoch_index.h"
#include "text_dataset.h"

#include <smp/data/indexed_dataset.hpp>

#include <cstdio>
#include <fstream>

namespace {

constexpr int64_t kSeqLen = 4;
constexpr uint64_t kSeed = 99;
constexpr double kValFraction = 0.2;

struct Fixture {
  std::string prefix, cache, file;
  uint64_t key = 0;
};

// Five documents of 7, 5, 9, 6 and 8 tokens: four train (27 tokens, 6
// samples of 4) and one validation document.
const Fixture& fixture() {
  static const Fixture f = [] {
    Fixture out;
    out.prefix = smp::fuzz::work_dir() + "/fixed";
    out.cache = smp::fuzz::work_dir() + "/cache";
    smp::sdk::IndexedDatasetWriter w(out.prefix, smp::sdk::TokenType::kUint16);
    int64_t next = 0;
    for (int len : {7, 5, 9, 6, 8}) {
      std::vector<int64_t> doc;
      for (int i = 0; i < len; ++i) doc.push_back(next++ % 50);
      w.add_document(doc);
    }
    w.finish();
    const smp::sdk::IndexedDataset d(out.prefix);
    const int64_t first_val = smp::sdk::first_validation_document(d.documents(), kValFraction);
    out.key = gpt::epoch_cache_key(d, kSeed, kSeqLen, first_val);
    char name[64];
    std::snprintf(name, sizeof name, "/epoch-%06d-%016llx.bin", 0, static_cast<unsigned long long>(out.key));
    out.file = out.cache + name;
    // SMP_FUZZ_SEED_OUT: the index TextDataset builds and caches itself, as a seed (fuzz/make_corpus.py).
    if (const char* seed = std::getenv("SMP_FUZZ_SEED_OUT"); seed && *seed) {
      const gpt::TextDataset built(out.prefix, kValFraction, kSeqLen, kSeed, 50, nullptr, out.cache);
      int64_t tokens[kSeqLen], targets[kSeqLen];
      built.sample(false, 0, tokens, targets);
      std::ifstream from(out.file, std::ios::binary);
      std::ofstream(seed, std::ios::binary | std::ios::trunc) << from.rdbuf();
    }
    return out;
  }();
  return f;
}

}  // namespace

SMP_FUZZ_TARGET(epoch_index) {
  const Fixture& f = fixture();
  std::string bytes(reinterpret_cast<const char*>(data), size);
  if (bytes.size() >= 24) std::memcpy(bytes.data() + 16, &f.key, 8);
  smp::fuzz::make_dir(f.cache);
  smp::fuzz::write_file(f.file, bytes);
  const gpt::TextDataset d(f.prefix, kValFraction, kSeqLen, kSeed, 50, nullptr, f.cache);
  std::vector<int64_t> tokens(kSeqLen), targets(kSeqLen);
  for (int64_t g = 0; g < d.samples_per_epoch(); ++g) d.sample(false, g, tokens.data(), targets.data());
}
