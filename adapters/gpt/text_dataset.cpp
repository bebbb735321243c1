#include "text_dataset.h"

#include <smp/data/text_files.hpp>

#include <algorithm>
#include <cmath>

namespace gpt {

bool TextDataset::is_prepared(const std::string& path) { return smp::sdk::is_indexed_dataset(path); }

TextDataset::TextDataset(const std::string& path, double val_fraction, int64_t seq_len, uint64_t seed, int64_t vocab,
                         const smp::sdk::Tokenizer* tokenizer, const std::string& cache_path)
    : path_(path), seq_len_(seq_len), seed_(seed), vocab_(vocab) {
  if (val_fraction < 0 || val_fraction >= 1)
    throw smp::sdk::Error("model.val_fraction: expected a number in [0, 1), got " + std::to_string(val_fraction));
  const int64_t need = seq_len + 2;
  if (is_prepared(path)) {
    prepared_ = smp::sdk::open_model_dataset(path, tokenizer ? tokenizer->vocab() : 0, tokenizer ? tokenizer->name() : "");
    const auto& d = *prepared_;
    size_ = d.total_tokens();
    // Split by documents: the validation split starts at a document's first token.
    const int64_t docs = d.documents();
    const int64_t first_val = smp::sdk::first_validation_document(docs, val_fraction);
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
    cache_folder_ = cache_path.empty() ? d.prefix() + ".smp-index" : cache_path;
    cache_key_ = epoch_cache_key(d, seed_, seq_len_, first_val);
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
  if (tokenizer) tokenizer_name_ = tokenizer->name();
  for (const auto& f : smp::sdk::read_text_files(path)) {
    if (!tokenizer) {
      bytes_.insert(bytes_.end(), f.bytes.begin(), f.bytes.end());
      continue;
    }
    for (const int64_t id : tokenizer->encode(f.bytes)) text_tokens_.push_back(static_cast<int32_t>(id));
    text_tokens_.push_back(static_cast<int32_t>(tokenizer->eod()));
  }
  size_ = tokenizer ? static_cast<int64_t>(text_tokens_.size()) : static_cast<int64_t>(bytes_.size());
  split_ = static_cast<int64_t>(static_cast<double>(size_) * (1.0 - val_fraction));
  if (split_ < need || (val_fraction > 0 && val_tokens() < need))
    throw smp::sdk::Error("model.data: " + path + " has " + std::to_string(size_) + (tokenizer ? " tokens" : " bytes") +
                          ", too few for model.seq_len = " + std::to_string(seq_len) + " in both splits");
}

const TextDataset::Epoch& TextDataset::epoch(int64_t e) const {
  if (epoch_.index == e) return epoch_;
  const uint64_t key = splitmix(seed_ ^ splitmix(0xd0c5ULL + static_cast<uint64_t>(e)));
  Epoch ep;
  ep.index = e;
  ep.ix = EpochIndex::cached(cache_folder_, cache_key_, e, doc_len_, samples_per_epoch_, key);
  epoch_ = std::move(ep);
  return epoch_;
}

int64_t TextDataset::stream_token(const Epoch& ep, int64_t p) const {
  const int64_t* ends = ep.ix->ends();
  const size_t j = static_cast<size_t>(std::upper_bound(ends, ends + ep.ix->documents(), p) - ends);
  const int64_t before = j ? ends[j - 1] : 0;
  return token(doc_begin_[static_cast<size_t>(ep.ix->docs()[j])] + (p - before));
}

void TextDataset::sample(bool validation, int64_t g, int64_t* tk, int64_t* tg) const {
  if (validation) {  // the validation split in order, window after window
    const int64_t windows = (val_tokens() - 1) / seq_len_;
    const int64_t start = split_ + (g % windows) * seq_len_;
    for (int64_t t = 0; t < seq_len_; ++t) tk[t] = token(start + t), tg[t] = token(start + t + 1);
    return;
  }
  std::lock_guard<std::mutex> lock(epoch_mutex_);
  const Epoch& ep = epoch(g / samples_per_epoch_);
  const int64_t start = ep.ix->windows()[g % samples_per_epoch_] * seq_len_;
  for (int64_t t = 0; t < seq_len_; ++t) tk[t] = stream_token(ep, start + t), tg[t] = stream_token(ep, start + t + 1);
}

std::pair<int64_t, int64_t> TextDataset::sample_of(int64_t g) const {
  std::lock_guard<std::mutex> lock(epoch_mutex_);
  const Epoch& ep = epoch(g / samples_per_epoch_);
  return {ep.index, ep.ix->windows()[g % samples_per_epoch_]};
}

void TextDataset::fill(bool validation, int64_t step, int64_t global_batch, int64_t first, int64_t count,
                       int64_t* tokens, int64_t* targets) const {
  if (prepared_) {
    for (int64_t i = 0; i < count; ++i)
      sample(validation, step * global_batch + first + i, tokens + i * seq_len_, targets + i * seq_len_);
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
  const char* unit = prepared_ || !text_tokens_.empty() ? " tokens" : " bytes";
  return "data " + path + (prepared_ ? " (prepared, " + std::to_string(prepared_->documents()) + " documents)" : "") +
         (text_tokens_.empty() ? "" : " (tokenized by " + tokenizer_name_ + ")") +
         ": " + std::to_string(train_tokens()) + " train / " + std::to_string(val_tokens()) + " validation" + unit +
         ", unigram entropy " + std::to_string(unigram_entropy()) + " nats";
}

namespace {

// Megatron's BlendedDataset: sample i goes to the dataset furthest below its
// share (weight x (i + 1) - taken so far; the first on ties), and is that
// dataset's next sample. A function of the index alone, so every layout and
// a resumed run draw the same.
class BlendedDataset : public LmData {
 public:
  BlendedDataset(std::vector<std::unique_ptr<TextDataset>> parts, std::vector<double> weights,
                 std::vector<std::string> paths)
      : parts_(std::move(parts)), weights_(std::move(weights)), paths_(std::move(paths)) {}
  void fill(bool validation, int64_t step, int64_t global_batch, int64_t first, int64_t count, int64_t* tokens,
            int64_t* targets) const override {
    const int64_t seq = seq_len();
    for (int64_t i = 0; i < count; ++i) {
      const auto [d, k] = pick(validation, step * global_batch + first + i);
      parts_[static_cast<size_t>(d)]->sample(validation, k, tokens + i * seq, targets + i * seq);
    }
  }
  std::string describe() const override {
    std::string out = "blending " + std::to_string(parts_.size()) + " datasets:";
    for (size_t j = 0; j < parts_.size(); ++j)
      out += "\n  weight " + std::to_string(weights_[j]) + ": " + parts_[j]->describe(paths_[j]);
    return out;
  }
  // Which dataset sample g of a split comes from, and its index there.
  std::pair<int64_t, int64_t> pick(bool validation, int64_t g) const {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& t = table_[validation ? 1 : 0];
    while (static_cast<int64_t>(t.which.size()) <= g) {
      const double i = static_cast<double>(t.which.size());
      size_t best = 0;
      double best_error = -1e300;
      for (size_t j = 0; j < weights_.size(); ++j) {
        const double error = weights_[j] * (i + 1) - static_cast<double>(t.taken[j]);
        if (error > best_error) best = j, best_error = error;
      }
      t.which.push_back(static_cast<int32_t>(best));
      t.index.push_back(t.taken[best]++);
    }
    return {t.which[static_cast<size_t>(g)], t.index[static_cast<size_t>(g)]};
  }

 private:
  int64_t seq_len() const { return parts_.front()->seq_len(); }
  struct Table {
    std::vector<int32_t> which;
    std::vector<int64_t> index, taken;
  };
  std::vector<std::unique_ptr<TextDataset>> parts_;
  std::vector<double> weights_;
  std::vector<std::string> paths_;
  mutable std::mutex mutex_;
  mutable Table table_[2] = {{{}, {}, std::vector<int64_t>(weights_.size(), 0)},
                             {{}, {}, std::vector<int64_t>(weights_.size(), 0)}};
};

}  // namespace

std::unique_ptr<LmData> open_lm_data(const nlohmann::json& data, double val_fraction, int64_t seq_len, uint64_t seed,
                                     int64_t vocab, const smp::sdk::Tokenizer* tokenizer, const std::string& cache_path) {
  if (data.is_string())
    return std::make_unique<TextDataset>(data.get<std::string>(), val_fraction, seq_len, seed, vocab, tokenizer,
                                         cache_path);
  if (!data.is_array() || data.empty())
    throw smp::sdk::Error("model.data: expected a path or an array of { path = \"...\", weight = w } tables, got " +
                          data.dump());
  std::vector<std::unique_ptr<TextDataset>> parts;
  std::vector<double> weights;
  std::vector<std::string> paths;
  double total = 0;
  for (size_t j = 0; j < data.size(); ++j) {
    const auto& e = data[j];
    const std::string where = "model.data[" + std::to_string(j) + "]";
    if (!e.is_object() || !e.contains("path") || !e["path"].is_string() || !e.contains("weight") ||
        !e["weight"].is_number() || e["weight"].get<double>() <= 0 || e.size() != 2)
      throw smp::sdk::Error(where + ": expected { path = \"...\", weight = w > 0 } and nothing else, got " + e.dump());
    const std::string path = e["path"].get<std::string>();
    if (!TextDataset::is_prepared(path))
      throw smp::sdk::Error(where + ": blending needs prepared datasets; " + path +
                            " is not one (write it with smp-data prepare)");
    // Each part draws from a seed of its own: two copies of one dataset are two streams.
    parts.push_back(std::make_unique<TextDataset>(path, val_fraction, seq_len, splitmix(seed ^ (0xb1e7dULL + j)), vocab,
                                                  tokenizer, cache_path));
    weights.push_back(e["weight"].get<double>());
    paths.push_back(path);
    total += weights.back();
  }
  for (double& w : weights) w /= total;
  return std::make_unique<BlendedDataset>(std::move(parts), std::move(weights), std::move(paths));
}

}  // namespace gpt
