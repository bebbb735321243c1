// RoBERTa's training data (Liu et al. 2019):
//   - FULL-SENTENCES packing: each sample is [CLS] + whole consecutive lines up
//     to the length + [SEP], crossing document boundaries with an extra [SEP]
//     between documents; a line longer than a sample is cut into pieces.
//   - Dynamic masking: training samples are visited epoch by epoch in an order
//     shuffled per epoch, and a sample's mask is drawn from (seed, epoch,
//     sample), so each epoch masks it anew. Validation masks stay fixed.
#pragma once

#include "corpus.h"

#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

namespace encoder {

// One split packed into sequences of at most `content` tokens (no [CLS]/[SEP] ends).
std::vector<std::vector<int32_t>> pack_full_sentences(const SentenceCorpus& corpus, bool validation, int64_t content);

class PackedData {
 public:
  PackedData(const SentenceCorpus& corpus, int64_t seq_len, double mask_prob, uint64_t seed);

  const Vocab& vocab() const { return vocab_; }
  int64_t sequences(bool validation) const { return static_cast<int64_t>(packed_[validation ? 1 : 0].size()); }
  // Global sample g of a split (step x global batch + index): seq_len tokens
  // and MLM targets (-100 where not predicted). Returns the packed sequence's index.
  int64_t sample(bool validation, int64_t g, std::vector<int64_t>& tokens, std::vector<int64_t>& targets);

 private:
  const std::vector<int64_t>& order(int64_t epoch);

  int64_t seq_len_;
  double mask_prob_;
  uint64_t seed_;
  Vocab vocab_;
  std::vector<std::vector<int32_t>> packed_[2];  // train, validation
  std::mutex mu_;
  std::pair<int64_t, std::vector<int64_t>> orders_[2] = {{-1, {}}, {-1, {}}};  // the last two epochs
  int next_slot_ = 0;
};

}  // namespace encoder
