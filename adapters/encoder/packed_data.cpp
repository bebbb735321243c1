#include "packed_data.h"

#include "masking.h"

#include <algorithm>

namespace encoder {

std::vector<std::vector<int32_t>> pack_full_sentences(const SentenceCorpus& corpus, bool validation, int64_t content) {
  const size_t budget = static_cast<size_t>(content);
  const int64_t line_break = corpus.line_break();
  std::vector<std::vector<int32_t>> out;
  std::vector<int32_t> cur;
  int64_t doc = -1;
  for (const auto& s : corpus.sentences(validation)) {
    std::vector<int32_t> line;
    const bool new_doc = s.doc != doc;
    doc = s.doc;
    const int64_t separator = new_doc ? corpus.vocab().sep() : line_break;
    if (!cur.empty() && separator >= 0) line.push_back(static_cast<int32_t>(separator));
    for (int64_t c = 0; c < s.length; ++c) line.push_back(static_cast<int32_t>(corpus.token(s, c)));
    if (!cur.empty() && cur.size() + line.size() > budget) {  // the line starts the next sequence
      out.push_back(std::move(cur));
      cur.clear();
      if (separator >= 0) line.erase(line.begin());  // no separator at a sequence's start
    }
    for (size_t c = 0; c < line.size(); c += budget) {  // a line longer than a sequence is cut
      const size_t e = std::min(line.size(), c + budget);
      cur.insert(cur.end(), line.begin() + static_cast<std::ptrdiff_t>(c), line.begin() + static_cast<std::ptrdiff_t>(e));
      if (cur.size() == budget) out.push_back(std::move(cur)), cur.clear();
    }
  }
  if (!cur.empty()) out.push_back(std::move(cur));
  return out;
}

PackedData::PackedData(const SentenceCorpus& corpus, int64_t seq_len, double mask_prob, uint64_t seed)
    : seq_len_(seq_len), mask_prob_(mask_prob), seed_(seed), vocab_(corpus.vocab()) {
  for (bool val : {false, true}) packed_[val ? 1 : 0] = pack_full_sentences(corpus, val, seq_len - 2);
}

int64_t PackedData::sample(bool validation, int64_t g, std::vector<int64_t>& tokens, std::vector<int64_t>& targets) {
  const auto& seqs = packed_[validation ? 1 : 0];
  const int64_t N = static_cast<int64_t>(seqs.size());
  int64_t index = g % N;
  uint64_t key = mix_key({seed_, 2u, static_cast<uint64_t>(index)});  // validation: the same mask every time
  if (!validation) {
    const int64_t epoch = g / N;
    index = order(epoch)[static_cast<size_t>(g % N)];
    key = mix_key({seed_, 1u, static_cast<uint64_t>(epoch), static_cast<uint64_t>(index)});
  }
  tokens.assign(1, vocab_.cls());
  tokens.insert(tokens.end(), seqs[index].begin(), seqs[index].end());
  tokens.push_back(vocab_.sep());
  tokens.resize(static_cast<size_t>(seq_len_), vocab_.pad());
  targets.assign(static_cast<size_t>(seq_len_), -100);
  mask_tokens(tokens, targets, mask_prob_, key, vocab_);
  return index;
}

// The visiting order of the training sequences in an epoch (a seeded shuffle).
// A step's samples span at most two epochs, so the last two are kept.
const std::vector<int64_t>& PackedData::order(int64_t epoch) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [e, o] : orders_)
    if (e == epoch) return o;
  std::vector<int64_t> o(packed_[0].size());
  for (size_t i = 0; i < o.size(); ++i) o[i] = static_cast<int64_t>(i);
  Rng rng(mix_key({seed_, 3u, static_cast<uint64_t>(epoch)}));
  for (size_t i = o.size(); i > 1; --i) std::swap(o[i - 1], o[rng.below(i)]);
  auto& slot = orders_[next_slot_];
  next_slot_ ^= 1;
  slot = {epoch, std::move(o)};
  return slot.second;
}

}  // namespace encoder
