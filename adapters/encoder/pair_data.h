// BERT's training data: sentence pairs for masked-LM + next-sentence prediction.
// A sample is [CLS] A [SEP] B [SEP] [PAD]...: A is a run of consecutive lines of
// one document, B the lines that follow (label 0) or, half of the time, lines
// from a random place in another document (label 1). Where A starts, where it
// ends, B and the masked tokens are all drawn from one key per sample.
#pragma once

#include "corpus.h"

#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

namespace encoder {

struct PairSample {
  std::vector<int64_t> tokens, segments, targets;  // seq_len each; targets -100 where not predicted
  int64_t real = 0;         // tokens before the padding
  int64_t b_start = 0;      // the first token of B
  int64_t random_next = 0;  // the NSP label: 1 = B is not A's continuation
  int64_t masked = 0;       // how many targets are predicted
  std::vector<int64_t> lines_a, lines_b;  // the corpus lines A and B came from
};

PairSample make_pair_sample(const SentenceCorpus& corpus, bool validation, int64_t seq_len, double mask_prob,
                            uint64_t key);

// Samples by (split, step, global sample index), and the masked tokens of a
// step's whole global batch (what normalises the MLM loss), cached per step.
class PairData {
 public:
  PairData(const SentenceCorpus& corpus, int64_t seq_len, double mask_prob, uint64_t seed)
      : corpus_(corpus), seq_len_(seq_len), mask_prob_(mask_prob), seed_(seed) {}
  PairSample sample(bool validation, int64_t step, int64_t index) const;
  int64_t masked_in_step(bool validation, int64_t step, int64_t global_batch);

 private:
  const SentenceCorpus& corpus_;
  int64_t seq_len_;
  double mask_prob_;
  uint64_t seed_;
  std::mutex mu_;
  std::map<std::tuple<bool, int64_t, int64_t>, int64_t> masked_;
};

}  // namespace encoder
