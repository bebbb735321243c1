// Language-model data for the decoder adapters: deterministic samples per
// (split, step, global sample index), whatever the parallel layout. Either
// raw text (a file, or a folder's regular files: windows at seeded random
// offsets; bytes, or tokenized at start by model.tokenizer, each file a
// document ended by the tokenizer's end-of-text id), or a prepared dataset in Megatron's indexed format
// (<prefix>.bin / <prefix>.idx, written by smp-data prepare or Megatron's
// preprocess_data.py), memory-mapped: each rank reads only the windows it
// samples. Prepared training samples follow Megatron's GPTDataset: each
// epoch shuffles the training documents (seeded by the epoch), concatenates
// them and cuts seq_len + 1 token windows (one token of overlap) whose order
// is shuffled too; global sample g = step x global batch + its index is
// sample g mod n of epoch g / n. The position is the step, which a
// checkpoint keeps: a resumed run reads exactly the next samples.

#pragma once

#include "epoch_index.h"

#include <smp/data/indexed_dataset.hpp>
#include <smp/data/tokenizer.hpp>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <mutex>
#include <memory>
#include <string>
#include <vector>

namespace gpt {

// What the adapters sample from: one dataset, or several blended by weight.
class LmData {
 public:
  virtual ~LmData() = default;
  // Fills tokens[i*seq_len ..] and targets (shifted by one) for samples
  // [first, first+count) of the given step's global batch.
  virtual void fill(bool validation, int64_t step, int64_t global_batch, int64_t first, int64_t count,
                    int64_t* tokens, int64_t* targets) const = 0;
  // The log line: sizes, splits, the unigram baseline.
  virtual std::string describe() const = 0;
};

// model.data: a path (text or a prepared prefix), or an array of
// { path = "...", weight = w } tables of prepared datasets blended by weight.
// tokenizer: what raw text is tokenized with (null: bytes). cache_path: where
// prepared datasets' epoch indices are cached ("": beside each, <prefix>.smp-index/).
std::unique_ptr<LmData> open_lm_data(const nlohmann::json& data, double val_fraction, int64_t seq_len, uint64_t seed,
                                     int64_t vocab, const smp::sdk::Tokenizer* tokenizer = nullptr,
                                     const std::string& cache_path = "");

class TextDataset : public LmData {
 public:
  // path: a file or folder of text, or a prepared dataset's prefix (or its
  // .idx / .bin). The last val_fraction of the bytes (text) or of the
  // documents (prepared) is the validation split. vocab: the model's; a
  // prepared token at or above it is an error naming the file and offset.
  TextDataset(const std::string& path, double val_fraction, int64_t seq_len, uint64_t seed, int64_t vocab = 256,
              const smp::sdk::Tokenizer* tokenizer = nullptr, const std::string& cache_path = "");

  // Fills tokens[i*seq_len ..] and targets (shifted by one) for samples
  // [first, first+count) of the given step's global batch.
  void fill(bool validation, int64_t step, int64_t global_batch, int64_t first, int64_t count, int64_t* tokens,
            int64_t* targets) const override;
  std::string describe() const override { return describe(path_); }
  // Prepared data: global sample g of a split into tokens[0, seq_len) and targets.
  void sample(bool validation, int64_t g, int64_t* tokens, int64_t* targets) const;

  // Prepared data: training samples per epoch, and where global sample g's
  // window starts (its epoch and its place in that epoch's token stream, in
  // units of seq_len).
  int64_t samples_per_epoch() const { return samples_per_epoch_; }
  std::pair<int64_t, int64_t> sample_of(int64_t g) const;

  bool prepared() const { return prepared_ != nullptr; }
  int64_t seq_len() const { return seq_len_; }
  int64_t train_tokens() const { return split_; }
  int64_t val_tokens() const { return size_ - split_; }
  // Unigram entropy of the training tokens (nats): the loss a model without context reaches.
  double unigram_entropy() const;
  // "data <path>: N train / M validation bytes|tokens, unigram entropy H nats", for the log.
  std::string describe(const std::string& path) const;
  // True when path names a prepared dataset (<path>.idx exists, or it ends in .idx / .bin).
  static bool is_prepared(const std::string& path);

 private:
  std::string path_;
  int64_t token(int64_t i) const {
    if (prepared_) return prepared_->token_at(i);
    return text_tokens_.empty() ? bytes_[static_cast<size_t>(i)] : text_tokens_[static_cast<size_t>(i)];
  }
  // One epoch's shuffled documents (prefix sums of their lengths) and samples.
  struct Epoch {
    int64_t index = -1;
    std::unique_ptr<EpochIndex> ix;
  };
  const Epoch& epoch(int64_t e) const;  // cached: the one asked last
  // The token at position p of epoch e's stream of shuffled documents.
  int64_t stream_token(const Epoch& ep, int64_t p) const;
  std::vector<int64_t> doc_begin_, doc_len_;  // training documents' token ranges
  int64_t samples_per_epoch_ = 0;
  std::string cache_folder_;  // the epoch indices' ("" for raw text)
  uint64_t cache_key_ = 0;
  mutable std::mutex epoch_mutex_;
  mutable Epoch epoch_;
  std::vector<uint8_t> bytes_;
  std::vector<int32_t> text_tokens_;  // raw text tokenized by model.tokenizer
  std::string tokenizer_name_;
  std::unique_ptr<smp::sdk::IndexedDataset> prepared_;
  int64_t size_ = 0, split_ = 0;
  int64_t seq_len_;
  uint64_t seed_;
  int64_t vocab_;
};

}  // namespace gpt
