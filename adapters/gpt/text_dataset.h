// Language-model data for the decoder adapters: deterministic samples per
// (split, step, global sample index), whatever the parallel layout. Either
// raw text, byte-level (a file, or a folder's regular files), or a prepared
// dataset in Megatron's indexed format (<prefix>.bin / <prefix>.idx, written
// by smp-data prepare or Megatron's preprocess_data.py), memory-mapped: each
// rank reads only the windows it samples.
#pragma once

#include <smp/sdk/indexed_dataset.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace gpt {

class TextDataset {
 public:
  // path: a file or folder of text, or a prepared dataset's prefix (or its
  // .idx / .bin). The last val_fraction of the bytes (text) or of the
  // documents (prepared) is the validation split. vocab: the model's; a
  // prepared token at or above it is an error naming the file and offset.
  TextDataset(const std::string& path, double val_fraction, int64_t seq_len, uint64_t seed, int64_t vocab = 256);

  // Fills tokens[i*seq_len ..] and targets (shifted by one) for samples
  // [first, first+count) of the given step's global batch.
  void fill(bool validation, int64_t step, int64_t first, int64_t count, int64_t* tokens, int64_t* targets) const;

  bool prepared() const { return prepared_ != nullptr; }
  int64_t train_tokens() const { return split_; }
  int64_t val_tokens() const { return size_ - split_; }
  // Unigram entropy of the training tokens (nats): the loss a model without context reaches.
  double unigram_entropy() const;
  // "data <path>: N train / M validation bytes|tokens, unigram entropy H nats", for the log.
  std::string describe(const std::string& path) const;
  // True when path names a prepared dataset (<path>.idx exists, or it ends in .idx / .bin).
  static bool is_prepared(const std::string& path);

 private:
  int64_t token(int64_t i) const { return prepared_ ? prepared_->token_at(i) : bytes_[static_cast<size_t>(i)]; }
  std::vector<uint8_t> bytes_;
  std::unique_ptr<smp::sdk::IndexedDataset> prepared_;
  int64_t size_ = 0, split_ = 0;
  int64_t seq_len_;
  uint64_t seed_;
  int64_t vocab_;
};

}  // namespace gpt
