// A SentencePiece model through libsmp_sentencepiece (sdk/sentencepiece/),
// loaded at run time with RTLD_LOCAL | RTLD_DEEPBIND so that SentencePiece's
// bundled protobuf never meets LibTorch's in one symbol scope: adapters that
// link LibTorch tokenize in process. The library is looked for at
// $SMP_SENTENCEPIECE_LIBRARY, then where the smp build or install put it
// (SMP_SDK_SENTENCEPIECE_LIBRARY, defined by the smp::sdk target).
#pragma once

#include <smp/sdk/host.hpp>
#include <smp/sdk/input_file.hpp>
#include <smp/data/tokenizer.hpp>

#include <dlfcn.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

namespace smp::sdk {

class SentencePieceTokenizer : public Tokenizer {
 public:
  // The model at `model`, read through smp::input (a regular file of at most
  // kMaxTokenizerBytes: SentencePiece's own reader would block on a named pipe).
  explicit SentencePieceTokenizer(const std::string& model) : SentencePieceTokenizer(model, read_model(model)) {}

  // The model from its bytes (`model` names it in messages).
  SentencePieceTokenizer(const std::string& model, const std::string& bytes) : path_(model) {
    lib_ = open_library();
    auto version = symbol<int (*)()>("smp_spm_abi_version");
    if (version() != 1) throw Error("libsmp_sentencepiece: interface version " + std::to_string(version()) + ", not 1");
    load_ = symbol<void* (*)(const char*, size_t, char*, size_t)>("smp_spm_load_proto");
    free_ = symbol<void (*)(void*)>("smp_spm_free");
    info_ = symbol<void (*)(void*, int64_t*)>("smp_spm_info");
    encode_ = symbol<Encode>("smp_spm_encode");
    decode_ = symbol<Decode>("smp_spm_decode");
    char err[512] = "";
    handle_ = load_(bytes.data(), bytes.size(), err, sizeof err);
    if (!handle_) throw Error("tokenizer " + model + ": not a SentencePiece model: " + err);
    info_(handle_, info_values_);
    if (eod() < 0)
      throw Error("tokenizer " + model + ": the model has no end-of-sentence piece to end documents with");
  }
  ~SentencePieceTokenizer() override {
    if (handle_) free_(handle_);
    // The library stays loaded: SentencePiece keeps static state that must not be unmapped.
  }
  SentencePieceTokenizer(const SentencePieceTokenizer&) = delete;
  SentencePieceTokenizer& operator=(const SentencePieceTokenizer&) = delete;

  std::vector<int64_t> encode(std::string_view text) const override {
    std::vector<int64_t> ids;
    char err[512] = "";
    auto sink = [](void* user, const int32_t* p, size_t n) {
      static_cast<std::vector<int64_t>*>(user)->assign(p, p + n);
    };
    if (encode_(handle_, text.data(), text.size(), sink, &ids, err, sizeof err) != 0)
      throw Error("tokenizer " + path_ + ": encode failed: " + err);
    return ids;
  }
  std::string decode(const std::vector<int64_t>& ids) const override {
    std::vector<int32_t> v;
    for (const int64_t id : ids) {
      if (id < 0 || id >= vocab())
        throw Error("tokenizer " + path_ + ": id " + std::to_string(id) + " is not in the vocabulary");
      v.push_back(static_cast<int32_t>(id));
    }
    std::string text;
    char err[512] = "";
    auto sink = [](void* user, const char* p, size_t n) { static_cast<std::string*>(user)->assign(p, n); };
    if (decode_(handle_, v.data(), v.size(), sink, &text, err, sizeof err) != 0)
      throw Error("tokenizer " + path_ + ": decode failed: " + err);
    return text;
  }
  int64_t vocab() const override { return info_values_[0]; }
  int64_t bos() const override { return info_values_[1]; }
  int64_t eod() const override { return info_values_[2]; }
  std::string name() const override { return "sentencepiece:" + path_; }

 private:
  using Encode = int (*)(void*, const char*, size_t, void (*)(void*, const int32_t*, size_t), void*, char*, size_t);
  using Decode = int (*)(void*, const int32_t*, size_t, void (*)(void*, const char*, size_t), void*, char*, size_t);

  static std::string read_model(const std::string& path) {
    try {
      return smp::input::read_file(path, "tokenizer " + path, smp::input::kMaxTokenizerBytes);
    } catch (const smp::input::Error& e) {
      throw Error(e.what());
    }
  }

  static void* open_library() {
    std::vector<std::string> tried;
    if (const char* env = std::getenv("SMP_SENTENCEPIECE_LIBRARY"); env && *env) tried.push_back(env);
#ifdef SMP_SDK_SENTENCEPIECE_LIBRARY
    tried.push_back(SMP_SDK_SENTENCEPIECE_LIBRARY);
#endif
    std::string why;
    for (const auto& path : tried) {
      if (void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND)) return h;
      why += (why.empty() ? "" : "; ") + std::string(dlerror());
    }
    if (tried.empty())
      throw Error("tokenizer sentencepiece: smp was built without SentencePiece (install libsentencepiece-dev and "
                  "rebuild), and SMP_SENTENCEPIECE_LIBRARY is not set");
    throw Error("tokenizer sentencepiece: cannot load libsmp_sentencepiece: " + why);
  }
  template <typename F>
  F symbol(const char* name) const {
    void* p = dlsym(lib_, name);
    if (!p) throw Error(std::string("libsmp_sentencepiece: no symbol ") + name);
    return reinterpret_cast<F>(p);
  }

  std::string path_;
  void* lib_ = nullptr;
  void* handle_ = nullptr;
  void* (*load_)(const char*, size_t, char*, size_t) = nullptr;
  void (*free_)(void*) = nullptr;
  void (*info_)(void*, int64_t*) = nullptr;
  Encode encode_ = nullptr;
  Decode decode_ = nullptr;
  int64_t info_values_[4] = {0, -1, -1, -1};
};

}  // namespace smp::sdk
