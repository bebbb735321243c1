// libsmp_sentencepiece: SentencePiece behind a small C interface, for
// smp/data/sentencepiece_tokenizer.hpp, which loads this library with
// RTLD_LOCAL | RTLD_DEEPBIND. Debian's libsentencepiece carries its own
// protobuf and exports it; loaded beside LibTorch's libprotobuf in one symbol
// scope, either one's calls can land in the other's (a crash at start). Bound
// deep, this library and libsentencepiece use their own copy.
#include <sentencepiece_processor.h>

#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <vector>

namespace {

void set_error(char* err, size_t cap, const std::string& what) {
  if (cap == 0) return;
  std::strncpy(err, what.c_str(), cap - 1);
  err[cap - 1] = '\0';
}

// SentencePiece reports most failures in a status, but some parts of it throw
// (darts_clone on a damaged model: "failed to insert key"). No exception may
// leave this C interface: it becomes the call's error, and what the call
// allocated is freed.
template <class F>
int guarded(char* err, size_t cap, F&& f) {
  try {
    return f();
  } catch (const std::exception& e) {
    set_error(err, cap, e.what());
  } catch (...) {
    set_error(err, cap, "unknown exception in SentencePiece");
  }
  return -1;
}

}  // namespace

extern "C" {

// The interface's version: the loader refuses a library of another.
__attribute__((visibility("default"))) int smp_spm_abi_version() { return 1; }

__attribute__((visibility("default"))) void* smp_spm_load(const char* path, char* err, size_t cap) {
  auto sp = std::make_unique<sentencepiece::SentencePieceProcessor>();
  const int rc = guarded(err, cap, [&] {
    const auto status = sp->Load(path);
    if (status.ok()) return 0;
    set_error(err, cap, status.ToString());
    return -1;
  });
  return rc == 0 ? sp.release() : nullptr;
}

// The same from a model's bytes (the caller read the file under its own
// bounds: SentencePiece's Load(path) would block forever on a named pipe).
__attribute__((visibility("default"))) void* smp_spm_load_proto(const char* data, size_t len, char* err, size_t cap) {
  auto sp = std::make_unique<sentencepiece::SentencePieceProcessor>();
  const int rc = guarded(err, cap, [&] {
    const auto status = sp->LoadFromSerializedProto(absl::string_view(data, len));
    if (status.ok()) return 0;
    set_error(err, cap, status.ToString());
    return -1;
  });
  return rc == 0 ? sp.release() : nullptr;
}

__attribute__((visibility("default"))) void smp_spm_free(void* h) {
  delete static_cast<sentencepiece::SentencePieceProcessor*>(h);
}

// vocab, bos, eos, unk (-1 where the model has none).
__attribute__((visibility("default"))) void smp_spm_info(void* h, int64_t* out) {
  const auto* sp = static_cast<const sentencepiece::SentencePieceProcessor*>(h);
  out[0] = sp->GetPieceSize();
  out[1] = sp->bos_id();
  out[2] = sp->eos_id();
  out[3] = sp->unk_id();
}

// Encodes text; `sink` gets the ids once. Returns 0, or -1 with `err` set.
__attribute__((visibility("default"))) int smp_spm_encode(void* h, const char* text, size_t len,
                                                          void (*sink)(void*, const int32_t*, size_t), void* user,
                                                          char* err, size_t cap) {
  return guarded(err, cap, [&] {
    std::vector<int> ids;
    const auto status = static_cast<const sentencepiece::SentencePieceProcessor*>(h)->Encode(
        absl::string_view(text, len), &ids);
    if (!status.ok()) {
      set_error(err, cap, status.ToString());
      return -1;
    }
    sink(user, reinterpret_cast<const int32_t*>(ids.data()), ids.size());
    return 0;
  });
}

__attribute__((visibility("default"))) int smp_spm_decode(void* h, const int32_t* ids, size_t n,
                                                          void (*sink)(void*, const char*, size_t), void* user,
                                                          char* err, size_t cap) {
  return guarded(err, cap, [&] {
    std::string text;
    const auto status = static_cast<const sentencepiece::SentencePieceProcessor*>(h)->Decode(
        std::vector<int>(ids, ids + n), &text);
    if (!status.ok()) {
      set_error(err, cap, status.ToString());
      return -1;
    }
    sink(user, text.data(), text.size());
    return 0;
  });
}

}  // extern "C"
