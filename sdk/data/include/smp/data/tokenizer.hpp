// Tokenizers behind one interface: text to ids and back, the vocabulary size
// and the special ids. Kinds (model.tokenizer, smp-data --tokenizer):
//   bytes          ids 0..255 are the bytes, 256 ends a document (the default)
//   sentencepiece  any SentencePiece .model (T5's, Llama 2's, one smp-data trained)
//   bpe            byte-level BPE: a Hugging Face tokenizer.json, or GPT-2's
//                  vocab.json + merges.txt
// open_tokenizer (smp/data/tokenizers.hpp) makes one from its kind and files.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace smp::sdk {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Thread-safe: smp-data encodes on several threads with one tokenizer.
  virtual std::vector<int64_t> encode(std::string_view text) const = 0;
  virtual std::string decode(const std::vector<int64_t>& ids) const = 0;
  virtual int64_t vocab() const = 0;  // ids are below it
  virtual int64_t eod() const = 0;    // ends each document
  virtual int64_t bos() const { return -1; }  // -1: none
  virtual std::string name() const = 0;       // "bytes", "sentencepiece:<file>", "bpe:<file>"
};

class ByteTokenizer : public Tokenizer {
 public:
  std::vector<int64_t> encode(std::string_view text) const override {
    std::vector<int64_t> ids(text.size());
    for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
    return ids;
  }
  std::string decode(const std::vector<int64_t>& ids) const override {
    std::string out;
    for (const int64_t id : ids)
      if (id >= 0 && id < 256) out += static_cast<char>(id);
    return out;
  }
  int64_t vocab() const override { return 257; }
  int64_t eod() const override { return 256; }
  std::string name() const override { return "bytes"; }
};

}  // namespace smp::sdk
