#include "corpus.h"

#include <smp/sdk/init.hpp>
#include <smp/data/text_files.hpp>

#include <algorithm>
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

SentenceCorpus::SentenceCorpus(const std::string& path, double val_fraction, const smp::sdk::Tokenizer* tokenizer) {
  if (val_fraction <= 0 || val_fraction >= 1)
    throw smp::sdk::Error("model.val_fraction: expected a number in (0, 1), got " + std::to_string(val_fraction));
  if (smp::sdk::is_indexed_dataset(path)) {
    read_prepared(path, tokenizer, val_fraction);
  } else {
    std::vector<Sentence> all;
    read_text(path, tokenizer, all);
    int64_t total = 0;
    for (const auto& s : all) total += s.length;
    // The split falls between sentences, at (1 - val_fraction) of the tokens.
    const double cut = static_cast<double>(total) * (1.0 - val_fraction);
    int64_t seen = 0;
    for (const auto& s : all) {
      (static_cast<double>(seen) < cut ? train_ : val_).push_back(s);
      seen += s.length;
    }
  }
  if (train_.size() < 2 || val_.size() < 2)
    throw smp::sdk::Error("model.data: " + path + " has " + std::to_string(train_.size() + val_.size()) +
                          (prepared_ ? " sequences (sentences)" : " non-blank lines") + "; model.val_fraction = " +
                          std::to_string(val_fraction) +
                          " leaves fewer than 2 in a split (the encoders read one sentence per line, or per "
                          "sequence of a dataset prepared with --split-sentences)");
}

void SentenceCorpus::read_text(const std::string& path, const smp::sdk::Tokenizer* tokenizer,
                               std::vector<Sentence>& all) {
  if (tokenizer) vocab_.data = tokenizer->vocab(), unit_ = "tokens";
  int64_t doc = 0;
  for (const auto& file : smp::sdk::read_text_files(path)) {
    const int64_t base = static_cast<int64_t>(text_.size());
    if (!tokenizer) text_ += file.bytes;
    int64_t start = 0;
    const int64_t n = static_cast<int64_t>(file.bytes.size());
    for (int64_t i = 0; i <= n; ++i) {
      if (i < n && file.bytes[i] != '\n') continue;
      int64_t end = i;
      if (end > start && file.bytes[end - 1] == '\r') --end;
      bool blank = true;
      for (int64_t j = start; j < end && blank; ++j) blank = std::isspace(static_cast<unsigned char>(file.bytes[j]));
      if (!blank && !tokenizer) all.push_back({base + start, end - start, doc});
      if (!blank && tokenizer) {
        const auto ids = tokenizer->encode(std::string_view(file.bytes).substr(start, end - start));
        if (!ids.empty()) all.push_back({static_cast<int64_t>(ids_.size()), static_cast<int64_t>(ids.size()), doc});
        for (const int64_t id : ids) ids_.push_back(static_cast<int32_t>(id));
      }
      start = i + 1;
    }
    ++doc;
  }
}

void SentenceCorpus::read_prepared(const std::string& path, const smp::sdk::Tokenizer* tokenizer, double val_fraction) {
  prepared_ = smp::sdk::open_model_dataset(path, tokenizer ? tokenizer->vocab() : 0, tokenizer ? tokenizer->name() : "");
  const auto& d = *prepared_;
  unit_ = "tokens";
  int64_t largest = -1;
  for (int64_t i = 0; i < d.total_tokens(); ++i) largest = std::max(largest, d.token_at(i));
  vocab_.data = tokenizer ? tokenizer->vocab() : largest + 1;
  if (largest >= vocab_.data)
    throw smp::sdk::Error("model.data: " + d.bin_path() + ": token " + std::to_string(largest) +
                          " is outside the vocabulary of " + tokenizer->name() + " (" + std::to_string(vocab_.data) +
                          ")");
  const int64_t elem = smp::sdk::token_bytes(d.type());
  const int64_t docs = d.documents();
  const int64_t first_val = smp::sdk::first_validation_document(docs, val_fraction);
  for (int64_t doc = 0; doc < docs; ++doc)
    for (int64_t q = d.document_start(doc); q < d.document_start(doc + 1); ++q)
      if (d.length(q) > 0) (doc < first_val ? train_ : val_).push_back({d.offset(q) / elem, d.length(q), doc});
}

int64_t SentenceCorpus::tokens_in(bool validation) const {
  int64_t n = 0;
  for (const auto& s : sentences(validation)) n += s.length;
  return n;
}

double SentenceCorpus::unigram_entropy() const {
  std::vector<double> counts(static_cast<size_t>(vocab_.data), 0);
  double n = 0;
  for (const auto& s : train_)
    for (int64_t i = 0; i < s.length; ++i) counts[static_cast<size_t>(token(s, i))] += 1, n += 1;
  double h = 0;
  for (double c : counts)
    if (c > 0) h -= c / n * std::log(c / n);
  return h;
}

std::string SentenceCorpus::describe(const std::string& path) const {
  return "data " + path + (prepared_ ? " (prepared)" : "") + ": " + std::to_string(train_.size()) + " train / " +
         std::to_string(val_.size()) + " validation sentences, " + std::to_string(tokens_in(false)) + " train " +
         unit_ + " (vocabulary " + std::to_string(vocab_.data) + " + 4 special), unigram entropy " +
         std::to_string(unigram_entropy()) + " nats";
}

}  // namespace encoder
