// Text as sentences for the encoder adapters (BERT, RoBERTa): the byte-level
// vocabulary, and the corpus split into lines ("sentences") that remember their
// document (file), with a training / validation split.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace encoder {

// Byte-level vocabulary: ids 0-255 are the bytes, then four special tokens.
// model.vocab may be larger (a preset's size, for planning); it is padded like
// every vocabulary (smp::sdk::padded_vocab) and the ids past these never occur.
constexpr int64_t kPad = 256, kCls = 257, kSep = 258, kMask = 259, kByteVocab = 260;

struct Sentence {
  int64_t offset = 0, length = 0;  // bytes of the corpus, without the line break
  int64_t doc = 0;                 // the file it came from
};

class SentenceCorpus {
 public:
  // path: a file or folder (smp::sdk::read_text_files). Lines with only white
  // space are skipped. The last val_fraction of the sentences (by bytes) is the
  // validation split; each split needs at least two sentences.
  SentenceCorpus(const std::string& path, double val_fraction);

  const std::vector<Sentence>& sentences(bool validation) const { return validation ? val_ : train_; }
  const char* bytes(const Sentence& s) const { return text_.data() + s.offset; }
  int64_t bytes_in(bool validation) const;
  // Entropy (nats) of the training sentences' bytes: the masked-token loss of a
  // model that ignores the context.
  double unigram_entropy() const;

 private:
  std::string text_;
  std::vector<Sentence> train_, val_;
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
