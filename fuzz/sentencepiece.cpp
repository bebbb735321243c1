// The SentencePiece model loader: a .model file through libsmp_sentencepiece
// (sdk/sentencepiece/smp_sentencepiece.cpp), as model.tokenizer =
// "sentencepiece" opens it, then encode and decode.
//
// The normal build (tests/fuzz) goes through SentencePieceTokenizer itself,
// which loads the library with RTLD_DEEPBIND. AddressSanitizer refuses
// RTLD_DEEPBIND, so the fuzzer build links the library's C functions in and
// calls them as the tokenizer does (no LibTorch in that program, hence no
// second protobuf to keep apart). SentencePiece's own parser is Debian's
// uninstrumented build: the fuzzer sees no coverage inside it and finds only
// what crashes or what the sanitizers' interceptors catch there.
#include "support/fuzz_target.h"

#ifdef SMP_FUZZ_LIBFUZZER

#include <cstdint>
#include <string>
#include <vector>

extern "C" {
void* smp_spm_load_proto(const char* data, size_t len, char* err, size_t cap);
void smp_spm_free(void* h);
void smp_spm_info(void* h, int64_t* out);
int smp_spm_encode(void* h, const char* text, size_t len, void (*sink)(void*, const int32_t*, size_t), void* user,
                   char* err, size_t cap);
int smp_spm_decode(void* h, const int32_t* ids, size_t n, void (*sink)(void*, const char*, size_t), void* user,
                   char* err, size_t cap);
}

namespace {

// The library's handle, freed on every path (the tokenizer's destructor does so).
struct Model {
  void* h = nullptr;
  ~Model() {
    if (h) smp_spm_free(h);
  }
};

}  // namespace

SMP_FUZZ_TARGET(sentencepiece) {
  // The model's bytes, as the tokenizer hands them over (it reads the file itself).
  char err[512] = "";
  Model m;
  m.h = smp_spm_load_proto(reinterpret_cast<const char*>(data), size, err, sizeof err);
  if (!m.h) return smp::fuzz::refused(err);  // the tokenizer throws "not a SentencePiece model: <why>"
  int64_t info[4] = {0, -1, -1, -1};
  smp_spm_info(m.h, info);
  if (info[2] < 0) return smp::fuzz::refused("no end-of-sentence piece");
  const std::string text = "Hello, world! It's 12345 caf\xc3\xa9 \xe6\x97\xa5\xe6\x9c\xac \xff\xfe end\n";
  std::vector<int32_t> ids;
  auto id_sink = [](void* user, const int32_t* p, size_t n) { static_cast<std::vector<int32_t>*>(user)->assign(p, p + n); };
  if (smp_spm_encode(m.h, text.data(), text.size(), id_sink, &ids, err, sizeof err) != 0) return smp::fuzz::refused(err);
  for (const int32_t id : ids)
    if (id < 0 || id >= info[0])
      smp::fuzz::finding("encode gave id " + std::to_string(id) + ", outside the vocabulary of " + std::to_string(info[0]));
  std::string back;
  auto text_sink = [](void* user, const char* p, size_t n) { static_cast<std::string*>(user)->assign(p, n); };
  smp_spm_decode(m.h, ids.data(), ids.size(), text_sink, &back, err, sizeof err);
}

#elif defined(__SANITIZE_ADDRESS__)

// The suite under AddressSanitizer (scripts/sanitize.sh): the tokenizer's
// RTLD_DEEPBIND load would stop the process, so this replay checks nothing
// there; the fuzzer build above covers the library under the sanitizers.
SMP_FUZZ_TARGET(sentencepiece) {
  (void)data;
  (void)size;
}

#else

#include "support/tokenizer_text.h"

#include <smp/data/tokenizers.hpp>

SMP_FUZZ_TARGET(sentencepiece) {
  const std::string path = smp::fuzz::work_dir() + "/tokenizer.model";
  smp::fuzz::write_file(path, std::string_view(reinterpret_cast<const char*>(data), size));
  const auto tok = smp::sdk::open_tokenizer("sentencepiece", path, "", "model.tokenizer");
  smp::fuzz::exercise_tokenizer(*tok);
}

#endif
