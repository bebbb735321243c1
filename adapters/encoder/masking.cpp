#include "masking.h"

#include "corpus.h"

#include <cmath>
#include <utility>

namespace encoder {

int64_t mask_tokens(std::vector<int64_t>& tokens, std::vector<int64_t>& targets, double prob, uint64_t key,
                    const Vocab& vocab) {
  std::vector<int64_t> candidates;
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] < vocab.data) candidates.push_back(static_cast<int64_t>(i));
  if (candidates.empty()) return 0;
  const int64_t n = static_cast<int64_t>(candidates.size());
  const int64_t count = std::min<int64_t>(n, std::max<int64_t>(1, std::llround(prob * static_cast<double>(n))));
  Rng rng(key);
  for (int64_t i = 0; i < count; ++i) {  // a partial Fisher-Yates shuffle picks `count` distinct positions
    std::swap(candidates[i], candidates[i + static_cast<int64_t>(rng.below(static_cast<uint64_t>(n - i)))]);
    const int64_t pos = candidates[i];
    targets[pos] = tokens[pos];
    const double r = rng.uniform();
    if (r < 0.8) tokens[pos] = vocab.mask();
    else if (r < 0.9) tokens[pos] = static_cast<int64_t>(rng.below(static_cast<uint64_t>(vocab.data)));
  }
  return count;
}

}  // namespace encoder
