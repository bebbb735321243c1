#include "pair_data.h"

#include "masking.h"

#include <algorithm>
#include <tuple>

namespace encoder {

PairSample make_pair_sample(const SentenceCorpus& corpus, bool validation, int64_t seq_len, double mask_prob,
                            uint64_t key) {
  const auto& sents = corpus.sentences(validation);
  const int64_t N = static_cast<int64_t>(sents.size()), budget = seq_len - 3;
  Rng rng(key);
  const Vocab& v = corpus.vocab();
  const int64_t line_break = corpus.line_break();
  // A run of lines of one document from `first`, until `limit` tokens.
  auto run_from = [&](int64_t first, int64_t limit) {
    std::vector<int64_t> lines{first};
    int64_t len = sents[first].length;
    for (int64_t j = first + 1; j < N && sents[j].doc == sents[first].doc && len < limit; ++j)
      lines.push_back(j), len += sents[j].length + (line_break >= 0 ? 1 : 0);
    return lines;
  };
  const int64_t a = static_cast<int64_t>(rng.below(static_cast<uint64_t>(N)));
  const std::vector<int64_t> chunk = run_from(a, budget);
  const size_t k = chunk.size() >= 2 ? 1 + static_cast<size_t>(rng.below(chunk.size() - 1)) : 1;
  PairSample s;
  s.random_next = (chunk.size() < 2 || rng.below(2) == 0) ? 1 : 0;
  s.lines_a.assign(chunk.begin(), chunk.begin() + static_cast<std::ptrdiff_t>(k));
  if (s.random_next) {
    // From another document when there is one (10 tries), as BERT does.
    int64_t b = static_cast<int64_t>(rng.below(static_cast<uint64_t>(N)));
    for (int t = 0; t < 10 && sents[b].doc == sents[a].doc; ++t) b = static_cast<int64_t>(rng.below(static_cast<uint64_t>(N)));
    s.lines_b = run_from(b, budget);
  } else {
    s.lines_b.assign(chunk.begin() + static_cast<std::ptrdiff_t>(k), chunk.end());
  }
  auto text = [&](const std::vector<int64_t>& lines) {  // lines joined by the line break, if any
    std::vector<int64_t> out;
    for (int64_t j : lines) {
      if (!out.empty() && line_break >= 0) out.push_back(line_break);
      for (int64_t c = 0; c < sents[j].length; ++c) out.push_back(corpus.token(sents[j], c));
    }
    return out;
  };
  std::vector<int64_t> ta = text(s.lines_a), tb = text(s.lines_b);
  // Truncate the longer side from its end until the pair fits (both keep >= 1 token).
  while (static_cast<int64_t>(ta.size() + tb.size()) > budget) (ta.size() > tb.size() ? ta : tb).pop_back();
  s.tokens.reserve(static_cast<size_t>(seq_len));
  s.tokens.push_back(v.cls());
  s.tokens.insert(s.tokens.end(), ta.begin(), ta.end());
  s.tokens.push_back(v.sep());
  s.b_start = static_cast<int64_t>(s.tokens.size());
  s.tokens.insert(s.tokens.end(), tb.begin(), tb.end());
  s.tokens.push_back(v.sep());
  s.real = static_cast<int64_t>(s.tokens.size());
  s.segments.assign(static_cast<size_t>(seq_len), 0);
  std::fill(s.segments.begin() + s.b_start, s.segments.begin() + s.real, 1);
  s.tokens.resize(static_cast<size_t>(seq_len), v.pad());
  s.targets.assign(static_cast<size_t>(seq_len), -100);
  s.masked = mask_tokens(s.tokens, s.targets, mask_prob, rng.next(), v);
  return s;
}

PairSample PairData::sample(bool validation, int64_t step, int64_t index) const {
  return make_pair_sample(corpus_, validation, seq_len_, mask_prob_,
                          mix_key({seed_, validation ? 2u : 1u, static_cast<uint64_t>(step), static_cast<uint64_t>(index)}));
}

int64_t PairData::masked_in_step(bool validation, int64_t step, int64_t global_batch) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto key = std::make_tuple(validation, step, global_batch);
  auto it = masked_.find(key);
  if (it != masked_.end()) return it->second;
  int64_t m = 0;
  for (int64_t i = 0; i < global_batch; ++i) m += sample(validation, step, i).masked;
  if (masked_.size() > 64) masked_.clear();  // steps move on; keep the cache small
  return masked_[key] = m;
}

}  // namespace encoder
