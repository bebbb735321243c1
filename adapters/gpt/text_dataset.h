// Byte-level language-model data from text files: deterministic samples per
// (split, step, global sample index), whatever the parallel layout.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gpt {

class TextDataset {
 public:
  // path: a file, or a folder whose regular files are read in name order.
  // The last val_fraction of the bytes is the validation split.
  TextDataset(const std::string& path, double val_fraction, int64_t seq_len, uint64_t seed);

  // Fills tokens[i*seq_len ..] and targets (shifted by one) for samples
  // [first, first+count) of the given step's global batch.
  void fill(bool validation, int64_t step, int64_t first, int64_t count, int64_t* tokens, int64_t* targets) const;

  int64_t train_bytes() const { return split_; }
  int64_t val_bytes() const { return static_cast<int64_t>(bytes_.size()) - split_; }
  // Unigram entropy of the training bytes (nats): the loss a model without context reaches.
  double unigram_entropy() const;

 private:
  std::vector<uint8_t> bytes_;
  int64_t split_ = 0;
  int64_t seq_len_;
  uint64_t seed_;
};

}  // namespace gpt
