// Text as sentences for the encoder adapters (BERT, RoBERTa): the vocabulary,
// and the corpus as sentences that remember their document, with a training /
// validation split. Raw text: a line a sentence and a file a document, the
// bytes as ids or (model.tokenizer) the tokenizer's; or a prepared dataset
// (smp-data prepare --split-sentences): a sequence a sentence, documents from
// its index, memory-mapped.
#pragma once

#include <smp/data/indexed_dataset.hpp>
#include <smp/data/tokenizer.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace encoder {

// The byte vocabulary's size with its four special tokens (the small presets').
constexpr int64_t kByteVocab = 260;

// The data's ids are [0, data) (bytes: 256; else the tokenizer's vocabulary,
// or a prepared dataset's largest id + 1), then four special tokens. model.vocab
// may be larger (a preset's size, for planning); it is padded like every
// vocabulary (smp::sdk::padded_vocab) and the ids past these never occur.
struct Vocab {
  int64_t data = 256;
  int64_t pad() const { return data; }
  int64_t cls() const { return data + 1; }
  int64_t sep() const { return data + 2; }
  int64_t mask() const { return data + 3; }
  int64_t size() const { return data + 4; }
};

struct Sentence {
  int64_t offset = 0, length = 0;  // tokens of the corpus (raw text: without the line break)
  int64_t doc = 0;                 // the document (file) it came from
};

class SentenceCorpus {
 public:
  // Raw text (a file or folder, smp::sdk::read_text_files): lines with only
  // white space are skipped; the last val_fraction of the sentences (by
  // tokens) is the validation split. Prepared: the last val_fraction of the
  // documents. Each split needs at least two sentences. tokenizer: raw text's
  // (null: bytes), or the vocabulary of prepared ids (null: their largest + 1).
  SentenceCorpus(const std::string& path, double val_fraction, const smp::sdk::Tokenizer* tokenizer = nullptr);

  const std::vector<Sentence>& sentences(bool validation) const { return validation ? val_ : train_; }
  int64_t token(const Sentence& s, int64_t i) const {
    const int64_t j = s.offset + i;
    if (prepared_) return prepared_->token_at(j);
    return ids_.empty() ? static_cast<unsigned char>(text_[static_cast<size_t>(j)]) : ids_[static_cast<size_t>(j)];
  }
  // What joins two lines of a document: '\n' for bytes, nothing (-1) for tokens.
  int64_t line_break() const { return prepared_ || !ids_.empty() ? -1 : '\n'; }
  const Vocab& vocab() const { return vocab_; }
  int64_t tokens_in(bool validation) const;
  // Entropy (nats) of the training sentences' tokens: the masked-token loss of
  // a model that ignores the context.
  double unigram_entropy() const;
  std::string describe(const std::string& path) const;  // for the log

 private:
  void read_text(const std::string& path, const smp::sdk::Tokenizer* tokenizer, std::vector<Sentence>& all);
  void read_prepared(const std::string& path, const smp::sdk::Tokenizer* tokenizer, double val_fraction);
  std::string text_;
  std::vector<int32_t> ids_;  // raw text tokenized
  std::unique_ptr<smp::sdk::IndexedDataset> prepared_;
  std::vector<Sentence> train_, val_;
  Vocab vocab_;
  std::string unit_ = "bytes";
};

// SplitMix64 as a stream (the standard generator over the SDK's mixer).
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t next();
  uint64_t below(uint64_t n) { return next() % n; }  // n > 0
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)

 private:
  uint64_t state_;
};

// A key from several integers (seed, split, step, sample...), order-sensitive.
uint64_t mix_key(std::initializer_list<uint64_t> parts);

}  // namespace encoder
