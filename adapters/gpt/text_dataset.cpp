#include "text_dataset.h"

#include <smp/sdk/text_files.hpp>

#include <sys/stat.h>

#include <algorithm>
#include <cmath>

namespace gpt {

namespace {

uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

bool TextDataset::is_prepared(const std::string& path) {
  auto ends = [&](const char* ext) { return path.size() > 4 && path.compare(path.size() - 4, 4, ext) == 0; };
  struct stat st {};
  return ends(".idx") || ends(".bin") || ::stat((path + ".idx").c_str(), &st) == 0;
}

TextDataset::TextDataset(const std::string& path, double val_fraction, int64_t seq_len, uint64_t seed, int64_t vocab)
    : seq_len_(seq_len), seed_(seed), vocab_(vocab) {
  if (val_fraction < 0 || val_fraction >= 1)
    throw smp::sdk::Error("model.val_fraction: expected a number in [0, 1), got " + std::to_string(val_fraction));
  const int64_t need = seq_len + 2;
  if (is_prepared(path)) {
    try {
      prepared_ = std::make_unique<smp::sdk::IndexedDataset>(path);
    } catch (const smp::sdk::Error& e) {
      throw smp::sdk::Error(std::string("model.data: ") + e.what());
    }
    const auto& d = *prepared_;
    size_ = d.total_tokens();
    // Split by documents: the validation split starts at a document's first token.
    const int64_t docs = d.documents();
    const int64_t first_val = std::min(docs, static_cast<int64_t>(std::ceil(static_cast<double>(docs) * (1.0 - val_fraction))));
    const int64_t seq = d.document_start(first_val);
    split_ = seq < d.sequences() ? d.offset(seq) / smp::sdk::token_bytes(d.type()) : size_;
    // The training documents' token ranges (a document's sequences lie back to back).
    const int64_t elem = smp::sdk::token_bytes(d.type());
    for (int64_t doc = 0; doc < first_val; ++doc) {
      const int64_t s0 = d.document_start(doc), s1 = d.document_start(doc + 1);
      int64_t len = 0;
      for (int64_t q = s0; q < s1; ++q) len += d.length(q);
      if (len == 0) continue;
      doc_begin_.push_back(d.offset(s0) / elem);
      doc_len_.push_back(len);
    }
    int64_t train_tokens = 0;
    for (int64_t len : doc_len_) train_tokens += len;
    samples_per_epoch_ = (train_tokens - 1) / seq_len;
    // Every id must be one of the model's: a scan of the mapped tokens (memory bandwidth).
    for (int64_t i = 0; i < size_; ++i)
      if (const int64_t v = token(i); v < 0 || v >= vocab_)
        throw smp::sdk::Error("model.data: " + d.bin_path() + ": token " + std::to_string(v) + " at token offset " +
                              std::to_string(i) + " is outside the model's vocabulary [0, " + std::to_string(vocab_) +
                              ") (model.vocab)");
    if (split_ < need || (val_fraction > 0 && val_tokens() < need))
      throw smp::sdk::Error("model.data: " + d.prefix() + " has " + std::to_string(docs) + " documents of " +
                            std::to_string(size_) + " tokens: " + std::to_string(split_) + " train / " +
                            std::to_string(val_tokens()) + " validation, too few for model.seq_len = " +
                            std::to_string(seq_len) + " in both splits (val_fraction " + std::to_string(val_fraction) + ")");
    return;
  }
  for (const auto& f : smp::sdk::read_text_files(path)) bytes_.insert(bytes_.end(), f.bytes.begin(), f.bytes.end());
  size_ = static_cast<int64_t>(bytes_.size());
  split_ = static_cast<int64_t>(static_cast<double>(bytes_.size()) * (1.0 - val_fraction));
  if (split_ < need || (val_fraction > 0 && val_tokens() < need))
    throw smp::sdk::Error("model.data: " + path + " has " + std::to_string(bytes_.size()) +
                          " bytes, too few for model.seq_len = " + std::to_string(seq_len) + " in both splits");
}

// A seeded permutation of [0, n) (Fisher-Yates over splitmix draws).
static std::vector<int64_t> permutation(int64_t n, uint64_t key) {
  std::vector<int64_t> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[static_cast<size_t>(i)] = i;
  for (int64_t i = n - 1; i > 0; --i) {
    key = splitmix(key);
    std::swap(p[static_cast<size_t>(i)], p[static_cast<size_t>(key % static_cast<uint64_t>(i + 1))]);
  }
  return p;
}

const TextDataset::Epoch& TextDataset::epoch(int64_t e) const {
  if (epoch_.index == e) return epoch_;
  Epoch ep;
  ep.index = e;
  const uint64_t key = splitmix(seed_ ^ splitmix(0xd0c5ULL + static_cast<uint64_t>(e)));
  ep.docs = permutation(static_cast<int64_t>(doc_len_.size()), key);
  int64_t end = 0;
  for (int64_t doc : ep.docs) ep.ends.push_back(end += doc_len_[static_cast<size_t>(doc)]);
  ep.samples = permutation(samples_per_epoch_, splitmix(key ^ 0x5a3b1e5ULL));
  epoch_ = std::move(ep);
  return epoch_;
}

int64_t TextDataset::stream_token(const Epoch& ep, int64_t p) const {
  const size_t j = static_cast<size_t>(std::upper_bound(ep.ends.begin(), ep.ends.end(), p) - ep.ends.begin());
  const int64_t before = j ? ep.ends[j - 1] : 0;
  return token(doc_begin_[static_cast<size_t>(ep.docs[j])] + (p - before));
}

std::pair<int64_t, int64_t> TextDataset::sample_of(int64_t g) const {
  std::lock_guard<std::mutex> lock(epoch_mutex_);
  const Epoch& ep = epoch(g / samples_per_epoch_);
  return {ep.index, ep.samples[static_cast<size_t>(g % samples_per_epoch_)]};
}

void TextDataset::fill(bool validation, int64_t step, int64_t global_batch, int64_t first, int64_t count,
                       int64_t* tokens, int64_t* targets) const {
  if (prepared_) {
    for (int64_t i = 0; i < count; ++i) {
      const int64_t g = step * global_batch + first + i;
      int64_t* tk = tokens + i * seq_len_;
      int64_t* tg = targets + i * seq_len_;
      if (validation) {  // the validation split in order, window after window
        const int64_t windows = (val_tokens() - 1) / seq_len_;
        const int64_t start = split_ + (g % windows) * seq_len_;
        for (int64_t t = 0; t < seq_len_; ++t) tk[t] = token(start + t), tg[t] = token(start + t + 1);
        continue;
      }
      std::lock_guard<std::mutex> lock(epoch_mutex_);
      const Epoch& ep = epoch(g / samples_per_epoch_);
      const int64_t start = ep.samples[static_cast<size_t>(g % samples_per_epoch_)] * seq_len_;
      for (int64_t t = 0; t < seq_len_; ++t) tk[t] = stream_token(ep, start + t), tg[t] = stream_token(ep, start + t + 1);
    }
    return;
  }
  const int64_t begin = validation ? split_ : 0;
  const int64_t end = validation ? size_ : split_;
  const uint64_t range = static_cast<uint64_t>(end - begin - seq_len_ - 1);
  for (int64_t i = 0; i < count; ++i) {
    uint64_t h = splitmix(seed_ ^ splitmix((validation ? 0x5eedULL : 0ULL) ^ splitmix(static_cast<uint64_t>(step) * 1000003ULL +
                                                                                        static_cast<uint64_t>(first + i))));
    int64_t off = begin + static_cast<int64_t>(h % (range + 1));
    for (int64_t t = 0; t < seq_len_; ++t) {
      tokens[i * seq_len_ + t] = token(off + t);
      targets[i * seq_len_ + t] = token(off + t + 1);
    }

  }
}

double TextDataset::unigram_entropy() const {
  std::vector<double> counts;
  for (int64_t i = 0; i < split_; ++i) {
    const int64_t v = token(i);
    if (v < 0) continue;
    if (static_cast<size_t>(v) >= counts.size()) counts.resize(static_cast<size_t>(v) + 1, 0.0);
    counts[static_cast<size_t>(v)] += 1;
  }
  double h = 0;
  for (double c : counts)
    if (c > 0) {
      double p = c / static_cast<double>(split_);
      h -= p * std::log(p);
    }
  return h;
}

std::string TextDataset::describe(const std::string& path) const {
  const char* unit = prepared_ ? " tokens" : " bytes";
  return "data " + path + (prepared_ ? " (prepared, " + std::to_string(prepared_->documents()) + " documents)" : "") +
         ": " + std::to_string(train_tokens()) + " train / " + std::to_string(val_tokens()) + " validation" + unit +
         ", unigram entropy " + std::to_string(unigram_entropy()) + " nats";
}

}  // namespace gpt
