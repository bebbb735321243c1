#include "corpus.h"

#include <smp/sdk/init.hpp>
#include <smp/sdk/text_files.hpp>

#include <cctype>
#include <cmath>

namespace encoder {

uint64_t Rng::next() {
  const uint64_t r = smp::sdk::detail::splitmix64(state_);
  state_ += 0x9E3779B97F4A7C15ull;
  return r;
}

uint64_t mix_key(std::initializer_list<uint64_t> parts) {
  uint64_t k = 0x243F6A8885A308D3ull;
  for (uint64_t p : parts) k = smp::sdk::detail::splitmix64(k ^ p);
  return k;
}

SentenceCorpus::SentenceCorpus(const std::string& path, double val_fraction) {
  if (val_fraction <= 0 || val_fraction >= 1)
    throw smp::sdk::Error("model.val_fraction: expected a number in (0, 1), got " + std::to_string(val_fraction));
  std::vector<Sentence> all;
  int64_t doc = 0, total = 0;
  for (const auto& file : smp::sdk::read_text_files(path)) {
    const int64_t base = static_cast<int64_t>(text_.size());
    text_ += file.bytes;
    int64_t start = 0;
    const int64_t n = static_cast<int64_t>(file.bytes.size());
    for (int64_t i = 0; i <= n; ++i) {
      if (i < n && file.bytes[i] != '\n') continue;
      int64_t end = i;
      if (end > start && file.bytes[end - 1] == '\r') --end;
      bool blank = true;
      for (int64_t j = start; j < end && blank; ++j) blank = std::isspace(static_cast<unsigned char>(file.bytes[j]));
      if (!blank) {
        all.push_back({base + start, end - start, doc});
        total += end - start;
      }
      start = i + 1;
    }
    ++doc;
  }
  // The split falls between sentences, at (1 - val_fraction) of the bytes.
  const double cut = static_cast<double>(total) * (1.0 - val_fraction);
  int64_t seen = 0;
  for (const auto& s : all) {
    (static_cast<double>(seen) < cut ? train_ : val_).push_back(s);
    seen += s.length;
  }
  if (train_.size() < 2 || val_.size() < 2)
    throw smp::sdk::Error("model.data: " + path + " has " + std::to_string(all.size()) +
                          " non-blank lines; model.val_fraction = " + std::to_string(val_fraction) +
                          " leaves fewer than 2 in a split (the encoders read one sentence per line)");
}

int64_t SentenceCorpus::bytes_in(bool validation) const {
  int64_t n = 0;
  for (const auto& s : sentences(validation)) n += s.length;
  return n;
}

double SentenceCorpus::unigram_entropy() const {
  std::vector<double> counts(256, 0);
  double n = 0;
  for (const auto& s : train_)
    for (int64_t i = 0; i < s.length; ++i) counts[static_cast<unsigned char>(text_[s.offset + i])] += 1, n += 1;
  double h = 0;
  for (double c : counts)
    if (c > 0) h -= c / n * std::log(c / n);
  return h;
}

}  // namespace encoder
