// One epoch's indices over a prepared dataset's training documents, as
// Megatron's GPTDataset keeps them: the documents in a seeded shuffled order,
// the cumulative token count after each, and the shuffled order of the
// seq_len-token windows. Cached on disk (a file per epoch, in the dataset's
// <prefix>.smp-index/ folder or model.data_cache_path): the first rank to need
// an epoch writes it, every rank maps it, so a node holds one copy in the page
// cache. The file name carries a key of the dataset's sizes and modification
// times, the seed, seq_len and the split: a changed dataset or job never reads
// a stale file, it builds its own.
#pragma once

#include <smp/data/indexed_dataset.hpp>
#include <smp/sdk/splitmix.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace gpt {

// The seeds and shuffles of gpt's data (the SDK's SplitMix64).
inline uint64_t splitmix(uint64_t x) { return smp::sdk::detail::splitmix64(x); }

class EpochIndex {
 public:
  // shuffle_key: the epoch's seed (documents; the windows use a key derived from it).
  static std::unique_ptr<EpochIndex> build(const std::vector<int64_t>& doc_len, int64_t windows, uint64_t shuffle_key);
  // The cached file for (cache_key, epoch) in folder, written first when missing
  // (to a temporary name, then renamed). A folder that cannot be written is
  // reported once (a warning naming it) and the index stays in memory; a file
  // that is there but not an index of this shape is an error naming it.
  static std::unique_ptr<EpochIndex> cached(const std::string& folder, uint64_t cache_key, int64_t epoch,
                                            const std::vector<int64_t>& doc_len, int64_t windows, uint64_t shuffle_key);

  const int64_t* docs() const { return docs_; }
  const int64_t* ends() const { return ends_; }
  const int64_t* windows() const { return windows_; }
  int64_t documents() const { return documents_; }
  bool mapped() const { return file_ != nullptr; }

 private:
  std::vector<int64_t> own_;  // docs, ends, windows back to back (built in memory)
  std::unique_ptr<smp::sdk::detail::MappedFile> file_;
  const int64_t *docs_ = nullptr, *ends_ = nullptr, *windows_ = nullptr;
  int64_t documents_ = 0;
};

// The key of a prepared dataset's files (sizes and modification times) and
// the sampling parameters, for the cache's file names.
uint64_t epoch_cache_key(const smp::sdk::IndexedDataset& d, uint64_t seed, int64_t seq_len, int64_t train_documents);

}  // namespace gpt
