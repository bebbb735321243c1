#include "text_dataset.h"

#include <smp/sdk/text_files.hpp>

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

TextDataset::TextDataset(const std::string& path, double val_fraction, int64_t seq_len, uint64_t seed)
    : seq_len_(seq_len), seed_(seed) {
  for (const auto& f : smp::sdk::read_text_files(path)) bytes_.insert(bytes_.end(), f.bytes.begin(), f.bytes.end());
  if (val_fraction < 0 || val_fraction >= 1)
    throw smp::sdk::Error("model.val_fraction: expected a number in [0, 1), got " + std::to_string(val_fraction));
  split_ = static_cast<int64_t>(static_cast<double>(bytes_.size()) * (1.0 - val_fraction));
  const int64_t need = seq_len + 2;
  if (split_ < need || (val_fraction > 0 && val_bytes() < need))
    throw smp::sdk::Error("model.data: " + path + " has " + std::to_string(bytes_.size()) +
                          " bytes, too few for model.seq_len = " + std::to_string(seq_len) + " in both splits");
}

void TextDataset::fill(bool validation, int64_t step, int64_t first, int64_t count, int64_t* tokens,
                       int64_t* targets) const {
  const int64_t begin = validation ? split_ : 0;
  const int64_t end = validation ? static_cast<int64_t>(bytes_.size()) : split_;
  const uint64_t range = static_cast<uint64_t>(end - begin - seq_len_ - 1);
  for (int64_t i = 0; i < count; ++i) {
    uint64_t h = splitmix(seed_ ^ splitmix((validation ? 0x5eedULL : 0ULL) ^ splitmix(static_cast<uint64_t>(step) * 1000003ULL +
                                                                                        static_cast<uint64_t>(first + i))));
    int64_t off = begin + static_cast<int64_t>(h % (range + 1));
    for (int64_t t = 0; t < seq_len_; ++t) {
      tokens[i * seq_len_ + t] = bytes_[off + t];
      targets[i * seq_len_ + t] = bytes_[off + t + 1];
    }
  }
}

double TextDataset::unigram_entropy() const {
  std::vector<double> counts(256, 0);
  for (int64_t i = 0; i < split_; ++i) counts[bytes_[i]] += 1;
  double h = 0;
  for (double c : counts)
    if (c > 0) {
      double p = c / static_cast<double>(split_);
      h -= p * std::log(p);
    }
  return h;
}

}  // namespace gpt
