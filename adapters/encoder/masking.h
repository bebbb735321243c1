// BERT's masked-LM corruption, shared by BERT and RoBERTa: a fixed share of the
// real (non-special) tokens is chosen; of those 80% become [MASK], 10% a random
// data token, 10% stay. Everything is drawn from one key, so the same key masks the
// same tokens whatever the parallel layout.
#pragma once

#include "corpus.h"

#include <cstdint>
#include <vector>

namespace encoder {

// Chooses max(1, round(prob x candidates)) of the positions whose token is a
// data token (< vocab.data), corrupts them in `tokens` and writes their
// original ids to `targets` (which the caller fills with -100 first). Returns how many.
int64_t mask_tokens(std::vector<int64_t>& tokens, std::vector<int64_t>& targets, double prob, uint64_t key,
                    const Vocab& vocab);

}  // namespace encoder
